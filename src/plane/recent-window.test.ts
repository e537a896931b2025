import assert from "node:assert/strict";
import { test } from "node:test";
import { HOUR_MINUTES, quantileOfBuckets, RECENT_WINDOW_MS, RecentWindow } from "./recent-window.js";

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

test("the hour keeps each minute's counts, folded as slots are reused, and forgets what is older", () => {
  const w = new RecentWindow();
  const t0 = 1_000_000_020_000; // 20 s into a minute
  const minute = Math.floor(t0 / 60_000) * 60_000;
  assert.equal(w.hour(t0), undefined);
  w.record(t0, 10, false);
  w.record(t0, 10, true);
  // ten minutes later, in the same 5-s slot (folded now) and another
  const t10 = t0 + 10 * 60_000;
  w.record(t10, 100, false);
  w.record(t10 + 5000, 1000, false);
  const h = w.hour(t10 + 5000)!;
  assert.equal(h.requests.length, HOUR_MINUTES);
  assert.equal(h.start, minute + 10 * 60_000 - 59 * 60_000);
  const i0 = (minute - h.start) / 60_000;
  assert.equal(h.requests[i0], 2);
  assert.equal(h.errors[i0], 1);
  assert.equal(h.requests[i0 + 10], 2);
  assert.equal(
    h.requests.reduce((a, b) => a + b, 0),
    4,
    "nothing counted twice",
  );
  // the minute's durations, added up with another replica's, give its quantiles
  const counts = new Map<number, number>();
  for (const [b, c] of h.latency[i0 + 10]) counts.set(b, c);
  assert.ok(quantileOfBuckets(counts, 0.5)! >= 100 && quantileOfBuckets(counts, 0.5)! <= 120);
  assert.ok(quantileOfBuckets(counts, 0.99)! >= 1000 && quantileOfBuckets(counts, 0.99)! <= 1200);
  assert.equal(quantileOfBuckets(new Map(), 0.5), undefined);
  // an hour after the first requests they are gone; the later ones stay
  const later = t0 + 61 * 60_000;
  const h2 = w.hour(later)!;
  assert.equal(
    h2.requests.reduce((a, b) => a + b, 0),
    2,
  );
  assert.equal(w.hour(t10 + 5000 + 61 * 60_000), undefined);
  // a slot folded long after its minute left the hour is not counted in it
  const v = new RecentWindow();
  v.record(t0, 5, false);
  v.record(t0 + 60 * 60_000 + 30_000, 5, false); // another slot, in the minute cell of t0's an hour on
  v.record(t0 + 120 * 60_000, 5, false); // reuses t0's slot: folds a minute two hours old
  const h3 = v.hour(t0 + 120 * 60_000)!;
  assert.equal(
    h3.requests.reduce((a, b) => a + b, 0),
    1,
  );
});
