import assert from "node:assert/strict";
import { test } from "node:test";
import { EndedRequests } from "./ended-requests.js";

const end = (r: EndedRequests, id: string, status = 200) =>
  r.record(
    id,
    "f",
    "v",
    status === 200 ? "answered" : "timeout",
    status,
    status === 200 ? undefined : "INVOCATION_TIMEOUT",
    undefined,
    5,
    1000,
  );

test("the ring finds the ends it still holds, the newest of one id, and forgets past its capacity", () => {
  const r = new EndedRequests(3);
  assert.equal(r.find("a"), undefined);
  end(r, "a");
  end(r, "b", 504);
  assert.deepEqual(r.find("b"), {
    requestId: "b",
    functionId: "f",
    versionId: "v",
    outcome: "timeout",
    status: 504,
    code: "INVOCATION_TIMEOUT",
    detail: undefined,
    durationMs: 5,
    endedAt: 1000,
    worker: undefined,
  });
  end(r, "c");
  assert.equal(r.find("a")?.status, 200);
  end(r, "d"); // overwrites a
  assert.equal(r.find("a"), undefined);
  assert.equal(r.find("d")?.outcome, "answered");
  end(r, "b"); // b again: its latest end wins
  assert.equal(r.find("b")?.status, 200);
});
