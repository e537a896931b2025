// The span file: where a stack without a tracing backend keeps its spans (`npm start` writes
// <data>/traces/spans.jsonl), for `callplane trace` to show. Each export of each service is one
// line, an OTLP/JSON ExportTraceServiceRequest (otlp-json.ts), appended with O_APPEND in a single
// write, so the services' lines never interleave. Past MAX_BYTES the file moves to <file>.1 (the
// one before is dropped) and a new one begins; the reader reads both.
//
// A file rather than a small OTLP receiver in the stack: no port to pick and keep free, no process
// that must be up before the services and stay up after them, and spans written while the stack
// stops (each service flushes on its way out) are kept.
import { appendFile, mkdir, rename, stat } from "node:fs/promises";
import { existsSync, readFileSync } from "node:fs";
import { dirname } from "node:path";
import type { ExportResult } from "@opentelemetry/core";
import type { ReadableSpan, SpanExporter } from "@opentelemetry/sdk-trace";
import { decodeTraces, encodeSpans, type SpanRecord } from "./otlp-json.js";

const MAX_BYTES = 64 * 1024 * 1024;

export class SpanFileExporter implements SpanExporter {
  private ready: Promise<unknown> | undefined;
  private writing: Promise<void> = Promise.resolve();

  constructor(
    readonly file: string,
    private readonly maxBytes = MAX_BYTES,
  ) {}

  export(spans: ReadableSpan[], done: (r: ExportResult) => void): void {
    const line = `${JSON.stringify(encodeSpans(spans))}\n`;
    // one write at a time from this process, in order
    this.writing = this.writing
      .then(() => this.write(line))
      .then(
        () => done({ code: 0 /* ExportResultCode.SUCCESS */ }),
        (err: unknown) => done({ code: 1 /* ExportResultCode.FAILED */, error: err as Error }),
      );
  }

  private async write(line: string): Promise<void> {
    this.ready ??= mkdir(dirname(this.file), { recursive: true, mode: 0o700 });
    await this.ready;
    const size = await stat(this.file).then(
      (s) => s.size,
      () => 0,
    );
    // another service may rotate at the same moment: a rename of a file already moved fails, harmlessly
    if (size > this.maxBytes) await rename(this.file, `${this.file}.1`).catch(() => undefined);
    // spans name requests, paths and addresses: readable by the stack's user only
    await appendFile(this.file, line, { mode: 0o600 });
  }

  async forceFlush(): Promise<void> {
    await this.writing;
  }

  async shutdown(): Promise<void> {
    await this.writing;
  }
}

/** Every span in a span file (and the one it rotated to `.1`); lines that do not parse are skipped. */
export function readSpanFile(file: string): SpanRecord[] {
  const out: SpanRecord[] = [];
  for (const f of [`${file}.1`, file]) {
    if (!existsSync(f)) continue;
    for (const line of readFileSync(f, "utf8").split("\n")) {
      if (!line) continue;
      try {
        out.push(...decodeTraces(JSON.parse(line)));
      } catch {
        // a line cut short (a service killed mid-write, the disk full): the rest still reads
      }
    }
  }
  return out;
}
