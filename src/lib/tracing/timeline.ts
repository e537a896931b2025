// One request's traces as a timeline for a terminal (`callplane trace`): each trace's id, then its
// spans in tree order (children under their parent, by start), each with its offset from the
// trace's first span, its duration, its service, its name (indented by depth) and a bar.
import type { SpanRecord } from "./otlp-json.js";
import { ATTR } from "./names.js";

export interface TraceView {
  traceId: string;
  /** Its spans, in tree order, each with its depth. */
  spans: Array<SpanRecord & { depth: number }>;
  start: bigint;
  end: bigint;
}

/**
 * The traces that hold a span of `requestId` (a status poll is a trace of its own, so one request
 * may have several), with every span of each, oldest trace first.
 */
export function tracesOfRequest(all: readonly SpanRecord[], requestId: string): TraceView[] {
  const ids = new Set<string>();
  for (const s of all) if (s.attributes[ATTR.requestId] === requestId) ids.add(s.traceId);
  const views: TraceView[] = [];
  for (const traceId of ids) {
    const seen = new Set<string>();
    const spans = all.filter((s) => s.traceId === traceId && !seen.has(s.spanId) && seen.add(s.spanId));
    views.push(treeOrder(traceId, spans));
  }
  return views.sort((a, b) => (a.start < b.start ? -1 : a.start > b.start ? 1 : 0));
}

function byStart(a: SpanRecord, b: SpanRecord): number {
  return a.start < b.start ? -1 : a.start > b.start ? 1 : 0;
}

function treeOrder(traceId: string, spans: SpanRecord[]): TraceView {
  const ids = new Set(spans.map((s) => s.spanId));
  const children = new Map<string, SpanRecord[]>();
  const roots: SpanRecord[] = [];
  for (const s of spans) {
    // a parent not recorded here (the client's own span) makes a root
    if (s.parentSpanId && ids.has(s.parentSpanId)) {
      const list = children.get(s.parentSpanId) ?? [];
      list.push(s);
      children.set(s.parentSpanId, list);
    } else roots.push(s);
  }
  const out: TraceView["spans"] = [];
  const walk = (s: SpanRecord, depth: number) => {
    out.push({ ...s, depth });
    for (const c of (children.get(s.spanId) ?? []).sort(byStart)) walk(c, depth + 1);
  };
  for (const r of roots.sort(byStart)) walk(r, 0);
  let start = spans[0]?.start ?? 0n;
  let end = spans[0]?.end ?? 0n;
  for (const s of spans) {
    if (s.start < start) start = s.start;
    if (s.end > end) end = s.end;
  }
  return { traceId, spans: out, start, end };
}

/** "0.42 ms", "12.3 ms", "1.24 s" */
export function formatDuration(ns: bigint): string {
  const ms = Number(ns) / 1e6;
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 1000) return `${ms.toFixed(1)} ms`;
  return `${(ms / 1000).toFixed(2)} s`;
}

const BAR = 24;

function bar(view: TraceView, s: SpanRecord): string {
  const total = Number(view.end - view.start) || 1;
  const from = Math.min(BAR - 1, Math.floor((Number(s.start - view.start) / total) * BAR));
  const len = Math.max(1, Math.min(BAR - from, Math.round((Number(s.end - s.start) / total) * BAR)));
  return `|${" ".repeat(from)}${"#".repeat(len)}${" ".repeat(BAR - from - len)}|`;
}

/** The lines that show one trace: its header, a column header, a line per span. */
export function timelineLines(view: TraceView): string[] {
  const services = [...new Set(view.spans.map((s) => s.service))];
  const rows = view.spans.map((s) => {
    const name = `${"  ".repeat(s.depth)}${s.name}${s.status === "error" ? `  [error${s.statusMessage ? `: ${s.statusMessage.slice(0, 80)}` : ""}]` : ""}`;
    return [
      formatDuration(s.start - view.start),
      formatDuration(s.end - s.start),
      s.service,
      bar(view, s),
      name,
    ];
  });
  const header = ["offset", "duration", "service", "timeline", "span"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (r: string[]) =>
    r
      .map((c, i) => (i === r.length - 1 ? c : i < 2 ? c.padStart(widths[i]) : c.padEnd(widths[i])))
      .join("  ")
      .trimEnd();
  return [
    `trace ${view.traceId}  ${formatDuration(view.end - view.start)}, ${view.spans.length} span${view.spans.length === 1 ? "" : "s"}, ${services.join(", ")}`,
    `  ${line(header)}`,
    ...rows.map((r) => `  ${line(r)}`),
  ];
}
