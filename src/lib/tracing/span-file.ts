// The span file: where a stack without a tracing backend keeps its spans (`npm start` writes
// <data>/traces/spans.jsonl), for `callplane trace` to show. Each export of each service is one
// line, appended with O_APPEND in a single write, so the services' lines never interleave:
//   {"v":1,"resource":{"service.name":...},"spans":[{"traceId","spanId","parentSpanId","name",
//    "kind","start","end","attributes","status","statusMessage","links":[[traceId,spanId]]}]}
// (kind and status as the OpenTelemetry API numbers them, times in ns since the epoch as strings).
// Not OTLP/JSON: its key-value attribute lists made each span half as large again and twice as
// slow to write, measured, and every recorded span of every service is written. Past MAX_BYTES the
// file moves to <file>.1 (the one before is dropped) and a new one begins; the reader reads both.
//
// A file rather than a small OTLP receiver in the stack: no port to pick and keep free, no process
// that must be up before the services and stay up after them, and spans written while the stack
// stops (each service flushes on its way out) are kept.
import { mkdir, open, rename, stat, type FileHandle } from "node:fs/promises";
import { existsSync, readFileSync } from "node:fs";
import { dirname } from "node:path";
import type { HrTime } from "@opentelemetry/api";
import type { ExportResult } from "@opentelemetry/core";
import type { ReadableSpan, SpanExporter } from "@opentelemetry/sdk-trace";
import { decodeTraces, type AttrValue, type SpanKindName, type SpanRecord } from "./otlp-json.js";

const MAX_BYTES = 64 * 1024 * 1024;

/** HrTime ([seconds, nanoseconds]) as a decimal string of nanoseconds, without a BigInt. */
function nanos(t: HrTime): string {
  return t[0] === 0 ? String(t[1]) : `${t[0]}${String(t[1]).padStart(9, "0")}`;
}

interface LineSpan {
  traceId: string;
  spanId: string;
  parentSpanId: string | undefined;
  name: string;
  kind: number;
  start: string;
  end: string;
  attributes: object;
  status: number;
  statusMessage: string | undefined;
  links: Array<[string, string]> | undefined;
}

/** One export as a line of the span file (see above); the spans' attribute objects are written as they are. */
export function spanLines(spans: readonly ReadableSpan[]): string {
  let out = "";
  for (let i = 0; i < spans.length;) {
    // one line per resource (one service's spans share theirs)
    const resource = spans[i].resource;
    const list: LineSpan[] = [];
    for (; i < spans.length && spans[i].resource === resource; i++) {
      const s = spans[i];
      const c = s.spanContext();
      list.push({
        traceId: c.traceId,
        spanId: c.spanId,
        parentSpanId: s.parentSpanContext?.spanId,
        name: s.name,
        kind: s.kind,
        start: nanos(s.startTime),
        end: nanos(s.endTime),
        attributes: s.attributes,
        status: s.status.code,
        statusMessage: s.status.message || undefined,
        links: s.links.length ? s.links.map((l) => [l.context.traceId, l.context.spanId]) : undefined,
      });
    }
    out += `${JSON.stringify({ v: 1, resource: resource.attributes, spans: list })}\n`;
  }
  return out;
}

const KINDS: SpanKindName[] = ["internal", "server", "client", "producer", "consumer"];
const STATUS: Array<SpanRecord["status"]> = ["unset", "ok", "error"];

function isAttr(v: unknown): v is AttrValue {
  return (
    typeof v === "string" ||
    typeof v === "number" ||
    typeof v === "boolean" ||
    (Array.isArray(v) && v.every(isAttr))
  );
}

/** The spans of one line of the span file (or of an OTLP/JSON export, which older files hold). */
export function decodeSpanLine(doc: unknown): SpanRecord[] {
  const d = doc as { v?: unknown; resource?: Record<string, unknown>; spans?: unknown };
  if (d?.v !== 1) return decodeTraces(doc);
  const service = typeof d.resource?.["service.name"] === "string" ? d.resource["service.name"] : "?";
  if (!Array.isArray(d.spans)) return [];
  const out: SpanRecord[] = [];
  for (const s of d.spans as Array<Partial<LineSpan>>) {
    if (typeof s.traceId !== "string" || typeof s.spanId !== "string") continue;
    const attributes: Record<string, AttrValue> = {};
    for (const [k, v] of Object.entries(s.attributes ?? {})) if (isAttr(v)) attributes[k] = v;
    let start = 0n;
    let end = 0n;
    try {
      start = BigInt(s.start ?? 0);
      end = BigInt(s.end ?? 0);
    } catch {
      // a time that is not a number: shown at 0
    }
    out.push({
      traceId: s.traceId,
      spanId: s.spanId,
      parentSpanId: typeof s.parentSpanId === "string" ? s.parentSpanId : undefined,
      name: typeof s.name === "string" ? s.name : "?",
      kind: KINDS[s.kind ?? -1] ?? "unspecified",
      service,
      start,
      end,
      attributes,
      status: STATUS[s.status ?? 0] ?? "unset",
      statusMessage: typeof s.statusMessage === "string" ? s.statusMessage : undefined,
      links: Array.isArray(s.links)
        ? s.links.flatMap((l) =>
            Array.isArray(l) && typeof l[0] === "string" && typeof l[1] === "string"
              ? [{ traceId: l[0], spanId: l[1] }]
              : [],
          )
        : [],
    });
  }
  return out;
}

