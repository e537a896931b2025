// Answering the replica that holds a request: each answer (a 202 with progress, the final
// response, or a problem) is one framed HTTP/1 response posted to the replica's request-attach
// endpoint with the poll's single-use token. A small final answer goes out in one write; a large
// or open-ended one streams from the inference server.
import { STATUS_CODES } from "node:http";
import { Readable } from "node:stream";
import type { Dispatcher } from "undici";
import { endToEndHeaders, prepend, serializeResponseHead } from "../../lib/http/index.js";
import type { Logger } from "../../lib/log.js";
import type { TraceSpan } from "../../lib/tracing/index.js";
import type { CallbackClient, CallbackTarget } from "./callback.js";
import type { WorkerConfig } from "./config.js";
import { WorkerError } from "./inference-call.js";
import { SMALL_ANSWER_BYTES, type NatsAnswers, type ReplicaReply } from "./nats-answer.js";

const ERROR_BODY_LIMIT = 64 * 1024;

/** How the final answer ended (a work item may also end "abandoned", before any final answer). */
export type AnswerOutcome = "answered" | "cancelled" | "failed";

/** The inference call's result: its response, or why there is none. */
export type InferenceResult = { ok: Dispatcher.ResponseData } | { err: unknown };

function kebab(status: number): string {
  return (STATUS_CODES[status] ?? "error").toLowerCase().replace(/[^a-z0-9]+/g, "-");
}

export function workerProblem(
  source: "nvcf-worker-service" | "inference-service" | "inference-connection",
  status: number,
  detail: string,
  requestId: string,
): Buffer {
  return Buffer.from(
    JSON.stringify({
      type: `urn:${source}:problem-details:${kebab(status)}`,
      title: STATUS_CODES[status] ?? "Error",
      status,
      detail,
      instance: `/v2/nvcf/pexec/status/${requestId}`,
    }),
  );
}

export class ReplicaAnswer {
  constructor(
    private readonly deps: {
      cfg: WorkerConfig;
      logger: Logger;
      callbacks: CallbackClient;
      /** Answers over NATS, where the replica takes them (else every answer is posted). */
      answers?: NatsAnswers | undefined;
      trace?: TraceSpan | undefined;
    },
    private readonly requestId: string,
    /** The work item's abort signal: a cancel cuts a post on purpose. */
    private readonly signal: AbortSignal,
  ) {}

  /** Posts the final answer: the inference server's response, or a problem saying why there is none. */
  async final(target: CallbackTarget, result: InferenceResult, compat: boolean): Promise<AnswerOutcome> {
    if ("err" in result) {
      if (this.signal.aborted) return "cancelled";
      const err = result.err;
      const status = err instanceof WorkerError ? err.status : 502;
      const source = err instanceof WorkerError ? "nvcf-worker-service" : "inference-connection";
      const detail =
        err instanceof WorkerError
          ? err.message
          : `the inference server at ${this.deps.cfg.inference.host}:${this.deps.cfg.inference.port} could not be reached: ${(err as Error).message}`;
      this.deps.logger.warn(
        { requestId: this.requestId, err: (err as Error).message },
        "inference call failed",
      );
      await this.postProblem(target, status, source, detail);
      return "failed";
    }
    const r = result.ok;
    if (compat && r.statusCode >= 400) {
      const text = await readLimited(r.body, ERROR_BODY_LIMIT);
      let detail = "Inference error";
      try {
        const j = JSON.parse(text) as { error?: unknown };
        if (typeof j.error === "string") detail = j.error;
        else if (j.error !== undefined) detail = JSON.stringify(j.error);
      } catch {
        // not JSON: keep the generic detail
      }
      await this.postProblem(target, r.statusCode, "inference-service", detail);
      return "answered";
    }
    const headers: Array<[string, string]> = [];
    for (const [k, v] of Object.entries(endToEndHeaders(r.headers)))
      for (const one of Array.isArray(v) ? v : [v]) headers.push([k, String(one)]);
    const cl = r.headers["content-length"];
    const contentLength = typeof cl === "string" && /^\d+$/.test(cl) ? Number(cl) : undefined;
    const head = serializeResponseHead(r.statusCode, headers);
    const inner = r.body;
    if (contentLength !== undefined && contentLength <= SMALL_ANSWER_BYTES) {
      // A small answer of known size goes out in one write: head and body together. Reading at most
      // SMALL_ANSWER_BYTES keeps memory bounded; larger or open-ended answers stream below.
      const bytes = Buffer.from(await inner.arrayBuffer());
      await this.post(target, Buffer.concat([head, bytes]), head.length + bytes.length);
      return "answered";
    }
    const body = prepend(head, inner);
    await this.post(target, body, contentLength === undefined ? undefined : head.length + contentLength, () =>
      inner.destroy(),
    );
    return "answered";
  }

