import assert from "node:assert/strict";
import { test } from "node:test";
import { jetstreamManager } from "@nats-io/jetstream";
import { randomUUID } from "node:crypto";
import { startNats } from "../../test/testkit/index.js";
import { silentLogger } from "../lib/log.js";
import { DEFAULT_QUEUE_LIMITS, connectNats, subjects } from "../lib/queue.js";
import { WorkPublisher } from "./work-queue.js";

test("publish makes the stream, a repeated id is no error, a full queue is QUEUE_FULL, cancel purges", async (t) => {
  const nats = await startNats(t);
  const nc = await connectNats(nats.url, "work-queue-test", silentLogger());
  t.after(() => nc.close());
  const fvid = randomUUID();
  const pub = new WorkPublisher(nc, "test", { ...DEFAULT_QUEUE_LIMITS, maxMessages: 2 }, silentLogger());
  const cancels: string[] = [];
  nc.subscribe(subjects.cancel(fvid), { callback: (_e, m) => void cancels.push(m.string()) });
  const a = randomUUID();
  await pub.publish(fvid, a, new Uint8Array([1]));
  await pub.publish(fvid, a, new Uint8Array([1]));
  await pub.publish(fvid, randomUUID(), new Uint8Array([2]));
  await assert.rejects(pub.publish(fvid, randomUUID(), new Uint8Array([3])), { code: "QUEUE_FULL" });
  const jsm = await jetstreamManager(nc);
  assert.equal((await jsm.streams.info(subjects.stream("test", fvid))).state.messages, 2);
  pub.cancel(fvid, a, "test");
  await nc.flush();
  for (
    let i = 0;
    i < 100 && (await jsm.streams.info(subjects.stream("test", fvid))).state.messages !== 1;
    i++
  )
    await new Promise((r) => setTimeout(r, 20));
  assert.equal((await jsm.streams.info(subjects.stream("test", fvid))).state.messages, 1);
  assert.deepEqual(cancels, [a]);
});
