import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Gauge, createRegistry } from "../lib/metrics.js";
import { PendingTable } from "./pending.js";

async function gaugeValue(g: Gauge): Promise<number> {
  return (await g.get()).values[0]?.value ?? 0;
}

test("a held item times out once, counted in the gauge until released", async () => {
  const gauge = new Gauge({
    name: "t_in_flight",
    help: "t",
    registers: [createRegistry("t", { defaultMetrics: false })],
  });
  const table = new PendingTable<{ id: number }>(gauge);
  const a = { id: 1 };
  const timedOut: number[] = [];
  table.add(a, 20, (x) => timedOut.push(x.id));
  assert.equal(await gaugeValue(gauge), 1);
  await sleep(60);
  assert.deepEqual(timedOut, [1]);
  assert.ok(table.has(a), "a timed-out item stays held until released");
  assert.equal(table.release(a), true);
  assert.equal(table.release(a), false, "released once");
  assert.equal(await gaugeValue(gauge), 0);
});

test("a stopped window never fires; release cancels it too", async () => {
  const table = new PendingTable<{ id: number }>();
  const fired: number[] = [];
  const a = { id: 1 };
  const b = { id: 2 };
  table.add(a, 20, () => fired.push(1));
  table.add(b, 20, () => fired.push(2));
  table.stopWindow(a);
  table.release(b);
  await sleep(60);
  assert.deepEqual(fired, []);
  assert.deepEqual(table.values(), [a]);
});
