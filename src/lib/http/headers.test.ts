import assert from "node:assert/strict";
import { test } from "node:test";
import { endToEnd, endToEndHeaders, endToEndPairs, foldPairs, rawPairs } from "./headers.js";

test("hop-by-hop headers and the ones Connection lists are dropped, protected ones kept", () => {
  const raw = ["Host", "h", "Connection", "keep-alive, X-Hop, Authorization", "X-Hop", "1", "TE", "trailers"];
  raw.push("Authorization", "Bearer a", "X-End", "2", "X-End", "3");
  const pairs = endToEndPairs(rawPairs(raw), {
    drop: new Set(["host"]),
    protect: new Set(["authorization"]),
  });
  assert.deepEqual(pairs, [
    ["Authorization", "Bearer a"],
    ["X-End", "2"],
    ["X-End", "3"],
  ]);
  assert.deepEqual(foldPairs(pairs), { authorization: "Bearer a", "x-end": ["2", "3"] });
});

test("any entry shape: NATS StringKV entries and parsed objects", () => {
  const kv = [
    { key: "connection", value: "x-a" },
    { key: "x-a", value: "1" },
    { key: "x-b", value: "2" },
  ];
  assert.deepEqual(
    endToEnd(
      kv,
      (e) => e.key,
      (e) => e.value,
    ),
    [{ key: "x-b", value: "2" }],
  );
  assert.deepEqual(
    endToEndHeaders({ "transfer-encoding": "chunked", "content-type": "a/b", upgrade: undefined }),
    { "content-type": "a/b" },
  );
});
