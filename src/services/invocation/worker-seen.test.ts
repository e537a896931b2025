import assert from "node:assert/strict";
import { test } from "node:test";
import { INBOX } from "../../lib/nats/index.js";
import { describeWorker, heldState } from "./worker-seen.js";

test("the worker is named by its NATS inbox, else by its callback's header; its address by the proxy, else the connection", () => {
  assert.equal(describeWorker(undefined), undefined);
  assert.equal(describeWorker({}), undefined, "a contact that said nothing names no worker");
  // an answer over NATS: the reply subject is <worker inbox prefix>.<instance>.<inbox>.<n>
  assert.deepEqual(describeWorker({ inbox: `${INBOX.tokenWorker("pod-7")}.AbC123.4` }), {
    instanceId: "pod-7",
  });
  assert.deepEqual(describeWorker({ inbox: `${INBOX.nkeyWorker("a.b")}.AbC123.4` }), { instanceId: "a.b" });
  assert.equal(describeWorker({ inbox: "_INBOX.AbC123.4" }), undefined, "not a worker's inbox");
  // an HTTP callback: the header, the callback proxy's X-Forwarded-For over the connection's address
  assert.deepEqual(
    describeWorker({ named: "i-1", forwardedFor: "10.0.0.7, 10.0.0.1", remote: "::ffff:10.0.0.1" }),
    { instanceId: "i-1", address: "10.0.0.7" },
  );
  assert.deepEqual(describeWorker({ remote: "::ffff:127.0.0.1" }), { address: "127.0.0.1" });
  // a name that could not be an instance id is not shown
  assert.deepEqual(describeWorker({ named: "<script>", remote: "127.0.0.1" }), { address: "127.0.0.1" });
  assert.deepEqual(describeWorker({ named: "x".repeat(200), remote: "127.0.0.1" }), { address: "127.0.0.1" });
});

test("a request is queued until a worker contacts it, with that worker until its answer begins", () => {
  assert.equal(heldState({ state: "queued" }), "queued");
  assert.equal(heldState({ state: "queued", worker: { remote: "127.0.0.1" } }), "with-worker");
  assert.equal(heldState({ state: "responding", worker: { remote: "127.0.0.1" } }), "responding");
});
