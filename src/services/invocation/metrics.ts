// An invocation replica's metrics. Per function version (function_id, function_version_id; bounded,
// plane/function-series.ts): invocations by outcome and status class, the end-to-end duration, the
// time to the worker's response head, the requests held. An invocation is one client request to
// POST /v2/nvcf/pexec/functions/...; status polls are counted by route only, in
// callplane_http_requests_total. Requests refused before their function version is known (a bad
// key, an unknown function) have no function to be labelled with: the route's counts have them.
//
// The hot path touches cells (lib/metric-cells.ts) the request's Pending holds: a request is
// counted once, when its client's response closes, with the outcome its handlers marked and the
// status that went out.
import type { ServerResponse } from "node:http";
import { Counter, LATENCY_BUCKETS, type Registry } from "../../lib/metrics.js";
import {
  CounterFamily,
  GaugeFamily,
  HistogramFamily,
  STATUS_CLASSES,
  statusClassIndex,
  type CounterCell,
  type GaugeCell,
  type HistogramCell,
} from "../../lib/metric-cells.js";
import { DEFAULT_FUNCTION_SERIES_LIMIT, FunctionSeriesTable } from "../../plane/function-series.js";
import { RecentWindow } from "../../plane/recent-window.js";
import type { CallplaneError } from "../../lib/errors.js";
import { EndedRequests } from "./ended-requests.js";
import { INVOCATION_OUTCOMES, type InvocationOutcome } from "./outcome.js";
import type { WorkerContact } from "./worker-seen.js";

const OUTCOME_INDEX: Record<InvocationOutcome, number> = {
  answered: 0,
  timeout: 1,
  client_gone: 2,
  rejected: 3,
  failed: 4,
};

/** What a Pending holds for its metrics. */
export interface Counted {
  /** The function version's series; undefined for a status poll (not an invocation). */
  fn?: InvocationSeries | undefined;
  /** Marked where the request's end is decided; unmarked at the end means failed. */
  outcome?: InvocationOutcome | undefined;
  started: number;
  state: "queued" | "responding" | "done";
  clientRes: ServerResponse;
  requestId: string;
  functionId: string;
  version: { functionVersionId: string };
  /** The error the plane answered the client with, when it did (kept for the console's lookup). */
  problem?: CallplaneError | undefined;
  /** The worker's last contact about it (worker-seen.ts), kept for the console's lookup. */
  worker?: WorkerContact | undefined;
}

/** The cells of one function version. */
export class InvocationSeries {
  readonly inFlight: GaugeCell;
  readonly firstByte: HistogramCell;
  readonly duration: HistogramCell;
  /** The last minute, for the operator console (console-report.ts). */
  readonly recent = new RecentWindow();
  private readonly counts: Array<CounterCell | undefined> = new Array<CounterCell | undefined>(
    INVOCATION_OUTCOMES.length * STATUS_CLASSES.length,
  ).fill(undefined);

  constructor(
    private readonly m: InvocationMetrics,
    readonly functionId: string,
    readonly functionVersionId: string,
  ) {
    this.inFlight = m.inFlight.cell(functionId, functionVersionId);
    this.firstByte = m.firstByte.cell(functionId, functionVersionId);
    this.duration = m.duration.cell(functionId, functionVersionId);
  }

  /**
   * Counts one ended invocation; `status` 0 when no answer went out. An error, in the console's
   * minute: no worker answered in time, the plane failed it, or the client got a 5xx.
   */
  end(outcome: InvocationOutcome, status: number, started: number, now = Date.now()): void {
    const cls = statusClassIndex(status);
    const i = OUTCOME_INDEX[outcome] * STATUS_CLASSES.length + cls;
    const cell = (this.counts[i] ??= this.m.invocations.cell(
      this.functionId,
      this.functionVersionId,
      outcome,
      STATUS_CLASSES[cls],
    ));
    cell.inc();
    const ms = now - started;
    this.duration.observe(ms / 1000);
    this.recent.record(now, ms, outcome === "timeout" || outcome === "failed" || status >= 500);
  }

