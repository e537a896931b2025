import assert from "node:assert/strict";
import { test } from "node:test";
import { RECENT_WINDOW_MS, RecentWindow } from "./recent-window.js";

test("the window counts the last minute's requests and errors, and forgets older ones", () => {
  const w = new RecentWindow();
  const t0 = 1_000_000_000_000;
  assert.equal(w.active(t0), false);
  assert.deepEqual(w.stats(t0), { requests: 0, errors: 0, p50Ms: undefined, p99Ms: undefined });
  w.record(t0, 10, false);
  w.record(t0 + 1000, 20, true);
  w.record(t0 + 30_000, 30, false);
  assert.equal(w.active(t0 + 30_000), true);
  assert.deepEqual(
    { ...w.stats(t0 + 30_000), p50Ms: undefined, p99Ms: undefined },
    { requests: 3, errors: 1, p50Ms: undefined, p99Ms: undefined },
  );
  // past the window, the first two are gone; the third stays until it is a minute old
  const later = t0 + RECENT_WINDOW_MS + 5000;
  assert.equal(w.stats(later).requests, 1);
  assert.equal(w.stats(later).errors, 0);
  assert.equal(w.stats(t0 + 30_000 + RECENT_WINDOW_MS + 5000).requests, 0);
  assert.equal(w.active(t0 + 30_000 + RECENT_WINDOW_MS + 5000), false);
});

test("a slot entered again after a minute starts from zero", () => {
  const w = new RecentWindow();
  const t0 = 1_000_000_000_000;
  for (let i = 0; i < 5; i++) w.record(t0, 5, true);
  const again = t0 + RECENT_WINDOW_MS; // the same slot, a minute later
  w.record(again, 5, false);
  assert.deepEqual(
    { requests: w.stats(again).requests, errors: w.stats(again).errors },
    { requests: 1, errors: 0 },
  );
});

test("quantiles are within a fifth above the true ones", () => {
  const w = new RecentWindow();
  const t0 = 1_000_000_000_000;
  // 1..1000 ms, one each: p50 500, p99 990
  for (let ms = 1; ms <= 1000; ms++) w.record(t0, ms, false);
  const s = w.stats(t0);
  assert.equal(s.requests, 1000);
  assert.ok(s.p50Ms! >= 500 && s.p50Ms! <= 600, `p50 ${s.p50Ms}`);
  assert.ok(s.p99Ms! >= 990 && s.p99Ms! <= 1190, `p99 ${s.p99Ms}`);
  // under a millisecond, and far past the last bucket
  const v = new RecentWindow();
  v.record(t0, 0.2, false);
  assert.equal(v.stats(t0).p50Ms, 1);
  v.record(t0, 1e12, false);
  assert.ok(v.stats(t0).p99Ms! > 7_000_000, "the last bucket holds the longest (about two hours)");
});
