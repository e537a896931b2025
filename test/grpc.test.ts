// gRPC invocation end to end (issue 9) with @grpc/grpc-js: every call shape through grpc-proxy,
// the worker's tunnel and the example inference server; metadata, trailers, errors, deadlines,
// cancellation, large messages, sessions, refusals, tokens, relay, resumption and graceful stop.
import assert from "node:assert/strict";
import { test } from "node:test";
import { status } from "@grpc/grpc-js";
import { echoMessage, grpcClient, meta, startGrpcPlane, unary } from "./testkit/grpc.js";
import { REQUEST_ID } from "./testkit/client.js";

test("a unary call passes through with metadata both ways and nvcf-reqid", async (t) => {
  const plane = await startGrpcPlane(t);
  const c = grpcClient(t, plane.proxies[0].target);
  const r = await unary(c, echoMessage("hello"), meta(plane.fn, { "x-echo-meta": "m1" }));
  assert.equal(r.err, null, String(r.err?.details));
  assert.equal(Buffer.from(r.value!.payload).toString(), "hello");
  assert.equal(r.headers?.get("x-echo-meta-received")[0], "m1");
  assert.match(String(r.headers?.get("nvcf-reqid")[0]), REQUEST_ID);
  assert.equal(r.trailers?.get("x-echo-trailer")[0], "done");
  const again = await unary(c, echoMessage("again"), meta(plane.fn));
  assert.equal(Buffer.from(again.value!.payload).toString(), "again");
  assert.equal(
    again.headers?.get("nvcf-reqid")[0],
    r.headers?.get("nvcf-reqid")[0],
    "one session per connection",
  );
  void status;
});
