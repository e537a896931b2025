// Tracing for one service: an OpenTelemetry tracer provider set up by hand (no auto-instrumentation:
// it would patch node:http for every request, misses node:http2, and needs an ESM loader hook),
// ParentBased(TraceIdRatioBased) sampling, a batch processor, and the exporters the settings name
// (OTLP/HTTP JSON, a span file). Spans are made at the hops that matter (spans.ts names them) with
// their parent passed explicitly: no context manager, no AsyncLocalStorage, so a service that does
// not trace pays nothing and one that does pays for its spans only. A service without tracing gets
// no Tracing at all (undefined), and every hop checks that first.
import { hostname } from "node:os";
import {
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  TraceFlags,
  trace,
  type Attributes,
  type AttributeValue,
  type Context,
  type Link,
  type Span,
  type TextMapGetter,
  type TextMapSetter,
} from "@opentelemetry/api";
import { ExportResultCode, W3CTraceContextPropagator, type ExportResult } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import {
  BatchSpanProcessor,
  ParentBasedSampler,
  TraceIdRatioBasedSampler,
  TracerProvider,
  type ReadableSpan,
  type SpanExporter,
  type SpanProcessor,
} from "@opentelemetry/sdk-trace";
import { ATTR_SERVICE_NAME } from "@opentelemetry/semantic-conventions";
import type { Logger } from "../log.js";
import { ATTR } from "./names.js";
import { SpanFileExporter } from "./span-file.js";

/** Where spans go and how many are kept (observability.tracing.*; the worker's CALLPLANE_TRACING_*). */
export interface TracingSettings {
  /** An OTLP/HTTP traces endpoint (JSON), or "" for none. */
  endpoint: string;
  /** The share of new traces recorded, 0 to 1 (a caller's sampled traceparent is always followed). */
  sampleRatio: number;
  /** A file spans are appended to (OTLP/JSON, one export per line), or "" for none. */
  file: string;
}

export interface TracingOptions {
  /** service.name of every span (invocation, grpc-proxy, worker). */
  service: string;
  settings: TracingSettings;
  /** service.instance.id (default: host name and process id). */
  instance?: string;
  /** More exporters (tests: an in-memory one). */
  exporters?: SpanExporter[];
  /** How often the batch processor exports, ms (default 1000: `callplane trace` right after a call sees it). */
  exportDelayMs?: number;
  logger?: Logger;
}

/** W3C trace context as headers carry it. */
/** Headers that may carry W3C trace context (traceparent, tracestate), with lower-case names. */
export type TraceHeaders = Readonly<Record<string, string | string[] | undefined>>;

const propagator = new W3CTraceContextPropagator();

const headerGetter: TextMapGetter<TraceHeaders> = {
  get: (h, k) => h[k],
  keys: (h) => Object.keys(h),
};

const headerSetter: TextMapSetter<Record<string, unknown>> = {
  set: (h, k, v) => {
    h[k] = v;
  },
};

/** How long an export failure is not logged again. */
const FAILURE_LOG_MS = 60_000;

/** Passes spans to an exporter and logs (at most once a minute) that exporting failed. */
class ReportingExporter implements SpanExporter {
  private lastLogged = 0;

  constructor(
    private readonly inner: SpanExporter,
    private readonly what: string,
    private readonly tracing: Tracing,
  ) {}

  export(spans: ReadableSpan[], done: (r: ExportResult) => void): void {
    this.inner.export(spans, (r) => {
      if (r.code !== ExportResultCode.SUCCESS && Date.now() - this.lastLogged > FAILURE_LOG_MS) {
        this.lastLogged = Date.now();
        this.tracing.logger?.warn(
          { to: this.what, spans: spans.length, err: r.error?.message },
          "spans could not be exported (said once a minute at most)",
        );
      }
      done(r);
    });
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve();
  }
}

/** The request ids this process has a span for right now, and their trace ids (for log lines). */
interface Live {
  traceId: string;
  spans: number;
}

export class Tracing {
  readonly service: string;
  logger: Logger | undefined;
  private readonly provider: TracerProvider;
  private readonly tracer: ReturnType<TracerProvider["getTracer"]>;
  private readonly live = new Map<string, Live>();

