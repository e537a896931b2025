import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import { jetstreamManager } from "@nats-io/jetstream";
import { randomUUID } from "node:crypto";
import { startNats } from "../../test/testkit/index.js";
import { silentLogger } from "../lib/log.js";
import { DEFAULT_QUEUE_LIMITS, Replies, WorkQueues, connectNats, subjects } from "../lib/nats/index.js";
import { WorkPublisher } from "./work-queue.js";

const TITLE =
  "a missing queue is asked of the control plane once, a repeated id is no error, a full queue is QUEUE_FULL, cancel removes the message (by sequence, or by a purge when none is known)";

// the same with each way of publishing: jetstream(nc).publish(), and the reply inbox the replicas use
test(`${TITLE} (jetstream publish)`, (t) => publishing(t, false));
test(`${TITLE} (through the reply inbox)`, (t) => publishing(t, true));

async function publishing(t: TestContext, throughReplies: boolean): Promise<void> {
  const nats = await startNats(t, { region: "test" });
  // a replica's own connection (it may publish, not create streams); the control plane's stand-in
  // creates the queue when asked, on a connection of the test's
  const nc = await connectNats(nats.access("invocation"), "work-queue-test", silentLogger());
  t.after(() => nc.close());
  const admin = await nats.observe();
  t.after(() => admin.close());
  const limits = { ...DEFAULT_QUEUE_LIMITS, maxMessages: 2 };
  const queues = new WorkQueues(admin, "test", limits);
  const asked: string[] = [];
  const fvid = randomUUID();
  const access = nats.access("invocation");
  const pub = new WorkPublisher(
    nc,
    "test",
    limits,
    silentLogger(),
    async (v) => {
      asked.push(v);
      await queues.ensure(v);
    },
    throughReplies ? new Replies(nc, access.inboxPrefix) : undefined,
  );
  const cancels: string[] = [];
  admin.subscribe(subjects.cancel(fvid), { callback: (_e, m) => void cancels.push(m.string()) });
  const a = randomUUID();
  const b = randomUUID();
  const seqA = await pub.publish(fvid, a, new Uint8Array([1]));
  assert.equal(typeof seqA, "number", "a confirmed publish says its sequence");
  assert.deepEqual(asked, [fvid], "the missing queue was asked for once");
  assert.equal(
    await pub.publish(fvid, a, new Uint8Array([1])),
    undefined,
    "a repeat has no sequence of its own",
  );
  await pub.publish(fvid, b, new Uint8Array([2]));
  await assert.rejects(pub.publish(fvid, randomUUID(), new Uint8Array([3])), { code: "QUEUE_FULL" });
  assert.deepEqual(asked, [fvid]);
  const jsm = await jetstreamManager(admin);
  assert.equal((await jsm.streams.info(subjects.stream("test", fvid))).state.messages, 2);
  const left = async (n: number) => {
    await nc.flush();
    for (
      let i = 0;
      i < 100 && (await jsm.streams.info(subjects.stream("test", fvid))).state.messages !== n;
      i++
    )
      await new Promise((r) => setTimeout(r, 20));
    return (await jsm.streams.info(subjects.stream("test", fvid))).state.messages;
  };
  pub.cancel(fvid, a, "test", seqA);
  assert.equal(await left(1), 1, "deleted by its sequence");
  assert.equal(await jsm.streams.getMessage(subjects.stream("test", fvid), { seq: seqA! }), null);
  pub.cancel(fvid, b, "test");
  assert.equal(await left(0), 0, "purged by its subject");
  assert.deepEqual(cancels, [a, b]);
}
