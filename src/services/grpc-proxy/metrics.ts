// grpc-proxy's own metrics (the listeners, the auth cache and the TLS reloaders add theirs).
// Per function version (bounded: plane/function-series.ts): calls by outcome and gRPC code, their
// duration, the time to the worker's response head, the calls in flight; each call touches cells
// its series holds (lib/metric-cells.ts). A call refused before its function version is known (a
// bad key, an unknown function) has no function to be labelled with: every call grpc-proxy answers
// itself is counted in callplane_grpc_refusals_total by its stable code.
import { Counter, Gauge, LATENCY_BUCKETS, type Registry } from "../../lib/metrics.js";
import {
  CounterFamily,
  GaugeFamily,
  HistogramFamily,
  type CounterCell,
  type GaugeCell,
  type HistogramCell,
} from "../../lib/metric-cells.js";
import { GRPC } from "../../lib/grpc/index.js";
import { DEFAULT_FUNCTION_SERIES_LIMIT, FunctionSeriesTable } from "../../plane/function-series.js";

/**
 * ok: passed through and answered (whatever its gRPC status); reset: one side reset the stream;
 * failed: the worker's tunnel failed before answering; refused: answered by grpc-proxy itself
 * after its function was known; client_gone: the client cancelled before the call went through.
 */
export const GRPC_CALL_OUTCOMES = ["ok", "reset", "failed", "refused", "client_gone"] as const;
export type GrpcCallOutcome = (typeof GRPC_CALL_OUTCOMES)[number];

/** The grpc_code label: the status names of GRPC by number, then none (no status) and other. */
const CODE_NAMES: readonly string[] = [
  ...Object.entries(GRPC)
    .sort((a, b) => a[1] - b[1])
    .map(([name]) => name),
  "none",
  "other",
];
const NONE = CODE_NAMES.length - 2;
const OTHER = CODE_NAMES.length - 1;

/** The index of a status (as a number, or as trailers carry it) in CODE_NAMES, without allocating. */
function codeIndex(status: string | number | undefined): number {
  if (status === undefined) return NONE;
  const n = typeof status === "number" ? status : status.length <= 2 ? Number(status) : NaN;
  return Number.isInteger(n) && n >= 0 && n < NONE ? n : OTHER;
}

export class GrpcCallSeries {
  readonly inFlight: GaugeCell;
  readonly duration: HistogramCell;
  readonly firstByte: HistogramCell;
  private readonly counts: Array<CounterCell | undefined> = new Array<CounterCell | undefined>(
    GRPC_CALL_OUTCOMES.length * CODE_NAMES.length,
  ).fill(undefined);

  constructor(
    private readonly calls: CounterFamily,
    m: { duration: HistogramFamily; firstByte: HistogramFamily; inFlight: GaugeFamily },
    readonly functionId: string,
    readonly functionVersionId: string,
  ) {
    this.inFlight = m.inFlight.cell(functionId, functionVersionId);
    this.duration = m.duration.cell(functionId, functionVersionId);
    this.firstByte = m.firstByte.cell(functionId, functionVersionId);
  }

  /**
   * Counts one call that ended. `started` and `firstByteAt` are performance.now() readings;
   * firstByteAt is undefined when no response head came from the worker.
   */
  end(
    outcome: GrpcCallOutcome,
    status: string | number | undefined,
    started: number,
    firstByteAt?: number,
  ): void {
    const o = GRPC_CALL_OUTCOMES.indexOf(outcome);
    const c = codeIndex(status);
    const i = o * CODE_NAMES.length + c;
    (this.counts[i] ??= this.calls.cell(
      this.functionId,
      this.functionVersionId,
      outcome,
      CODE_NAMES[c],
    )).inc();
    const now = performance.now();
    this.duration.observe((now - started) / 1000);
    if (firstByteAt !== undefined) this.firstByte.observe((firstByteAt - started) / 1000);
  }
}

export class GrpcProxyMetrics {
  readonly calls: CounterFamily;
  readonly duration: HistogramFamily;
  readonly firstByte: HistogramFamily;
  readonly inFlight: GaugeFamily;
  readonly refusals: Counter<"code">;
  readonly tunnels: Counter<"result">;
  readonly openSessions: Gauge;
  readonly waitingSessions: Gauge;
  private readonly series: FunctionSeriesTable<GrpcCallSeries>;

  constructor(registry: Registry, functionSeriesLimit = DEFAULT_FUNCTION_SERIES_LIMIT) {
    const labelNames = ["function_id", "function_version_id"];
    this.calls = new CounterFamily(registry, {
      name: "callplane_grpc_calls_total",
      help: "Client gRPC calls by function version, outcome (ok, reset, failed, refused, client_gone) and the gRPC status the client got",
      labelNames: [...labelNames, "outcome", "grpc_code"],
    });
    this.duration = new HistogramFamily(registry, {
      name: "callplane_grpc_call_duration_seconds",
      help: "From a call's first HEADERS to the end of both its streams",
      labelNames,
      buckets: LATENCY_BUCKETS,
    });
    this.firstByte = new HistogramFamily(registry, {
      name: "callplane_grpc_call_first_byte_seconds",
      help: "From a call's first HEADERS to the worker's response head",
      labelNames,
      buckets: LATENCY_BUCKETS,
    });
    this.inFlight = new GaugeFamily(registry, {
      name: "callplane_grpc_calls_in_flight",
      help: "Calls in progress on this replica (waiting for their worker or passing through)",
      labelNames,
    });
    this.refusals = new Counter({
      name: "callplane_grpc_refusals_total",
      help: "Calls grpc-proxy answered itself, by stable error code (docs/errors.md)",
      labelNames: ["code"],
      registers: [registry],
    });
    this.tunnels = new Counter({
      name: "callplane_grpc_tunnels_total",
      help: "Worker CONNECT requests by result",
      labelNames: ["result"],
      registers: [registry],
    });
    this.openSessions = new Gauge({
      name: "callplane_grpc_sessions_open",
      help: "Worker sessions with a tunnel to this replica",
      registers: [registry],
    });
    this.waitingSessions = new Gauge({
      name: "callplane_grpc_sessions_waiting",
      help: "Sessions waiting for their worker's tunnel",
      registers: [registry],
    });
    const cells = { duration: this.duration, firstByte: this.firstByte, inFlight: this.inFlight };
    this.series = new FunctionSeriesTable(
      functionSeriesLimit,
      (fid, fvid) => new GrpcCallSeries(this.calls, cells, fid, fvid),
    );
  }

  /** A call whose function version is known starts (it is in flight until end()). */
  begin(session: { functionId: string; functionVersionId: string }): GrpcCallSeries {
    const s = this.series.get(session.functionId, session.functionVersionId);
    s.inFlight.inc();
    return s;
  }
}

export function grpcProxyMetrics(registry: Registry, functionSeriesLimit?: number): GrpcProxyMetrics {
  return new GrpcProxyMetrics(registry, functionSeriesLimit);
}
