// Spans as OTLP/JSON (an ExportTraceServiceRequest: resourceSpans[].scopeSpans[].spans[], ids in
// hex, int64 as strings, enums as integers), both ways: encodeSpans writes what the span file holds
// (the very body an OTLP/HTTP receiver gets, so a line of the file can be sent to a collector as
// it is), and decodeTraces reads it back, from the file, a receiver's request or a Tempo query
// (whose ids may be base64), into flat SpanRecords for `callplane trace` and the tests.
import type { AttributeValue, Attributes, HrTime } from "@opentelemetry/api";
import type { ReadableSpan } from "@opentelemetry/sdk-trace";

type AnyValue =
  | { stringValue: string }
  | { boolValue: boolean }
  | { intValue: string }
  | { doubleValue: number }
  | { arrayValue: { values: AnyValue[] } };

interface KeyValue {
  key: string;
  value: AnyValue;
}

export interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  traceState?: string;
  name: string;
  kind: number;
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  attributes: KeyValue[];
  links?: Array<{ traceId: string; spanId: string; attributes: KeyValue[] }>;
  status: { code: number; message?: string };
}

export interface OtlpTraces {
  resourceSpans: Array<{
    resource: { attributes: KeyValue[] };
    scopeSpans: Array<{ scope: { name: string; version?: string }; spans: OtlpSpan[] }>;
  }>;
}

function anyValue(v: AttributeValue): AnyValue {
  if (typeof v === "string") return { stringValue: v };
  if (typeof v === "boolean") return { boolValue: v };
  if (typeof v === "number") return Number.isInteger(v) ? { intValue: String(v) } : { doubleValue: v };
  return {
    arrayValue: {
      values: (v as Array<string | number | boolean | null | undefined>)
        .filter((x): x is string | number | boolean => x !== null && x !== undefined)
        .map((x) => anyValue(x)),
    },
  };
}

function keyValues(a: Attributes): KeyValue[] {
  const out: KeyValue[] = [];
  for (const key in a) {
    const v = a[key];
    if (v !== undefined) out.push({ key, value: anyValue(v) });
  }
  return out;
}

/** HrTime ([seconds, nanoseconds]) as a decimal string of nanoseconds, without a BigInt. */
function nanos(t: HrTime): string {
  return t[0] === 0 ? String(t[1]) : `${t[0]}${String(t[1]).padStart(9, "0")}`;
}

/** Spans as one OTLP/JSON export, grouped by resource and scope. */
export function encodeSpans(spans: readonly ReadableSpan[]): OtlpTraces {
  const byResource = new Map<object, Map<string, OtlpSpan[]>>();
  const resources = new Map<object, Attributes>();
  for (const s of spans) {
    let scopes = byResource.get(s.resource);
    if (!scopes) {
      scopes = new Map();
      byResource.set(s.resource, scopes);
      resources.set(s.resource, s.resource.attributes);
    }
    const scope = s.instrumentationScope.name;
    let list = scopes.get(scope);
    if (!list) scopes.set(scope, (list = []));
    const ctx = s.spanContext();
    const out: OtlpSpan = {
      traceId: ctx.traceId,
      spanId: ctx.spanId,
      name: s.name,
      // the API's SpanKind starts at INTERNAL = 0; OTLP's at UNSPECIFIED = 0, INTERNAL = 1
      kind: s.kind + 1,
      startTimeUnixNano: nanos(s.startTime),
      endTimeUnixNano: nanos(s.endTime),
      attributes: keyValues(s.attributes),
      status: s.status.message ? { code: s.status.code, message: s.status.message } : { code: s.status.code },
    };
    if (s.parentSpanContext) out.parentSpanId = s.parentSpanContext.spanId;
    const state = ctx.traceState?.serialize();
    if (state) out.traceState = state;
    if (s.links.length)
      out.links = s.links.map((l) => ({
        traceId: l.context.traceId,
        spanId: l.context.spanId,
        attributes: keyValues(l.attributes ?? {}),
      }));
    list.push(out);
  }
  return {
    resourceSpans: [...byResource].map(([res, scopes]) => ({
      resource: { attributes: keyValues(resources.get(res)!) },
      scopeSpans: [...scopes].map(([name, list]) => ({ scope: { name }, spans: list })),
    })),
  };
}

// ---------------------------------------------------------------- reading

export type SpanKindName = "unspecified" | "internal" | "server" | "client" | "producer" | "consumer";
const KINDS: SpanKindName[] = ["unspecified", "internal", "server", "client", "producer", "consumer"];
const KIND_NAMES: Record<string, SpanKindName> = {
  SPAN_KIND_INTERNAL: "internal",
  SPAN_KIND_SERVER: "server",
  SPAN_KIND_CLIENT: "client",
  SPAN_KIND_PRODUCER: "producer",
  SPAN_KIND_CONSUMER: "consumer",
};

export type AttrValue = string | number | boolean | AttrValue[];

