// The compute agent's instance table: what each status report holds while an instance drains.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { ComputeInstance } from "../../src/services/compute/backend.js";
import { InstanceTable } from "../../src/services/compute/instance-table.js";

function instance(id: string, stop: Promise<void>): ComputeInstance {
  return { instanceId: id, stop: () => stop } as unknown as ComputeInstance;
}

void test("an instance that is stopping stays in every report until it is gone, then is reported once more (TERMINATED)", async () => {
  const table = new InstanceTable<ComputeInstance>();
  let finish!: () => void;
  const draining = instance("i1", new Promise<void>((r) => (finish = r)));
  table.listOf("d1").push(draining, instance("i2", Promise.resolve()));
  const [, list] = table.removeUnwanted(new Set())[0];
  const stops = list.map((i) => table.stop(i));
  await stops[1];
  // i2 stopped: reported once; i1 still draining: reported (a report without it revokes its identity)
  assert.deepEqual(
    table
      .takeSnapshot()
      .map((i) => i.instanceId)
      .sort(),
    ["i1", "i2"],
  );
  assert.deepEqual(
    table.takeSnapshot().map((i) => i.instanceId),
    ["i1"],
  );
  finish();
  await stops[0];
  assert.deepEqual(
    table.takeSnapshot().map((i) => i.instanceId),
    ["i1"],
  );
  assert.deepEqual(table.takeSnapshot(), []);
});
