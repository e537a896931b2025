// gRPC invocation with a client we did not write: Python's grpcio (Debian's python3-grpcio, run
// with /usr/bin/python3), through grpc-proxy, the worker's tunnel and the example inference server:
// every call shape, 20 MiB messages, errors with code, message and trailing metadata, a deadline,
// a cancel that reaches the inference server, the refusals, and a resumed session.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { test } from "node:test";
import { REQUEST_ID, waitFor } from "../../testkit/client.js";
import { runPython, startGrpcPlane } from "../../testkit/grpc.js";

interface Failure {
  code: string;
  details: string;
  trailers: Record<string, string>;
}

test(
  "Python grpcio: every call shape, large messages, errors, deadline, cancel, refusals, resumption",
  { timeout: 180_000 },
  async (t) => {
    assert.ok(
      existsSync("/usr/bin/python3"),
      "/usr/bin/python3 is missing (scripts/ensure-python-grpcio.sh installs python3-grpcio)",
    );
    const plane = await startGrpcPlane(t);
    const before = plane.example.stats.cancelled;
    const r = await runPython([plane.proxies[0].target, plane.fn.apiKey, plane.fn.functionId]);
    assert.equal(r.code, 0, r.stderr);
    const out = r.out as {
      unary: { payload: string; metaReceived: string[]; reqid: string[]; trailer: string[] };
      serverStream: string[];
      clientStream: string;
      bidi: string[];
      large: { sent: string; got: string; bytes: number };
      error: Failure;
      deadline: Failure;
      cancel: { first: string; code: string };
      refusals: Record<string, Failure>;
      resumed: { payload: string; reqid: string[] };
    };
    assert.equal(out.unary.payload, "py-unary");
    assert.deepEqual(out.unary.metaReceived, ["from-python"]);
    assert.match(out.unary.reqid[0], REQUEST_ID);
    assert.deepEqual(out.unary.trailer, ["done"]);
    assert.deepEqual(out.serverStream, ["s", "s", "s", "s"]);
    assert.equal(out.clientStream, "abc");
    assert.deepEqual(out.bidi, ["x", "y", "z"]);
    assert.equal(out.large.bytes, 20 * 1024 * 1024);
    assert.equal(out.large.got, out.large.sent);
    assert.equal(out.error.code, "NOT_FOUND");
    assert.equal(out.error.details, "x-echo-status asked for 5");
    assert.equal(out.error.trailers["x-echo-error"], "yes");
    assert.equal(out.deadline.code, "DEADLINE_EXCEEDED");
    assert.deepEqual(out.cancel, { first: "tick", code: "CANCELLED" });
    await waitFor(
      "the inference server to see Python's cancel",
      () => plane.example.stats.cancelled > before,
      { timeoutMs: 10_000 },
    );
    assert.equal(out.refusals.noFunctionId.code, "INVALID_ARGUMENT");
    assert.match(out.refusals.noFunctionId.details, /function-id/);
    assert.equal(out.refusals.noKey.code, "UNAUTHENTICATED");
    assert.equal(out.refusals.badKey.code, "UNAUTHENTICATED");
    assert.equal(out.refusals.unknownFunction.code, "NOT_FOUND");
    assert.equal(out.resumed.payload, "again");
    assert.deepEqual(
      out.resumed.reqid,
      out.unary.reqid,
      "a new connection with nvcf-reqid joined the same session",
    );
  },
);
