// Spans read from OTLP/JSON (an ExportTraceServiceRequest: resourceSpans[].scopeSpans[].spans[],
// ids in hex, int64 as strings, enums as integers): what an OTLP/HTTP receiver gets from the
// exporter, and what a Tempo query answers (its ids may be base64), as flat SpanRecords for
// `callplane trace` and the tests.

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