export class SpanFileExporter implements SpanExporter {
  private handle: FileHandle | undefined;
  private writing: Promise<void> = Promise.resolve();

  constructor(
    readonly file: string,
    private readonly maxBytes = MAX_BYTES,
  ) {}

  export(spans: ReadableSpan[], done: (r: ExportResult) => void): void {
    const line = Buffer.from(spanLines(spans));
    // one write at a time from this process, in order
    this.writing = this.writing
      .then(() => this.write(line))
      .then(
        () => done({ code: 0 /* ExportResultCode.SUCCESS */ }),
        (err: unknown) => done({ code: 1 /* ExportResultCode.FAILED */, error: err as Error }),
      );
  }

  /**
   * The file stays open between exports (opening and closing it for each one cost six times the
   * write, measured); it is opened again when another service has moved it away (rotated it).
   */
  private async write(line: Buffer): Promise<void> {
    let fh = this.handle;
    if (fh) {
      const [onDisk, open] = await Promise.all([stat(this.file).catch(() => undefined), fh.stat()]);
      if (!onDisk || onDisk.ino !== open.ino || open.size > this.maxBytes) {
        // past the limit: this one moves it (a rename of a file another service moved fails, harmlessly)
        if (onDisk?.ino === open.ino) await rename(this.file, `${this.file}.1`).catch(() => undefined);
        await fh.close().catch(() => undefined);
        fh = this.handle = undefined;
      }
    }
    if (!fh) {
      await mkdir(dirname(this.file), { recursive: true, mode: 0o700 });
      // spans name requests, paths and addresses: readable by the stack's user only
      fh = this.handle = await open(this.file, "a", 0o600);
    }
    // one write() with O_APPEND: the services' lines never interleave (a short write, which a
    // regular file gives only when the disk is full, is finished by a second one)
    let at = 0;
    while (at < line.length) at += (await fh.write(line, at)).bytesWritten;
  }

  async forceFlush(): Promise<void> {
    await this.writing;
  }

  async shutdown(): Promise<void> {
    await this.writing;
    await this.handle?.close().catch(() => undefined);
    this.handle = undefined;
  }
}

/**
 * The spans of one request's traces in a span file (and the one it rotated to `.1`), without
 * parsing the rest: the lines that name the request are found by a byte search of the file, the
 * trace ids in them, then the lines of those traces (the spans of other services in the same traces
 * need not name the request). A full file (128 MiB with its `.1`) is searched in tens of ms where
 * parsing it all would take seconds: this is what `callplane trace` and the console's request page
 * read.
 */
export function requestSpansInFile(file: string, requestId: string): SpanRecord[] {
  const buffers = [`${file}.1`, file].filter((f) => existsSync(f)).map((f) => readFileSync(f));
  const linesWith = (needle: string, seen: Set<number>[]): SpanRecord[] => {
    const out: SpanRecord[] = [];
    const n = Buffer.from(needle);
    buffers.forEach((b, i) => {
      let from = 0;
      for (let at = b.indexOf(n, from); at !== -1; at = b.indexOf(n, from)) {
        const start = b.lastIndexOf(10, at) + 1;
        const nl = b.indexOf(10, at);
        const end = nl === -1 ? b.length : nl;
        if (!seen[i].has(start)) {
          seen[i].add(start);
          out.push(...decodeLine(b.toString("utf8", start, end)));
        }
        // the rest of this line is read already: on from the next
        from = end + 1;
      }
    });
    return out;
  };
  const seen = buffers.map(() => new Set<number>());
  const spans = linesWith(requestId, seen);
  for (const traceId of new Set(spans.map((s) => s.traceId))) spans.push(...linesWith(traceId, seen));
  return spans;
}

function decodeLine(line: string): SpanRecord[] {
  try {
    return decodeSpanLine(JSON.parse(line));
  } catch {
    // a line cut short (a service killed mid-write, the disk full): the rest still reads
    return [];
  }
}

/** Every span in a span file (and the one it rotated to `.1`); lines that do not parse are skipped. */
export function readSpanFile(file: string): SpanRecord[] {
  const out: SpanRecord[] = [];
  for (const f of [`${file}.1`, file]) {
    if (!existsSync(f)) continue;
    for (const line of readFileSync(f, "utf8").split("\n")) if (line) out.push(...decodeLine(line));
  }
  return out;
}