  /**
   * A request refused after its function was known but before it was held (its answer is the
   * error the handler throws): counted when that answer has gone out. Only refusals take this path.
   */
  refused(res: ServerResponse, started: number): void {
    const end = () => this.end(res.writableFinished ? "rejected" : "client_gone", sentStatus(res), started);
    if (res.writableFinished || res.destroyed) end();
    else res.once("close", end);
  }
}

function sentStatus(res: ServerResponse): number {
  return res.headersSent ? res.statusCode : 0;
}

export class InvocationMetrics {
  readonly invocations: CounterFamily;
  readonly firstByte: HistogramFamily;
  readonly duration: HistogramFamily;
  readonly inFlight: GaugeFamily;
  readonly attaches: Counter;
  /** How the last requests ended, for the operator console's lookup. */
  readonly ended = new EndedRequests();
  private readonly series: FunctionSeriesTable<InvocationSeries>;

  constructor(registry: Registry, functionSeriesLimit = DEFAULT_FUNCTION_SERIES_LIMIT) {
    const labelNames = ["function_id", "function_version_id"];
    this.invocations = new CounterFamily(registry, {
      name: "callplane_invocations_total",
      help: "Client invocations by function version, outcome (answered, timeout, client_gone, rejected, failed) and the status class the client got",
      labelNames: [...labelNames, "outcome", "status_class"],
    });
    this.duration = new HistogramFamily(registry, {
      name: "callplane_invocation_duration_seconds",
      help: "From the client's request to the end of its answer (a 202 ends it)",
      labelNames,
      buckets: LATENCY_BUCKETS,
    });
    this.firstByte = new HistogramFamily(registry, {
      name: "callplane_invocation_first_byte_seconds",
      help: "From the client's request to the worker's response head",
      labelNames,
      buckets: LATENCY_BUCKETS,
    });
    this.inFlight = new GaugeFamily(registry, {
      name: "callplane_invocations_in_flight",
      help: "Invocations this replica holds (queued or answering)",
      labelNames,
    });
    this.attaches = new Counter({
      name: "callplane_attach_requests_total",
      help: "Worker request-attach calls by kind and result",
      labelNames: ["kind", "result"],
      registers: [registry],
    });
    this.series = new FunctionSeriesTable(
      functionSeriesLimit,
      (fid, fvid) => new InvocationSeries(this, fid, fvid),
    );
  }

  /** The series of a function version the caller's key was authorized for. */
  of(functionId: string, functionVersionId: string): InvocationSeries {
    return this.series.get(functionId, functionVersionId);
  }

  /** Every function version's series (and the shared one past the limit). */
  allSeries(): Iterable<InvocationSeries> {
    return this.series.values();
  }

  /** The request is held from here until its client's response closes. */
  held(p: Counted): void {
    p.fn?.inFlight.inc();
  }

  /** The worker's response head goes out to the client. */
  answered(p: Counted): void {
    p.outcome = "answered";
    p.fn?.firstByte.observe((Date.now() - p.started) / 1000);
  }

  /** Marks how the request ends (the last mark before its response closes wins). */
  mark(p: Counted, outcome: InvocationOutcome): void {
    p.outcome = outcome;
  }

  /**
   * The client's response closed: the invocation is counted. A response that closed unfinished
   * while the request was still held is a client that left; an answer cut short by this side
   * failed; else the handlers' mark says (unmarked: the plane answered with an error).
   */
  closed(p: Counted): void {
    const fn = p.fn;
    if (!fn) return;
    fn.inFlight.dec();
    const res = p.clientRes;
    let outcome = p.outcome ?? "failed";
    if (!res.writableFinished) {
      if (p.state !== "done") outcome = "client_gone";
      else if (outcome === "answered") outcome = "failed";
    }
    const status = sentStatus(res);
    const now = Date.now();
    fn.end(outcome, status, p.started, now);
    const problem = outcome === "client_gone" ? undefined : p.problem;
    this.ended.record(
      p.requestId,
      p.functionId,
      p.version.functionVersionId,
      outcome,
      status,
      outcome === "client_gone" ? "CLIENT_GONE" : problem?.code,
      outcome === "client_gone" ? "the client left before its answer was out in full" : problem?.message,
      now - p.started,
      now,
      p.worker,
    );
  }
}
