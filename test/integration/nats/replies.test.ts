// Replies (lib/nats/replies.ts), the hot path's request-reply, against a real nats-server: answers,
// no responders, timeouts and a closing connection each end a request as nats.js's request() does.
import assert from "node:assert/strict";
import { test } from "node:test";
import { RequestError, TimeoutError } from "@nats-io/transport-node";
import { Replies } from "../../../src/lib/nats/index.js";
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
