// CreditPull (lib/nats/credit-pull.ts), the worker's standing pull, against a real nats-server:
// never more messages taken than the credit given, more as credit comes back, pulls that expire
// or that the server lost (a restart) asked for again, and nothing taken after stop().
import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { AckPolicy, RetentionPolicy, StorageType, jetstreamManager } from "@nats-io/jetstream";
import { headers, type NatsConnection } from "@nats-io/transport-node";
import { CreditPull, type PulledMessage } from "../../../src/lib/nats/index.js";
import { createLogger } from "../../../src/lib/log.js";
import { startNats } from "../../testkit/nats.js";
import { waitFor } from "../../testkit/client.js";

const ACK = new TextEncoder().encode("+ACK");

async function queue(nc: NatsConnection, name: string): Promise<void> {
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({
    name,
    subjects: [`${name}.>`],
    retention: RetentionPolicy.Workqueue,
    storage: StorageType.File,
  });
  await jsm.consumers.add(name, { durable_name: "w", ack_policy: AckPolicy.Explicit, ack_wait: 30e9 });
}

async function publish(nc: NatsConnection, name: string, n: number, from = 0): Promise<void> {
  const jsm = await jetstreamManager(nc);
  const js = jsm.jetstream();
  for (let i = from; i < from + n; i++) await js.publish(`${name}.m`, String(i));
}

test("CreditPull takes no more than its credit, and more as credit comes back", async (t) => {
  const nats = await startNats(t);
  const nc = await nats.observe("credit-pull");
  t.after(() => nc.close());
  await queue(nc, "cp1");
  await publish(nc, "cp1", 10);
  const got: PulledMessage[] = [];
  const pull = new CreditPull(nc, {
    stream: "cp1",
    consumer: "w",
    inboxPrefix: "_INBOX_cp1",
    logger: createLogger("test", { level: "warn" }),
    onMessage: (m) => got.push(m),
  });
  t.after(() => pull.stop());
  pull.credit(3);
  await waitFor("three messages", () => Promise.resolve(got.length >= 3 ? true : undefined));
  // the other seven stay in the stream while no credit is given
  await nc.flush();
  await sleep(300);
  assert.equal(got.length, 3);
  // two slots free again (the three are done): two more, not seven
  for (const m of got) nc.publish(m.reply, ACK);
  pull.credit(2);
  await waitFor("five messages", () => Promise.resolve(got.length >= 5 ? true : undefined));
  await sleep(300);
  assert.equal(got.length, 5);
  assert.deepEqual(
    got.map((m) => new TextDecoder().decode(m.data)),
    ["0", "1", "2", "3", "4"],
  );
  // a credit raised by several slots at once: one pull takes the rest
  pull.credit(8);
  await waitFor("all ten", () => Promise.resolve(got.length >= 10 ? true : undefined));
  // messages published later reach the pull still waiting for them
  await publish(nc, "cp1", 2, 10);
  await waitFor("the late two", () => Promise.resolve(got.length >= 12 ? true : undefined));
  await sleep(300);
  assert.equal(got.length, 12);
});

test("CreditPull asks again when pulls expire, after a server restart, and never after stop()", async (t) => {
  const nats = await startNats(t);
  const nc = await nats.observe("credit-pull-restart");
  t.after(() => nc.close());
  await queue(nc, "cp2");
  const got: string[] = [];
  const pull = new CreditPull(nc, {
    stream: "cp2",
    consumer: "w",
    inboxPrefix: "_INBOX_cp2",
    logger: createLogger("test", { level: "warn" }),
    // pulls end at the server after 500 ms: each is answered 408 and asked for again
    expiresMs: 500,
    onMessage: (m) => {
      got.push(new TextDecoder().decode(m.data));
      nc.publish(m.reply, ACK);
    },
  });
  pull.credit(4);
  await sleep(1600);
  await publish(nc, "cp2", 2);
  await waitFor("two messages after pulls expired", () =>
    Promise.resolve(got.length >= 2 ? true : undefined),
  );
  pull.credit(4);

  // the server restarts: the pulls it held are gone, and the client reconnects
  await nats.stopServer();
  await nats.startServer();
  await waitFor("the connection back", async () => {
    try {
      await nc.flush();
      return true;
    } catch {
      return undefined;
    }
  });
  await publish(nc, "cp2", 2, 2);
  await waitFor("two more after the restart", () => Promise.resolve(got.length >= 4 ? true : undefined));
  assert.deepEqual(got, ["0", "1", "2", "3"]);

  pull.stop();
  await publish(nc, "cp2", 1, 4);
  await sleep(700);
  assert.equal(got.length, 4, "nothing is taken after stop()");
});

test("CreditPull asks again, long before its expiry, for a pull whose heartbeats stopped (a consumer leader lost without a word)", async (t) => {
  const nats = await startNats(t);
  const nc = await nats.observe("credit-pull-silent");
  t.after(() => nc.close());
  // A stand-in for the consumer's leader (this server holds no stream "ghost"): it keeps the
  // pulls it is sent, says the first is alive for a while, then goes silent as a killed node does.
  const pulls: Array<{ reply: string; body: { batch: number; expires: number; idle_heartbeat: number } }> =
    [];
  const leader = nc.subscribe("$JS.API.CONSUMER.MSG.NEXT.ghost.w", {
    callback: (_err, m) => {
      if (m.reply) pulls.push({ reply: m.reply, body: m.json() });
    },
  });
  t.after(() => leader.unsubscribe());
  await nc.flush();
  const got: string[] = [];
  const pull = new CreditPull(nc, {
    stream: "ghost",
    consumer: "w",
    inboxPrefix: "_INBOX_cp3",
    logger: createLogger("test", { level: "warn" }),
    expiresMs: 120_000,
    heartbeatMs: 200,
    onMessage: (m) => got.push(new TextDecoder().decode(m.data)),
  });
  t.after(() => pull.stop());
  pull.credit(3);
  await waitFor("the first pull", () => Promise.resolve(pulls.length >= 1 ? true : undefined));
  assert.deepEqual(pulls[0].body, { batch: 3, expires: 120_000 * 1e6, idle_heartbeat: 200 * 1e6 });
  // heartbeats for 2 s: ten silences' worth of time, and the pull is kept
  for (let i = 0; i < 20; i++) {
    nc.publish(pulls[0].reply, new Uint8Array(0), { headers: headers(100, "Idle Heartbeat") });
    await sleep(100);
  }
  await nc.flush();
  assert.equal(pulls.length, 1, "a pull that says it is alive is not asked for again");
  // silence: asked for again within seconds, not after its two minutes
  await waitFor(
    "the pull asked for again",
    () => Promise.resolve(pulls.length >= 2 ? true : undefined),
    20_000,
  );
  assert.equal(pulls[1].body.batch, 3, "the whole credit is asked for again");
  assert.notEqual(pulls[1].reply, pulls[0].reply);
  // the new pull is served: a message on it is taken
  nc.publish(pulls[1].reply, "m1", { reply: "ghost.ack.1" });
  await waitFor("the message", () => Promise.resolve(got.length >= 1 ? true : undefined));
  assert.deepEqual(got, ["m1"]);
});
