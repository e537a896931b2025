// End-to-end tracing (issue 23): W3C trace context from the client through NATS to the worker and
// the inference server, spans made by hand at each hop (hops.ts), exported over OTLP/HTTP or to a
// span file that `callplane trace` shows as a timeline.
//
// OpenTelemetry's modules are loaded by startTracing() only: a service that does not trace never
// loads them (they take a few hundred ms), and nothing here imports them but types.
import type { Tracing, TracingOptions } from "./tracing.js";

export type { TraceHeaders, TraceSpan, Tracing, TracingOptions, TracingSettings } from "./tracing.js";
export { ATTR, KIND, MESSAGING_SYSTEM, WORK_SUBJECT_TEMPLATE } from "./names.js";
export { decodeTraces, hexId, type SpanRecord } from "./otlp-json.js";
export {
  SpanFileExporter,
  decodeSpanLine,
  readSpanFile,
  requestSpansInFile,
  spanLines,
} from "./span-file.js";
export { formatDuration, timelineLines, tracesOfRequest, type TraceView } from "./timeline.js";
export { TraceQueryError, queryRequestSpans } from "./query.js";
export { TRACING_ENV, tracingFromEnv, tracingSettings, tracingWorkerEnv } from "./settings.js";
export * from "./hops.js";

/** A service's tracer (OpenTelemetry's modules are loaded now, and only now). */
export async function startTracing(opts: TracingOptions): Promise<Tracing> {
  const { Tracing } = await import("./tracing.js");
  return new Tracing(opts);
}
