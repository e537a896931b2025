import assert from "node:assert/strict";
import type { IncomingMessage, ServerResponse } from "node:http";
import { randomUUID } from "node:crypto";
import { test } from "node:test";
import { newRequestId } from "../../lib/ids.js";
import { DEFAULT_QUEUE_LIMITS } from "../../lib/nats/index.js";
import { INFLIGHT_ROWS } from "../../plane/console-wire.js";
import { OTHER_FUNCTION } from "../../plane/function-series.js";
import { inflightReport, lookupRequest } from "./console-report.js";
import { ReplicaState, type Pending } from "./state.js";

function replicaState(functionSeriesLimit = 500): ReplicaState {
  const r = new ReplicaState({
    listen: { host: "127.0.0.1", port: 0 },
    region: "test",
    serviceDomain: "nvcf.svc.cluster.local",
    nats: { servers: "tls://127.0.0.1:1", inboxPrefix: "_INBOX_invocation" } as never,
    apiUrl: "http://127.0.0.1:1",
    serviceToken: "x",
    queue: DEFAULT_QUEUE_LIMITS,
    functionSeriesLimit,
  });
  return r;
}

/** Holds `n` requests spread over `versions` function versions, the oldest first. */
function hold(r: ReplicaState, n: number, versions: number): Pending[] {
  const fns = Array.from({ length: versions }, () => ({ fid: randomUUID(), fvid: randomUUID() }));
  const now = Date.now();
  const held: Pending[] = [];
  for (let i = 0; i < n; i++) {
    const f = fns[i % versions];
    const p = {
      requestId: newRequestId(r.holderId),
      functionId: f.fid,
      version: { functionVersionId: f.fvid },
      clientReq: {} as IncomingMessage,
      clientRes: {} as ServerResponse,
      state: i % 2 ? "responding" : "queued",
      poll: false,
      started: now - (n - i),
      fn: r.metrics.of(f.fid, f.fvid),
    } as unknown as Pending;
    r.pendings.add(p, 3600_000, () => undefined);
    held.push(p);
  }
  return held;
}

function releaseAll(r: ReplicaState, held: Pending[]): void {
  for (const p of held) r.pendings.release(p);
  r.auth.destroy();
}

test("with 10,000 requests held over 600 versions, a report stays small: rows and functions both bounded", () => {
  const r = replicaState();
  const held = hold(r, 10_000, 600);
  try {
    const asked = inflightReport(r, { limit: 100_000 });
    assert.equal(asked.inFlight, 10_000);
    assert.equal(asked.requests.length, INFLIGHT_ROWS.max);
    assert.deepEqual(
      asked.requests.slice(0, 3).map((x) => x.requestId),
      held.slice(0, 3).map((p) => p.requestId),
      "the oldest first",
    );
    // 500 versions with series of their own, the other 100 share one
    assert.equal(asked.functions.length, 501);
    const other = asked.functions.find((f) => f.versionId === OTHER_FUNCTION)!;
    const pastLimit = held.filter((_, i) => i % 600 >= 500).length;
    assert.equal(other.inFlight, pastLimit, "the versions past the series limit");
    assert.equal(
      asked.functions.reduce((n, f) => n + f.inFlight, 0),
      10_000,
      "every held request is counted once",
    );
    const bytes = Buffer.byteLength(JSON.stringify(asked));
    assert.ok(bytes < 400 * 1024, `a report of ${bytes} bytes`);
    assert.equal(inflightReport(r, {}).requests.length, INFLIGHT_ROWS.default);
    assert.equal(inflightReport(r, { limit: -5 }).requests.length, 0);
    const one = inflightReport(r, { functionId: held[1].functionId });
    assert.ok(one.inFlight > 0 && one.requests.every((x) => x.functionId === held[1].functionId));
  } finally {
    releaseAll(r, held);
  }
});

test("a lookup says where a held request is, how an ended one went, and unknown for the rest", () => {
  const r = replicaState();
  const [queued, responding] = hold(r, 2, 1);
  try {
    assert.equal(lookupRequest(r, queued.requestId).state, "queued");
    assert.equal(lookupRequest(r, responding.requestId).state, "responding");
    const gone = newRequestId(r.holderId);
    r.metrics.ended.record(
      gone,
      "f",
      "v",
      "timeout",
      504,
      "INVOCATION_TIMEOUT",
      "no worker",
      3000,
      Date.parse("2026-01-01T00:00:00Z"),
    );
    assert.deepEqual(lookupRequest(r, gone), {
      requestId: gone,
      holder: r.holderId.toString(16).padStart(8, "0"),
      state: "failed",
      functionId: "f",
      versionId: "v",
      status: 504,
      code: "INVOCATION_TIMEOUT",
      detail: "no worker",
      durationMs: 3000,
      endedAt: "2026-01-01T00:00:00.000Z",
    });
    assert.equal(lookupRequest(r, newRequestId(r.holderId)).state, "unknown");
    assert.equal(lookupRequest(r, "x".repeat(500)).requestId.length, 64, "a junk id is not echoed whole");
  } finally {
    releaseAll(r, [queued, responding]);
  }
});
