// What the invocation replicas tell the operator console, on the wire (JSON over NATS request-reply):
// the API asks (services/api/replica-reports.ts), each replica answers
// (services/invocation/console-report.ts). The two services meet here, not in each other's code.
//
// callplane.console.inflight        body ConsoleInflightQuery, every replica replies a ReplicaReport
// callplane.console.request.<holder> body a request id, the replica that holds it replies a RequestLookup

export interface InFlightRow {
  requestId: string;
  functionId: string;
  versionId: string;
  state: HeldState;
  ageMs: number;
  /** The worker that has it, once one called back (see WorkerSeen). */
  worker?: WorkerSeen;
  /** A status poll (GET /v2/nvcf/pexec/status/{id}) waiting on this replica, not a new request. */
  poll: boolean;
}

export interface FunctionStats {
  functionId: string;
  versionId: string;
  /** over the last 60 s on this replica (plane/recent-window.ts) */
  requests: number;
  /** timed out, failed by the plane, or answered with a 5xx */
  errors: number;
  p50Ms: number | undefined;
  p99Ms: number | undefined;
  inFlight: number;
}

export interface ReplicaReport {
  kind: "invocation";
  holder: string;
  version: string;
  startedAt: string;
  /** Requests held (status polls included) that match the query's functionId, or all of them. */
  inFlight: number;
  /** Oldest first, at most the query's limit. */
  requests: InFlightRow[];
  /** Function versions with requests held or ended in the last minute. */
  functions: FunctionStats[];
  /** Asked for with ConsoleInflightQuery.hour: the function's versions' last hour (see VersionHour). */
  hour?: VersionHour[];
}

export interface RequestLookup {
  requestId: string;
  holder: string;
  state: HeldState | "answered" | "failed" | "unknown";
  /** The worker that has it (held), or that answered it (ended), as far as the replica heard. */
  worker?: WorkerSeen;
  functionId?: string;
  versionId?: string;
  ageMs?: number;
  status?: number;
  code?: string;
  detail?: string;
  durationMs?: number;
  endedAt?: string;
}

export interface ConsoleInflightQuery {
  limit?: number;
  functionId?: string;
  /** With functionId: the report carries `hour`, that function's last hour (a function's page). */
  hour?: boolean;
}

/** Rows a report carries unless asked otherwise, and at most (1000 rows are about 200 KB). */
export const INFLIGHT_ROWS = { default: 200, max: 1000 } as const;

// ---- Which worker has a request (its replica's knowledge of it; services/invocation/worker-seen.ts)

/**
 * Where a request held by a replica is: `queued`, no worker has called back yet (it waits in the
 * work queue, or a worker runs it without having needed the replica: a body that came whole in the
 * work message, an answer not begun); `with-worker`, a worker called back (it fetched the rest of
 * the body, or took a status poll) and its answer has not begun; `responding`, its answer streams.
 */
export type HeldState = "queued" | "with-worker" | "responding";

/** The worker that called back for a request, as its replica saw it. */
export interface WorkerSeen {
  /**
   * Its instance id: from its NATS inbox for an answer over NATS (bound to the instance by its
   * identity token), or as its callbacks name it (callplane's workers send x-callplane-worker-instance;
   * an NVCF worker does not).
   */
  instanceId?: string;
  /** The address its HTTP callback came from (the pod's; through the callback proxy, as the proxy says). */
  address?: string;
}

// ---- a function's last hour (the graphs on its page)

/**
 * One version's last hour on one replica, minute by minute (plane/recent-window.ts, HourCounts):
 * point i is the minute starting at `start + i * 60 s`; latency holds each minute's non-empty
 * duration buckets as [bucket, count], the same buckets on every replica, so they add up.
 */
export interface VersionHour {
  functionId: string;
  versionId: string;
  start: number;
  requests: number[];
  errors: number[];
  latency: Array<Array<[number, number]>>;
}

/** A console question's body as an object (an empty or malformed one asks with no options). */
export function parseConsoleQuery<Q extends object>(m: { data: Uint8Array; json<T>(): T }): Q {
  if (m.data.length === 0) return {} as Q;
  try {
    const q = m.json<unknown>();
    return (q !== null && typeof q === "object" ? q : {}) as Q;
  } catch {
    return {} as Q;
  }
}