  constructor(opts: TracingOptions) {
    this.service = opts.service;
    this.logger = opts.logger;
    const { settings } = opts;
    const exporters: Array<[SpanExporter, string]> = [];
    if (settings.endpoint)
      exporters.push([
        new OTLPTraceExporter({ url: settings.endpoint, timeoutMillis: 10_000 }),
        settings.endpoint,
      ]);
    if (settings.file) exporters.push([new SpanFileExporter(settings.file), settings.file]);
    for (const e of opts.exporters ?? []) exporters.push([e, "an exporter"]);
    const processors: SpanProcessor[] = exporters.map(
      ([e, what]) =>
        new BatchSpanProcessor({
          exporter: new ReportingExporter(e, what, this),
          scheduledDelayMillis: opts.exportDelayMs ?? 1000,
          maxQueueSize: 8192,
          maxExportBatchSize: 512,
        }),
    );
    this.provider = new TracerProvider({
      resource: resourceFromAttributes({
        [ATTR_SERVICE_NAME]: opts.service,
        "service.namespace": "callplane",
        "service.instance.id": opts.instance ?? `${hostname()}/${process.pid}`,
      }),
      sampler: new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(settings.sampleRatio) }),
      spanProcessors: processors,
    });
    this.tracer = this.provider.getTracer("callplane");
  }

  /**
   * A span whose parent is `parent` (ROOT_CONTEXT: a new trace). Under a parent that is not sampled
   * nothing is recorded (ParentBased), so the SDK is not asked: it would check the attributes, run
   * the sampler and draw a span id for a span that goes nowhere, at every hop of 99 requests in 100
   * under `npm start`. The parent's own context is passed on instead, unsampled (W3C trace context
   * lets a hop that records nothing forward the traceparent it was given).
   */
  start(name: string, kind: SpanKind, parent: Context, attributes?: Attributes, links?: Link[]): TraceSpan {
    const p = trace.getSpanContext(parent);
    if (p && (p.traceFlags & TraceFlags.SAMPLED) === 0) return new TraceSpan(this, trace.wrapSpanContext(p));
    return new TraceSpan(this, this.tracer.startSpan(name, { kind, attributes, links }, parent));
  }

  /** The context a traceparent header names (a client's, a worker's), or none: a new trace. */
  extract(headers: TraceHeaders): Context {
    // no traceparent, nothing to parse
    if (headers.traceparent === undefined) return ROOT_CONTEXT;
    return propagator.extract(ROOT_CONTEXT, headers, headerGetter);
  }

  /** A span that continues the trace its caller's headers name, or starts one. */
  continueFrom(headers: TraceHeaders, name: string, kind: SpanKind, attributes?: Attributes): TraceSpan {
    return this.start(name, kind, this.extract(headers), attributes);
  }

  /**
   * A consumer's span for a message: its parent is the message's creation context (one message is
   * processed at a time, which the messaging conventions allow), which it also links to.
   */
  consume(headers: TraceHeaders, name: string, attributes?: Attributes): TraceSpan {
    const parent = this.extract(headers);
    const creation = trace.getSpanContext(parent);
    return this.start(
      name,
      SpanKind.CONSUMER,
      parent,
      attributes,
      creation ? [{ context: creation }] : undefined,
    );
  }

  /**
   * For pino's `mixin`: a log line that names a request (`requestId`) this process has a span for
   * gets that span's `traceId`.
   */
  readonly logMixin = (obj: object): object => {
    // a new object each time: pino merges the line's own fields into what this returns
    const id = (obj as { requestId?: unknown }).requestId;
    const l = typeof id === "string" ? this.live.get(id) : undefined;
    return l ? { traceId: l.traceId } : {};
  };

  /** @internal (TraceSpan) */
  liveStart(requestId: string, traceId: string): void {
    const l = this.live.get(requestId);
    if (l) {
      l.traceId = traceId;
      l.spans++;
    } else this.live.set(requestId, { traceId, spans: 1 });
  }

  /** @internal (TraceSpan) */
  liveEnd(requestId: string): void {
    const l = this.live.get(requestId);
    if (l && --l.spans <= 0) this.live.delete(requestId);
  }

  /** Exports what has ended. */
  flush(): Promise<void> {
    return this.provider.forceFlush();
  }

  /** Exports what has ended and stops. */
  async shutdown(): Promise<void> {
    await this.provider
      .shutdown()
      .catch((err: unknown) =>
        this.logger?.warn({ err: (err as Error).message }, "stopping the tracer failed"),
      );
  }
}

/** One span, with what the hops do with it. */
export class TraceSpan {
  /** The request this span is part of (identify()); its children inherit it. */
  private ids: [string, string | undefined, string | undefined] | undefined;
  /** Whether its request's log lines name its trace (identify(); its children leave that to it). */
  private live = false;
  private ended = false;
  /** Recorded (sampled): worth attributes. */
  readonly recording: boolean;
  private ctx: Context | undefined;

  constructor(
    readonly tracing: Tracing,
    readonly span: Span,
  ) {
    this.recording = (span.spanContext().traceFlags & TraceFlags.SAMPLED) !== 0;
  }

  /** The request id identify() gave it (or its parent). */
  get requestId(): string | undefined {
    return this.ids?.[0];
  }

