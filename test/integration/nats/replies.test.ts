// Replies (lib/nats/replies.ts), the hot path's request-reply, and publishToStream on it, against a
// real nats-server: answers, no responders, timeouts and a closing connection each end a request as
// nats.js's request() does, and a publish's failures read as js.publish()'s.
import assert from "node:assert/strict";
import { test } from "node:test";
import { RequestError, TimeoutError } from "@nats-io/transport-node";
import { DiscardPolicy, RetentionPolicy, StorageType, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Replies, classifyPublishError, publishToStream } from "../../../src/lib/nats/index.js";
import { startNats } from "../../testkit/nats.js";

test("Replies: answers, no responders, timeouts and a closed connection", async (t) => {
  const nats = await startNats(t);
  // (a test's own connections: the services' grants do not let them answer requests on inboxes)
  const server = await nats.observe("replies-server");
  const nc = await nats.observe("replies-client");
  const access = { inboxPrefix: "_INBOX_replies" };
  t.after(async () => {
    await server.close();
    await nc.close().catch(() => undefined);
  });
  const subject = `${access.inboxPrefix}.svc`;
  server.subscribe(subject, { callback: (_e, m) => void m.respond(`re:${m.string()}`) });
  await server.flush();
  const replies = new Replies(nc, access.inboxPrefix);

  // many at once, each answered with its own reply
  const answers = await Promise.all(
    Array.from({ length: 200 }, (_, i) => replies.request(subject, String(i), 2000)),
  );
  assert.deepEqual(
    answers.map((m) => m.string()),
    Array.from({ length: 200 }, (_, i) => `re:${i}`),
  );
  assert.equal(replies.size, 0);

  // no one listens: the server's 503 ends the request at once
  const none = await replies.request(`${access.inboxPrefix}.nobody`, "x", 2000).catch((e: unknown) => e);
  assert.ok(none instanceof RequestError && none.isNoResponders(), String(none));

  // an answer that never comes
  server.subscribe(`${access.inboxPrefix}.silent`, { callback: () => undefined });
  await server.flush();
  const started = Date.now();
  const late = await replies.request(`${access.inboxPrefix}.silent`, "x", 300).catch((e: unknown) => e);
  assert.ok(late instanceof TimeoutError, String(late));
  assert.ok(Date.now() - started < 2000);
  assert.equal(replies.size, 0);

  // the connection closes with a request waiting: it fails at once, not at its timeout
  const waiting = replies.request(`${access.inboxPrefix}.silent`, "x", 60_000).catch((e: unknown) => e);
  await nc.close();
  assert.ok((await waiting) instanceof RequestError);
});

test("publishToStream: stored, duplicate, full and no stream read as js.publish's do", async (t) => {
  const nats = await startNats(t);
  const nc = await nats.observe("stream-publish");
  t.after(() => nc.close());
  const jsm = await jetstreamManager(nc);
  await jsm.streams.add({
    name: "replies_test",
    subjects: ["rt.>"],
    retention: RetentionPolicy.Workqueue,
    storage: StorageType.Memory,
    max_msgs: 2,
    max_msgs_per_subject: 1,
    discard: DiscardPolicy.New,
    discard_new_per_subject: true,
  });
  const replies = new Replies(nc, "_INBOX_stream_publish");
  const js = jetstream(nc);
  const data = new TextEncoder().encode("work");

  const first = await publishToStream(replies, "rt.a", data);
  assert.deepEqual(first, { stream: "replies_test", seq: 1, duplicate: false });
  // both ways of publishing fail alike, and classify alike
  const outcome = async (subject: string) => {
    const mine = await publishToStream(replies, subject, data).then(
      () => "stored",
      (e: unknown) => classifyPublishError(e),
    );
    const theirs = await js.publish(subject, data).then(
      () => "stored",
      (e: unknown) => classifyPublishError(e),
    );
    return [mine, theirs];
  };
  assert.deepEqual(await outcome("rt.a"), ["duplicate", "duplicate"]);
  assert.deepEqual((await publishToStream(replies, "rt.b", data)).seq, 2);
  assert.deepEqual(await outcome("rt.c"), ["full", "full"]);
  assert.deepEqual(await outcome("nostream.x"), ["no-stream", "no-stream"]);
});
