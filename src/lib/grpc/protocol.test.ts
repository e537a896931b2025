// The gRPC request grammar grpc-proxy enforces (PROTOCOL-HTTP2.md): method paths and grpc-timeout.
import assert from "node:assert/strict";
import { test } from "node:test";
import { MAX_TIMER_MS, formatGrpcTimeout, grpcTimeoutMs, isGrpcMethodPath } from "./protocol.js";

test("method paths: /<package.Service>/<Method> only", () => {
  for (const ok of [
    "/callplane.examples.Echo/Unary",
    "/grpc.health.v1.Health/Check",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/helloworld.Greeter/SayHello",
    "/Greeter/SayHello",
    "/_a._b/_c",
  ])
    assert.ok(isGrpcMethodPath(ok), ok);
  for (const bad of [
    undefined,
    "",
    "/",
    "/a",
    "/a/",
    "//b",
    "/a/b/c",
    "/../../etc/passwd",
    "/a/..",
    "/a..b/c",
    "/.a/b",
    "/a./b",
    "/a/b.c",
    "/1a/b",
    "/a/1b",
    "/a%2Fb/c",
    "/%2e%2e/b",
    "/a/b?x=1",
    "/a/b#f",
    "/a/b/",
    "a/b",
    "/a b/c",
    "/a-b/c",
    "/a/b\n",
    "/a\u0130/b",
    `/${"a".repeat(1100)}/b`,
  ])
    assert.equal(isGrpcMethodPath(bad), false, JSON.stringify(bad));
});

test("grpc-timeout: 1 to 8 digits and a unit, clamped to what a timer holds; malformed is null", () => {
  assert.equal(grpcTimeoutMs(undefined), undefined);
  assert.equal(grpcTimeoutMs("150m"), 150);
  assert.equal(grpcTimeoutMs("10S"), 10_000);
  assert.equal(grpcTimeoutMs("2M"), 120_000);
  assert.equal(grpcTimeoutMs("1H"), 3_600_000);
  assert.equal(grpcTimeoutMs("5000u"), 5);
  assert.equal(grpcTimeoutMs("2147483S"), 2_147_483_000);
  assert.equal(
    grpcTimeoutMs("2147484S"),
    MAX_TIMER_MS,
    "24.8 days and more: the longest timer, not an overflow",
  );
  assert.equal(grpcTimeoutMs("99999999H"), MAX_TIMER_MS);
  assert.equal(MAX_TIMER_MS, 2 ** 31 - 1);
  for (const bad of ["", "S", "10", "10s", "10 S", "-1S", "1.5S", "123456789S", "1S, 2S", "0x10S", "１S"])
    assert.equal(grpcTimeoutMs(bad), null, JSON.stringify(bad));
  assert.equal(grpcTimeoutMs(["1S", "2S"]), null);
});

test("a deadline passed on: milliseconds while they fit, else seconds a 32-bit timer holds", () => {
  assert.equal(formatGrpcTimeout(150), "150m");
  assert.equal(formatGrpcTimeout(0.2), "1m");
  assert.equal(formatGrpcTimeout(-5), "1m");
  assert.equal(formatGrpcTimeout(99_999_999), "99999999m");
  assert.equal(formatGrpcTimeout(MAX_TIMER_MS), "2147483S");
  assert.ok(2_147_483 * 1000 <= MAX_TIMER_MS);
  for (const ms of [1, 1234, 99_999_999, 100_000_000, MAX_TIMER_MS])
    assert.ok(grpcTimeoutMs(formatGrpcTimeout(ms))! <= Math.max(ms, 1), String(ms));
});