  get traceId(): string {
    return this.span.spanContext().traceId;
  }

  get spanId(): string {
    return this.span.spanContext().spanId;
  }

  /** This span as the parent of others. */
  get context(): Context {
    return (this.ctx ??= trace.setSpan(ROOT_CONTEXT, this.span));
  }

  /** A span under this one, part of the same request. */
  child(name: string, kind: SpanKind, attributes?: Attributes, links?: Link[]): TraceSpan {
    return this.inherit(this.tracing.start(name, kind, this.context, this.withIds(attributes), links));
  }

  /**
   * A span under the one `headers` name when they carry a traceparent (linked to this one), else
   * under this one; part of this span's request either way.
   */
  childOf(headers: TraceHeaders, name: string, kind: SpanKind, attributes?: Attributes): TraceSpan {
    if (headers.traceparent === undefined) return this.child(name, kind, attributes);
    const parent = this.tracing.extract(headers);
    if (!trace.getSpanContext(parent)) return this.child(name, kind, attributes);
    return this.inherit(
      this.tracing.start(name, kind, parent, this.withIds(attributes), [
        { context: this.span.spanContext() },
      ]),
    );
  }

  /** A child's attributes with this span's request ids: given at the start, checked once by the SDK. */
  private withIds(attributes: Attributes | undefined): Attributes | undefined {
    const ids = this.ids;
    if (!ids) return attributes;
    const a: Attributes = { ...attributes, [ATTR.requestId]: ids[0] };
    if (ids[1]) a[ATTR.functionId] = ids[1];
    if (ids[2]) a[ATTR.functionVersionId] = ids[2];
    return a;
  }

  private inherit(s: TraceSpan): TraceSpan {
    s.ids = this.ids;
    return s;
  }

  /** Writes this span's traceparent (and tracestate) into `headers`; returns them. */
  inject<T extends object>(headers: T): T {
    propagator.inject(this.context, headers, headerSetter);
    return headers;
  }

  /** The request this span is part of: its ids as attributes, and its trace id on its log lines. */
  identify(requestId: string, functionId?: string, functionVersionId?: string): this {
    if (!this.recording) return this;
    const [, f, v] = this.ids ?? [];
    this.ids = [requestId, functionId ?? f, functionVersionId ?? v];
    this.span.setAttribute(ATTR.requestId, requestId);
    if (this.ids[1]) this.span.setAttribute(ATTR.functionId, this.ids[1]);
    if (this.ids[2]) this.span.setAttribute(ATTR.functionVersionId, this.ids[2]);
    if (!this.live && !this.ended) {
      this.live = true;
      this.tracing.liveStart(requestId, this.traceId);
    }
    return this;
  }

  set(key: string, value: AttributeValue | undefined): this {
    if (value !== undefined && this.recording) this.span.setAttribute(key, value);
    return this;
  }

  /** Marks the span failed (its status, and error.type: a stable code where there is one). */
  fail(err: unknown): this {
    if (!this.recording) return this;
    const e = err as { code?: unknown; message?: unknown } | undefined;
    const code = typeof e?.code === "string" ? e.code : err instanceof Error ? err.name : "error";
    const message = typeof e?.message === "string" ? e.message : String(err);
    this.span.setAttribute("error.type", code);
    this.span.setStatus({ code: SpanStatusCode.ERROR, message: message.slice(0, 300) });
    return this;
  }

  /** Ends the span (once); with `err`, failed. */
  end(err?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    if (err !== undefined) this.fail(err);
    this.span.end();
    if (this.live) this.tracing.liveEnd(this.ids![0]);
  }

  /**
   * Ends the span with an HTTP client call: at its response head (status recorded; 5xx failed), or
   * with `untilBody`, once its body has been read or cut; failed if the call fails. Returns `call`.
   */
  settle<T extends { statusCode: number; body?: { once(e: "close", f: () => void): unknown } }>(
    call: Promise<T>,
    untilBody = false,
  ): Promise<T> {
    // an unrecorded span has nothing to note and nobody waiting for its end
    if (!this.recording) return call;
    call.then(
      (r) => {
        this.set("http.response.status_code", r.statusCode);
        const err = r.statusCode >= 500 ? `HTTP ${r.statusCode}` : undefined;
        if (untilBody && r.body) r.body.once("close", () => this.end(err));
        else this.end(err);
      },
      (err: unknown) => this.end(err),
    );
    return call;
  }

  /** Ends the span when `p` settles (failed if it rejects); returns `p`. */
  until<T>(p: Promise<T>): Promise<T> {
    if (!this.recording) return p;
    p.then(
      () => this.end(),
      (err: unknown) => this.end(err),
    );
    return p;
  }
}
