// `callplane trace <request id>`: one request's spans as a timeline in the terminal, so that a user
// without a tracing backend still sees where the time went: each trace's id (a status poll is a
// trace of its own), then each span with its offset, duration, service and name. The spans come
// from the span file the local stack writes (.callplane/traces/spans.jsonl), or from a trace query
// API (Grafana Tempo's) where spans go to a backend.
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Command } from "commander";
// (the modules themselves, not lib/tracing's index: the CLI loads neither NATS nor OpenTelemetry)
import type { SpanRecord } from "../../lib/tracing/otlp-json.js";
import { queryRequestSpans, TraceQueryError } from "../../lib/tracing/query.js";
import { requestSpansInFile } from "../../lib/tracing/span-file.js";
import { timelineLines, tracesOfRequest, type TraceView } from "../../lib/tracing/timeline.js";
import { CliError, usageError } from "../errors.js";
import { UUID } from "../functions.js";
import { printJson, say } from "../output.js";
import { integer } from "../parse.js";
import { settingsFor, tildify, type Settings, type Sourced } from "../settings.js";

interface TraceOptions {
  file?: string;
  queryUrl?: string;
  wait: number;
}

/** Where spans are read from: a span file, or a trace query API. */
type Source = { kind: "file"; where: Sourced } | { kind: "query"; where: Sourced };

function sourceOf(o: TraceOptions, s: Settings): Source {
  if (o.file) return { kind: "file", where: { value: resolve(o.file), from: "--file" } };
  if (o.queryUrl) return { kind: "query", where: { value: o.queryUrl, from: "--query-url" } };
  const env = process.env.CALLPLANE_TRACE_QUERY_URL?.trim();
  if (env) return { kind: "query", where: { value: env, from: "CALLPLANE_TRACE_QUERY_URL" } };
  const t = s.stack?.tracing;
  if (t?.file)
    return { kind: "file", where: { value: t.file, from: `tracing.file in ${tildify(s.stackFile)}` } };
  if (t?.queryUrl)
    return {
      kind: "query",
      where: { value: t.queryUrl, from: `tracing.queryUrl in ${tildify(s.stackFile)}` },
    };
  // a stack that has stopped (stack.json is gone) leaves its spans where it wrote them
  const local = join(resolve(s.stackFile, ".."), "traces", "spans.jsonl");
  if (existsSync(local)) return { kind: "file", where: { value: local, from: "the local stack's folder" } };
  throw new CliError("there is no span file or trace query API to read spans from", "TRACE_SOURCE_MISSING", {
    hint: "run it in the folder of a stack started with `npm start` (it writes .callplane/traces/spans.jsonl), or pass --file <span file> or --query-url <Tempo URL>",
  });
}

async function read(src: Source, requestId: string): Promise<SpanRecord[]> {
  if (src.kind === "file") return requestSpansInFile(src.where.value, requestId);
  try {
    return await queryRequestSpans(src.where.value, requestId);
  } catch (err) {
    if (err instanceof TraceQueryError)
      throw new CliError(err.message, "TRACE_QUERY_FAILED", {
        hint: `the URL came from ${src.where.from}; it must be a Tempo-compatible query API (/api/search, /api/traces)`,
      });
    throw err;
  }
}

/** The request's traces, waiting up to `waitMs` for its spans (they are written about a second after they end). */
async function find(src: Source, requestId: string, waitMs: number): Promise<TraceView[]> {
  const until = Date.now() + waitMs;
  for (;;) {
    const views = tracesOfRequest(await read(src, requestId), requestId);
    if (views.length || Date.now() >= until) {
      // spans of the last second may still be on their way: once more, after one export interval
      if (views.length && waitMs > 0 && Date.now() - Number(views.at(-1)!.end / 1_000_000n) < 2000) {
        await sleep(1200);
        return tracesOfRequest(await read(src, requestId), requestId);
      }
      return views;
    }
    await sleep(250);
  }
}

function asJson(views: TraceView[]) {
  return views.map((v) => ({
    traceId: v.traceId,
    durationMs: Number(v.end - v.start) / 1e6,
    spans: v.spans.map((s) => ({
      spanId: s.spanId,
      parentSpanId: s.parentSpanId ?? null,
      name: s.name,
      kind: s.kind,
      service: s.service,
      offsetMs: Number(s.start - v.start) / 1e6,
      durationMs: Number(s.end - s.start) / 1e6,
      depth: s.depth,
      status: s.status,
      ...(s.statusMessage ? { statusMessage: s.statusMessage } : {}),
      attributes: s.attributes,
    })),
  }));
}

export function registerTrace(program: Command): void {
  program
    .command("trace")
    .description(
      "show one request's spans as a timeline: each trace's id, each span's offset, duration, service and name",
    )
    .argument(
      "<request-id>",
      "the request id (the NVCF-REQID header of its answer, or a gRPC call's nvcf-reqid)",
    )
    .option("--file <path>", "read this span file (default: tracing.file in ./.callplane/stack.json)")
    .option(
      "--query-url <url>",
      "read from this Tempo-compatible query API (default: CALLPLANE_TRACE_QUERY_URL)",
    )
    .option(
      "--wait <seconds>",
      "wait up to this long for the request's spans to be written",
      integer(0, 600),
      5,
    )
    .addHelpText(
      "after",
      `
Spans are written about a second after they end; the stack started by \`npm start\` writes them to
.callplane/traces/spans.jsonl (observability.tracing in docs/configuration.md). A status poll is a
trace of its own: a request answered after a 202 shows one trace per poll besides its own.
Exits 1 when the request has no span.`,
    )
    .action(async (requestId: string, o: TraceOptions, cmd: Command) => {
      const s = settingsFor(cmd);
      if (!UUID.test(requestId))
        throw usageError(`"${requestId}" is not a request id (a UUID, from the NVCF-REQID header)`);
      const id = requestId.toLowerCase();
      const src = sourceOf(o, s);
      if (src.kind === "query") {
        try {
          new URL(src.where.value);
        } catch {
          throw usageError(`${src.where.from} is "${src.where.value}", which is not a URL`);
        }
      }
      const views = await find(src, id, o.wait * 1000);
      if (!views.length)
        throw new CliError(`no span of request ${id} in ${tildify(src.where.value)}`, "TRACE_NOT_FOUND", {
          hint: "tracing may be off where it ran (observability.tracing.enabled), the request not sampled (observability.tracing.sampleRatio), or older than the span file (it keeps about 64 MiB)",
        });
      if (s.json) {
        printJson({ requestId: id, traces: asJson(views) });
        return;
      }
      views.forEach((v, i) => {
        if (i > 0) say("");
        for (const line of timelineLines(v)) say(line);
      });
    });
}
