// What this replica tells the operator console (the API asks over NATS, plane/console-wire.ts):
// - callplane.console.inflight, which every replica answers: the requests it holds now, oldest
//   first and at most `limit` of them, and each function version's last minute;
// - callplane.console.request.<holder>, which only this replica answers: where one of its requests
//   is, or how it ended (the last 10,000 ends are kept, ended-requests.ts).
// Both read what the request path keeps anyway (the pending table, the metrics' series); nothing
// here runs per request. A reply stays far below NATS's max payload however many requests are
// held: at most INFLIGHT_ROWS.max rows, fewer if the server's max_payload is unusually small.
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { holderHex, isUuid } from "../../lib/ids.js";
import { subjects } from "../../lib/nats/index.js";
import { callplaneVersion } from "../../lib/version.js";
import {
  INFLIGHT_ROWS,
  parseConsoleQuery,
  type ConsoleInflightQuery,
  type FunctionStats,
  type InFlightRow,
  type ReplicaReport,
  type RequestLookup,
  type WorkerSeen,
  type VersionHour,
} from "../../plane/console-wire.js";
import { OTHER_FUNCTION } from "../../plane/function-series.js";
import type { InvocationSeries } from "./metrics.js";
import type { Pending, ReplicaState } from "./state.js";
import { describeWorker, heldState, type WorkerContact } from "./worker-seen.js";

/** Answers the console's questions on the replica's NATS connection until it closes. */
export function listenForConsole(replica: ReplicaState, nc: NatsConnection): Subscription[] {
  const answer = (name: string, build: (m: Msg) => unknown) => (err: Error | null, m: Msg) => {
    if (err) return;
    try {
      respond(nc, m, build(m));
    } catch (e) {
      replica.logger.error({ err: e }, `the console's ${name} question could not be answered`);
    }
  };
  return [
    nc.subscribe(subjects.consoleInflight, {
      callback: answer("in-flight", (m) =>
        inflightReport(replica, parseConsoleQuery<ConsoleInflightQuery>(m)),
      ),
    }),
    nc.subscribe(subjects.consoleRequest(holderHex(replica.holderId)), {
      callback: answer("request", (m) => lookupRequest(replica, m.string().trim())),
    }),
  ];
}

function respond(nc: NatsConnection, m: Msg, body: unknown): void {
  let text = JSON.stringify(body);
  const max = nc.info?.max_payload ?? 1024 * 1024;
  // a report of many rows against a server with a small max_payload: fewer rows rather than none
  const report = body as Partial<ReplicaReport>;
  while (Buffer.byteLength(text) > max * 0.9 && report.requests && report.requests.length > 0) {
    report.requests = report.requests.slice(0, report.requests.length >> 1);
    text = JSON.stringify(report);
  }
  m.respond(text);
}

function rowLimit(limit: unknown): number {
  if (typeof limit !== "number" || !Number.isFinite(limit)) return INFLIGHT_ROWS.default;
  return Math.max(0, Math.min(INFLIGHT_ROWS.max, Math.floor(limit)));
}

/** What this replica holds now (oldest first: the table keeps them in the order they were held). */
export function inflightReport(replica: ReplicaState, q: ConsoleInflightQuery): ReplicaReport {
  const now = Date.now();
  const limit = rowLimit(q.limit);
  const only = typeof q.functionId === "string" ? q.functionId : undefined;
  const requests: InFlightRow[] = [];
  // counted by the series a request holds: versions past the series limit share `other`, so the
  // list is as long as the series table at most, however many versions are held
  const held = new Map<InvocationSeries, number>();
  let inFlight = 0;
  for (const p of replica.pendings.values()) {
    if (p.state === "done" || (only !== undefined && p.functionId !== only)) continue;
    inFlight++;
    if (p.fn) held.set(p.fn, (held.get(p.fn) ?? 0) + 1);
    if (requests.length < limit)
      requests.push({
        requestId: p.requestId,
        functionId: p.functionId,
        versionId: p.version.functionVersionId,
        state: heldState(p),
        ageMs: now - p.started,
        poll: p.poll,
        ...workerField(p.worker),
      });
  }
  const functions: FunctionStats[] = [];
  for (const s of replica.metrics.allSeries()) {
    const n = held.get(s) ?? 0;
    // the shared series stands for the filtered function too when some of its requests are there
    if (only !== undefined && s.functionId !== only && !(s.functionId === OTHER_FUNCTION && n > 0)) continue;
    if (n === 0 && !s.recent.active(now)) continue;
    functions.push({
      functionId: s.functionId,
      versionId: s.functionVersionId,
      ...s.recent.stats(now),
      inFlight: n,
    });
  }
  return {
    kind: "invocation",
    holder: holderHex(replica.holderId),
    version: callplaneVersion(),
    startedAt: replica.startedAt,
    inFlight,
    requests,
    functions,
    ...(q.hour === true && only !== undefined ? { hour: hourReport(replica, only, now) } : {}),
  };
}

/**
 * One function's versions' last hour on this replica (a function's page asks). Versions past the
 * series limit share the `other` series, which cannot be told apart: they have no hour here.
 */
export function hourReport(replica: ReplicaState, functionId: string, now = Date.now()): VersionHour[] {
  const out: VersionHour[] = [];
  for (const s of replica.metrics.allSeries()) {
    if (s.functionId !== functionId) continue;
    const h = s.recent.hour(now);
    if (h) out.push({ functionId: s.functionId, versionId: s.functionVersionId, ...h });
  }
  return out;
}

/** Where one of this replica's requests is, or how it ended. */
export function lookupRequest(replica: ReplicaState, requestId: string): RequestLookup {
  const holder = holderHex(replica.holderId);
  if (!isUuid(requestId)) return { requestId: requestId.slice(0, 64), holder, state: "unknown" };
  const now = Date.now();
  let held: Pending | undefined;
  for (const p of replica.pendings.values()) {
    // a status poll of the request may be held here too; the request itself wins
    if (p.requestId === requestId && p.state !== "done" && (!held || held.poll)) held = p;
  }
  if (held)
    return {
      requestId,
      holder,
      state: heldState(held),
      ...workerField(held.worker),
      functionId: held.functionId,
      versionId: held.version.functionVersionId,
      ageMs: now - held.started,
    };
  const ended = replica.metrics.ended.find(requestId);
  if (!ended) return { requestId, holder, state: "unknown" };
  return {
    requestId,
    holder,
    state: ended.outcome === "answered" ? "answered" : "failed",
    functionId: ended.functionId,
    versionId: ended.versionId,
    status: ended.status,
    ...(ended.code !== undefined ? { code: ended.code } : {}),
    ...(ended.detail !== undefined ? { detail: ended.detail } : {}),
    durationMs: ended.durationMs,
    endedAt: new Date(ended.endedAt).toISOString(),
    ...workerField(ended.worker),
  };
}

/** The row's `worker`, when the replica heard from one (worker-seen.ts). */
function workerField(c: WorkerContact | undefined): { worker?: WorkerSeen } {
  const worker = describeWorker(c);
  return worker ? { worker } : {};
}
