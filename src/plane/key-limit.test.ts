import assert from "node:assert/strict";
import { test } from "node:test";
import { CallplaneError } from "../lib/errors.js";
import { KeyInFlight } from "./key-limit.js";

test("a key gets at most max slots; a slot released (once, however often called) lets the next in", () => {
  const limit = new KeyInFlight(2, "invocation.maxInFlightPerKey");
  const a = limit.acquire("k1");
  const b = limit.acquire("k1");
  // another key is counted apart
  const other = limit.acquire("k2");
  assert.throws(
    () => limit.acquire("k1"),
    (err: unknown) =>
      err instanceof CallplaneError &&
      err.code === "TOO_MANY_IN_FLIGHT" &&
      /invocation\.maxInFlightPerKey/.test(err.message),
  );
  a.release();
  a.release();
  assert.equal(limit.count("k1"), 1, "a second release gives nothing back twice");
  const c = limit.acquire("k1");
  b.release();
  c.release();
  other.release();
  assert.equal(limit.count("k1"), 0);
  assert.equal(limit.count("k2"), 0);
});
