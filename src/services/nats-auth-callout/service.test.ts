import assert from "node:assert/strict";
import { test } from "node:test";
import { sampler } from "./service.js";

test("the callout's log sampling: per message, the first `initial` lines, then 1 in `thereafter`; initial 0 keeps all", () => {
  let clock = 1_000_000;
  const keep = sampler({ initial: 3, thereafter: 4 }, () => clock);
  const kept = Array.from({ length: 12 }, () => keep("Authentication successful"));
  // lines 1-3, then the 4th after them (line 7) and line 11; within one second
  assert.deepEqual(kept.map((k, i) => (k ? i + 1 : 0)).filter(Boolean), [1, 2, 3, 7, 11]);
  assert.equal(keep("Authentication denied"), true, "another message has its own count");
  clock += 1000;
  assert.equal(keep("Authentication successful"), true, "a new second starts a new count");
  const all = sampler({ initial: 0, thereafter: 100 });
  assert.ok(Array.from({ length: 500 }, () => all("x")).every(Boolean));
});
