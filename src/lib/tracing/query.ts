// A tracing backend's query API, for `callplane trace` where spans go to a backend instead of a
// file (observability.tracing.queryUrl): Grafana Tempo's HTTP API, which finds traces by an
// attribute (GET /api/search?tags=nvcf.request.id=<id>) and returns each as OTLP/JSON
// (GET /api/traces/<trace id>). Jaeger, Zipkin and the like are not read.
import { decodeTraces, hexId, type SpanRecord } from "./otlp-json.js";
import { ATTR } from "./names.js";

export class TraceQueryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TraceQueryError";
  }
}

async function getJson(url: URL, timeoutMs: number): Promise<unknown> {
  let res: Response;
  try {
    res = await fetch(url, {
      headers: { accept: "application/json" },
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (err) {
    const cause = (err as { cause?: { code?: string } }).cause?.code;
    throw new TraceQueryError(
      `the trace query API at ${url.origin} did not answer (${cause ?? (err as Error).message})`,
    );
  }
  const text = await res.text();
  if (!res.ok)
    throw new TraceQueryError(`${url.origin}${url.pathname} answered ${res.status}: ${text.slice(0, 200)}`);
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new TraceQueryError(`${url.origin}${url.pathname} answered something that is not JSON`);
  }
}

/** The spans of every trace that holds a span of `requestId`, as the backend at `base` has them. */
export async function queryRequestSpans(
  base: string,
  requestId: string,
  timeoutMs = 10_000,
): Promise<SpanRecord[]> {
  const root = base.replace(/\/+$/, "");
  const search = new URL(`${root}/api/search`);
  search.searchParams.set("tags", `${ATTR.requestId}=${requestId}`);
  search.searchParams.set("limit", "20");
  const found = (await getJson(search, timeoutMs)) as { traces?: Array<{ traceID?: unknown }> };
  const ids = (found.traces ?? []).flatMap((t) => {
    const id = typeof t.traceID === "string" ? hexId(t.traceID.padStart(32, "0"), 16) : undefined;
    return id ? [id] : [];
  });
  const out: SpanRecord[] = [];
  for (const id of ids)
    out.push(...decodeTraces(await getJson(new URL(`${root}/api/traces/${id}`), timeoutMs)));
  return out;
}