  private async postProblem(
    target: CallbackTarget,
    status: number,
    source: Parameters<typeof workerProblem>[0],
    detail: string,
  ): Promise<void> {
    const body = workerProblem(source, status, detail, this.requestId);
    const head = serializeResponseHead(status, [
      ["Content-Type", "application/problem+json"],
      ["Content-Length", String(body.length)],
    ]);
    await this.post(target, Buffer.concat([head, body]), head.length + body.length);
  }

  async post(
    target: CallbackTarget,
    body: Readable | Buffer,
    length: number | undefined,
    onFail?: () => void,
  ): Promise<void> {
    try {
      // an answer held whole goes over NATS where the replica takes it (nats-answer.ts)
      const reply =
        (body instanceof Buffer && (await this.deps.answers?.send(target, body, this.deps.trace))) ||
        (await this.postOverHttp(target, body, length));
      if (reply.status !== 200) {
        this.deps.logger.warn(
          {
            requestId: this.requestId,
            status: reply.status,
            answer: reply.text.slice(0, 300),
            target: target.targetUri,
          },
          "the replica did not take the response",
        );
      }
    } catch (err) {
      if (body instanceof Readable) body.destroy();
      onFail?.();
      // after a cancel (the client left mid-stream) the post is cut on purpose
      this.deps.logger[this.signal.aborted ? "debug" : "warn"](
        { requestId: this.requestId, err: (err as Error).message, target: target.targetUri },
        "posting the response to the replica failed",
      );
    }
  }

  /** POST request-attach (through the callback proxy when there is one). */
  private async postOverHttp(
    target: CallbackTarget,
    body: Readable | Buffer,
    length: number | undefined,
  ): Promise<ReplicaReply> {
    let res;
    try {
      res = await this.deps.callbacks.postResponse(target, body, length, this.signal, this.deps.trace);
    } catch (err) {
      // A kept-alive connection that its server (a draining proxy or replica) closed just as
      // this answer went out on it: the answer was never read. One in memory is sent again, on a
      // new connection; its single-use token makes a second delivery impossible.
      if (!(body instanceof Buffer) || this.signal.aborted || !closedUnanswered(err)) throw err;
      res = await this.deps.callbacks.postResponse(target, body, length, this.signal, this.deps.trace);
    }
    return { status: res.statusCode, text: await res.body.text() };
  }
}

/** A request that failed because its connection closed before any answer came. */
function closedUnanswered(err: unknown): boolean {
  const e = err as { code?: string; message?: string };
  return (
    e.code === "ECONNRESET" ||
    e.code === "EPIPE" ||
    (e.code === "UND_ERR_SOCKET" && /other side closed|socket hang up/.test(e.message ?? ""))
  );
}

async function readLimited(body: Dispatcher.ResponseData["body"], limit: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of body as AsyncIterable<Buffer>) {
    if (size < limit) chunks.push(c.subarray(0, limit - size));
    size += c.length;
  }
  return Buffer.concat(chunks).toString("utf8");
}
