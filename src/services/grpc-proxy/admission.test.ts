// What a gRPC call must be before it costs anything: host, method path, one authorization,
// grpc-timeout; and only gRPC versions (inferenceUrl /grpc) of a function are candidates.
import assert from "node:assert/strict";
import { test } from "node:test";
import { CallplaneError, type ErrorCode } from "../../lib/errors.js";
import type { Grant } from "../../plane/auth-cache.js";
import { admitCall, grpcGrant } from "./admission.js";

const PATH = "/callplane.examples.Echo/Unary";

function code(f: () => unknown): ErrorCode | undefined {
  try {
    f();
    return undefined;
  } catch (err) {
    assert.ok(err instanceof CallplaneError, String(err));
    return err.code;
  }
}

const call = (h: Record<string, string>, raw: string[] = ["authorization", "Bearer k"]) =>
  admitCall({ ":authority": "127.0.0.1:10081", ":path": PATH, ...h }, raw, ["grpc.example.com"]);

test("the host it serves: IP literals, localhost, global.hosts; any other :authority or host is refused", () => {
  assert.equal(
    code(() => call({})),
    undefined,
  );
  assert.equal(
    code(() => call({ ":authority": "localhost:10081" })),
    undefined,
  );
  assert.equal(
    code(() => call({ ":authority": "grpc.example.com" })),
    undefined,
  );
  assert.equal(
    code(() => call({ ":authority": "rebind.attacker.example" })),
    "HOST_NOT_SERVED",
  );
  assert.equal(
    code(() => call({ host: "rebind.attacker.example" })),
    "HOST_NOT_SERVED",
  );
  assert.equal(
    code(() => admitCall({ ":path": PATH }, [], [])),
    "HOST_NOT_SERVED",
    "no :authority and no host",
  );
});

test("the path is a gRPC method; checked before the key", () => {
  for (const p of ["/../../etc/passwd", "/a", "/a/b/c", "/%2e%2e/b", "//b", "/a/b?x", "/metrics", "/health"])
    assert.equal(
      code(() => call({ ":path": p }, [])),
      "GRPC_PATH_INVALID",
      p,
    );
  assert.equal(
    code(() => call({ ":path": "/grpc.health.v1.Health/Check" })),
    undefined,
  );
});

test("one authorization value; a well-formed grpc-timeout, clamped", () => {
  assert.equal(
    code(() => call({}, ["authorization", "Bearer a", "Authorization", "Bearer b"])),
    "UNAUTHENTICATED",
  );
  assert.equal(
    code(() => call({ "grpc-timeout": "10 S" })),
    "BAD_REQUEST",
  );
  assert.deepEqual(call({ "grpc-timeout": "2147484S" }), { deadlineMs: 2 ** 31 - 1 });
  assert.deepEqual(call({}), { deadlineMs: undefined });
});

const grant = (paths: string[]): Grant => ({
  functionId: "f",
  functionName: "n",
  ncaId: "a",
  clientNcaId: "a",
  subject: "s",
  keyId: "k",
  keyExpiresAt: new Date(Date.now() + 60_000).toISOString(),
  functionVersions: paths.map((p, i) => ({
    functionVersionId: `v${i}`,
    defaultInvocationPath: p,
    functionType: "DEFAULT",
  })),
});

test("only gRPC versions are candidates; a function (or pinned version) without one is FUNCTION_NOT_GRPC", () => {
  assert.equal(
    code(() => grpcGrant(grant(["/echo"]), undefined)),
    "FUNCTION_NOT_GRPC",
  );
  assert.equal(
    code(() => grpcGrant(grant(["/grpc/x", "/"]), "v0")),
    "FUNCTION_NOT_GRPC",
  );
  const mixed = grpcGrant(grant(["/echo", "/grpc", "/sse"]), undefined);
  assert.deepEqual(
    mixed.functionVersions.map((v) => v.functionVersionId),
    ["v1"],
  );
  const all = grant(["/grpc"]);
  assert.equal(grpcGrant(all, undefined), all);
});