/** One span, flat: what `callplane trace` shows and the tests check. */
export interface SpanRecord {
  traceId: string;
  spanId: string;
  parentSpanId: string | undefined;
  name: string;
  kind: SpanKindName;
  /** service.name of the span's resource. */
  service: string;
  /** Nanoseconds since the epoch. */
  start: bigint;
  end: bigint;
  attributes: Record<string, AttrValue>;
  status: "unset" | "ok" | "error";
  statusMessage: string | undefined;
  links: Array<{ traceId: string; spanId: string }>;
}

/** A trace or span id as hex: OTLP/JSON gives hex; Tempo (protobuf's JSON mapping) gives base64. */
export function hexId(id: unknown, bytes: 16 | 8): string | undefined {
  if (typeof id !== "string" || id === "") return undefined;
  if (id.length === bytes * 2 && /^[0-9a-f]+$/i.test(id)) return id.toLowerCase();
  const b = Buffer.from(id, "base64");
  return b.length === bytes ? b.toString("hex") : undefined;
}

function readValue(v: unknown): AttrValue | undefined {
  if (!v || typeof v !== "object") return undefined;
  const o = v as Record<string, unknown>;
  if ("stringValue" in o) return String(o.stringValue);
  if ("boolValue" in o) return o.boolValue === true;
  if ("intValue" in o) return Number(o.intValue);
  if ("doubleValue" in o) return Number(o.doubleValue);
  if ("arrayValue" in o) {
    const values = (o.arrayValue as { values?: unknown[] } | undefined)?.values ?? [];
    return values.map(readValue).filter((x): x is AttrValue => x !== undefined);
  }
  return undefined;
}

function readAttributes(list: unknown): Record<string, AttrValue> {
  const out: Record<string, AttrValue> = {};
  if (!Array.isArray(list)) return out;
  for (const kv of list as Array<{ key?: unknown; value?: unknown }>) {
    const v = readValue(kv?.value);
    if (typeof kv?.key === "string" && v !== undefined) out[kv.key] = v;
  }
  return out;
}

function readNanos(v: unknown): bigint {
  try {
    return typeof v === "string" || typeof v === "number" ? BigInt(v) : 0n;
  } catch {
    return 0n;
  }
}

function readKind(k: unknown): SpanKindName {
  if (typeof k === "number") return KINDS[k] ?? "unspecified";
  if (typeof k === "string") return KIND_NAMES[k] ?? "unspecified";
  return "unspecified";
}

function readStatus(s: unknown): SpanRecord["status"] {
  const code = (s as { code?: unknown } | undefined)?.code;
  if (code === 1 || code === "STATUS_CODE_OK") return "ok";
  if (code === 2 || code === "STATUS_CODE_ERROR") return "error";
  return "unset";
}

/**
 * The spans of an OTLP/JSON document: an export (`resourceSpans`), Tempo's answer to
 * /api/traces/{id} (`batches`, or `trace.resourceSpans`); anything else holds none.
 */
export function decodeTraces(doc: unknown): SpanRecord[] {
  const d = doc as { resourceSpans?: unknown; batches?: unknown; trace?: { resourceSpans?: unknown } };
  const rs = d?.resourceSpans ?? d?.batches ?? d?.trace?.resourceSpans;
  const out: SpanRecord[] = [];
  if (!Array.isArray(rs)) return out;
  for (const r of rs as Array<Record<string, unknown>>) {
    const resource = readAttributes((r?.resource as { attributes?: unknown } | undefined)?.attributes);
    const service = typeof resource["service.name"] === "string" ? resource["service.name"] : "?";
    const scopes = r?.scopeSpans ?? r?.instrumentationLibrarySpans;
    if (!Array.isArray(scopes)) continue;
    for (const sc of scopes as Array<{ spans?: unknown }>) {
      if (!Array.isArray(sc?.spans)) continue;
      for (const s of sc.spans as Array<Record<string, unknown>>) {
        const traceId = hexId(s.traceId, 16);
        const spanId = hexId(s.spanId, 8);
        if (!traceId || !spanId) continue;
        const links = Array.isArray(s.links)
          ? (s.links as Array<Record<string, unknown>>).flatMap((l) => {
              const t = hexId(l.traceId, 16);
              const sp = hexId(l.spanId, 8);
              return t && sp ? [{ traceId: t, spanId: sp }] : [];
            })
          : [];
        const message = (s.status as { message?: unknown } | undefined)?.message;
        out.push({
          traceId,
          spanId,
          parentSpanId: hexId(s.parentSpanId, 8),
          name: typeof s.name === "string" ? s.name : "?",
          kind: readKind(s.kind),
          service,
          start: readNanos(s.startTimeUnixNano),
          end: readNanos(s.endTimeUnixNano),
          attributes: readAttributes(s.attributes),
          status: readStatus(s.status),
          statusMessage: typeof message === "string" && message ? message : undefined,
          links,
        });
      }
    }
  }
  return out;
}
