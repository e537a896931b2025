// One work message, from pull to ack (contract §3.5). The worker calls the inference server with
// the request (inline bytes first, then the rest streamed from the replica), and answers the
// replica with the framed response. In NVCF's compatibility mode (every request but SSE) it races
// the inference call against the poll window and a progress file: whichever comes first is
// answered, a 202 with the latest partial response when the answer is not ready. After a 202 the
// client polls; each poll brings a fresh response token (and possibly another replica) and gets
// the next 202 or the final answer. A request whose client stops polling is cancelled.
import { fromBinary, type MessageShape } from "@bufbuild/protobuf";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { readFile, stat } from "node:fs/promises";
import { STATUS_CODES } from "node:http";
import { join } from "node:path";
import { Readable } from "node:stream";
import type { Dispatcher, Pool } from "undici";
import { WorkerInvokeFunctionRequestSchema } from "../../gen/nvcf/worker_pb.js";
import { serializeResponseHead } from "../../lib/h1.js";
import { prepend } from "../../lib/stream.js";
import { endToEnd, endToEndHeaders, foldPairs } from "../../lib/headers.js";
import type { Logger } from "../../lib/log.js";
import { subjects } from "../../lib/queue.js";
import type { CallbackClient, CallbackTarget } from "./callback.js";
import type { WorkerConfig } from "./config.js";
import type { OutputSlot } from "./output-slot.js";

type WorkRequest = MessageShape<typeof WorkerInvokeFunctionRequestSchema>;

/** Headers the worker sets itself; a client's copies are dropped (contract §3.5). */
const WORKER_OWNED = new Set(
  [
    "nvcf-reqid",
    "nvcf-sub",
    "nvcf-ncaid",
    "nvcf-function-name",
    "nvcf-function-id",
    "nvcf-function-version-id",
    "nvcf-asset-dir",
    "nvcf-large-output-dir",
    "nvcf-max-response-size-bytes",
    "nvcf-nspectid",
    "nvcf-backend",
    "nvcf-instancetype",
    "nvcf-region",
    "nvcf-env",
    "nvcf-function-asset-ids",
    "nvcf-poll-seconds",
    "host",
  ].map((h) => h),
);

/**
 * Client headers that end at the replica. `Expect: 100-continue` was met there (the replica's HTTP
 * server sent the 100 before reading the body), and the worker already has the body in hand; undici
 * also refuses any Expect header (NotSupportedError), which made every `curl --data-binary` upload
 * over 1 MiB (curl adds the header above that size) a 502.
 */
const ENDS_AT_REPLICA = new Set(["expect"]);
const DROPPED_TO_INFERENCE = new Set([...WORKER_OWNED, ...ENDS_AT_REPLICA]);

const ERROR_BODY_LIMIT = 64 * 1024;
const SMALL_BODY = 64 * 1024;
const PROGRESS_CHECK_MS = 250;

export interface WorkDeps {
  cfg: WorkerConfig;
  logger: Logger;
  callbacks: CallbackClient;
  inference: Pool;
  nc: NatsConnection;
}

export type WorkOutcome = "answered" | "cancelled" | "failed" | "abandoned";

interface Progress {
  percent: number | undefined;
  partial: unknown;
}

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

/** How many superseded polls of one request wait at most; past it the oldest is answered at once. */
const MAX_SUPERSEDED = 16;

export class WorkItem {
  readonly requestId: string;
  readonly abort = new AbortController();
  private target: CallbackTarget | undefined;
  private deadline: number;
  /**
   * Polls that a newer poll of the same request superseded (a client polling on two replicas, or
   * retrying before its last poll ended). Each still gets an answer: a 202 at its own deadline or
   * at the next progress, and a 202 when the newest poll takes the final answer, so that none
   * waits out its window for nothing, and none is answered at once (two pollers would then answer
   * each other's polls in a loop).
   */
  private superseded: Array<{ target: CallbackTarget; deadline: number }> = [];
  private giveUpAt = Infinity;
  private readonly pollSeconds: number;
  private readonly compat: boolean;
  private wake: (() => void) | undefined;
  /** Set by notify(); cleared at the top of each pass, so a wakeup between a check and the sleep is not lost. */
  private signaled = false;
  private pollSub: Subscription | undefined;
  private progress: Progress | undefined;
  private progressUnreported = false;
  private progressMtime = 0;
  private nextProgressCheck = 0;
  private inferenceResult: { ok: Dispatcher.ResponseData } | { err: unknown } | undefined;

  constructor(
    private readonly deps: WorkDeps,
    private readonly req: WorkRequest,
    /** An empty folder for NVCF-LARGE-OUTPUT-DIR (the agent reuses one per concurrency slot). */
    private readonly slot: OutputSlot | undefined,
  ) {
    this.requestId = req.requestId;
    const headers = new Map(req.requestHeaders.map((h) => [h.key.toLowerCase(), h.value]));
    const poll = Number(headers.get("nvcf-poll-seconds"));
    this.pollSeconds = Number.isFinite(poll) && poll > 0 ? poll : 60;
    this.compat = headers.get("accept") !== "text/event-stream";
    const requestTime = req.requestTime ? timestampMs(req.requestTime) : Date.now();
    this.deadline = requestTime + this.pollSeconds * 1000;
  }

  static decode(data: Uint8Array): WorkRequest {
    return fromBinary(WorkerInvokeFunctionRequestSchema, data);
  }

  private notify = (): void => {
    this.signaled = true;
    const w = this.wake;
    this.wake = undefined;
    w?.();
  };

  async run(): Promise<WorkOutcome> {
    const { logger } = this.deps;
    const cfg = this.req.statelessConfig?.connectionConfigs[0]?.config;
    if (cfg?.case !== "http1Config") {
      logger.error(
        { requestId: this.requestId },
        "the work message has neither an HTTP callback configuration (statelessConfig) nor a gRPC one (statefulConfig)",
      );
      return "failed";
    }
    const http1 = cfg.value;
    this.target = {
      targetUri: http1.targetURI,
      token: http1.responseAuthorizationToken,
      proxyUri: http1.proxyURI,
    };
    const abortListener = () => this.notify();
    this.abort.signal.addEventListener("abort", abortListener);
    // With a watched folder, a write wakes us; otherwise look for a progress file now and then.
    this.nextProgressCheck = this.slot?.watched ? Infinity : Date.now() + PROGRESS_CHECK_MS;
    if (this.slot && this.compat) {
      this.slot.onChange = () => {
        this.nextProgressCheck = 0;
        this.notify();
      };
    }
    try {
      const call = this.callInference(http1.targetURI, http1.requestAuthorizationToken, http1.proxyURI);
      call.then(
        (ok) => {
          this.inferenceResult = { ok };
          this.notify();
        },
        (err: unknown) => {
          this.inferenceResult = { err };
          this.notify();
        },
      );
      for (;;) {
        this.signaled = false;
        if (this.abort.signal.aborted) {
          this.discardInference();
          return "cancelled";
        }
        const now = Date.now();
        this.answerSuperseded(now);
        if (this.inferenceResult && this.target) return await this.sendFinal(this.target);
        if (this.compat && this.target && !this.inferenceResult) {
          if (now >= this.nextProgressCheck) {
            this.nextProgressCheck = this.slot?.watched ? Infinity : now + PROGRESS_CHECK_MS;
            await this.checkProgress();
          }
          if (this.progressUnreported || now >= this.deadline) {
            await this.sendInProgress(this.target);
            continue;
          }
        }
        if (!this.target && now >= this.giveUpAt) {
          logger.info(
            { requestId: this.requestId },
            "no status poll came for the in-progress request: cancelling it",
          );
          this.abort.abort();
          this.discardInference();
          return "abandoned";
        }
        // asleep until the next thing due: the poll's deadline, the next look for a progress file
        // (none with a watched folder: a write wakes us), a superseded poll's deadline. Waking
        // every PROGRESS_CHECK_MS regardless cost a worker 45 ms of CPU a second per 1,000
        // requests held in progress.
        let waitMs = this.target
          ? this.compat && !this.inferenceResult
            ? Math.min(this.nextProgressCheck - now, this.deadline - now)
            : 60_000
          : this.giveUpAt - now;
        for (const s of this.superseded) waitMs = Math.min(waitMs, s.deadline - now);
        waitMs = Math.max(1, Math.min(waitMs, 60_000));
        if (this.signaled) continue;
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, waitMs);
          this.wake = () => {
            clearTimeout(t);
            resolve();
          };
        });
      }
    } finally {
      this.abort.signal.removeEventListener("abort", abortListener);
      this.pollSub?.unsubscribe();
      // however it ended, no superseded poll is left waiting for an answer that will not come
      this.answerSuperseded(Infinity);
    }
  }

  /** Answers, with a 202 carrying the progress as it stands, the superseded polls now due. */
  private answerSuperseded(now: number): void {
    if (!this.superseded.length) return;
    const all = this.progressUnreported || this.inferenceResult !== undefined;
    const due = all ? this.superseded : this.superseded.filter((s) => now >= s.deadline);
    if (!due.length) return;
    this.superseded = all ? [] : this.superseded.filter((s) => now < s.deadline);
    const message = this.inProgressMessage();
    for (const s of due) void this.post(s.target, message, message.length);
  }

  private discardInference(): void {
    if (this.inferenceResult && "ok" in this.inferenceResult) this.inferenceResult.ok.body.destroy();
  }

  private inferenceHeaders(): Record<string, string | string[]> {
    const { cfg } = this.deps;
    const req = this.req;
    const out: Record<string, string | string[]> = foldPairs(
      endToEnd(
        req.requestHeaders,
        (h) => h.key,
        (h) => h.value,
        { drop: DROPPED_TO_INFERENCE },
      ).map((h) => [h.key, h.value] as const),
    );
    const remaining = Math.max(0, Math.floor((this.deadline - Date.now()) / 1000));
    out["nvcf-reqid"] = req.requestId;
    out["nvcf-sub"] = req.subject;
    out["nvcf-ncaid"] = req.ncaId || cfg.ncaId;
    out["nvcf-function-name"] = cfg.functionName;
    out["nvcf-function-id"] = cfg.functionId;
    out["nvcf-function-version-id"] = cfg.functionVersionId;
    out["nvcf-instancetype"] = cfg.instanceType;
    out["nvcf-region"] = cfg.region;
    out["nvcf-backend"] = "callplane-local";
    out["nvcf-max-response-size-bytes"] = String(req.maxDirectResponseSizeBytes);
    out["nvcf-poll-seconds"] = String(remaining);
    if (this.slot && this.compat) out["nvcf-large-output-dir"] = this.slot.dir;
    if (this.compat && out["content-type"] === undefined) out["content-type"] = "application/json";
    return out;
  }

  private callInference(
    targetUri: string,
    requestToken: string | undefined,
    proxyUri: string | undefined,
  ): Promise<Dispatcher.ResponseData> {
    const { inference, callbacks } = this.deps;
    const req = this.req;
    if (!req.requestMethod) {
      return Promise.reject(
        new WorkerError(
          501,
          "the request asks for full-request streaming (no method in the work message), which this worker does not support",
        ),
      );
    }
    const headers = this.inferenceHeaders();
    const inline = req.requestBody
      ? Buffer.from(req.requestBody.buffer, req.requestBody.byteOffset, req.requestBody.byteLength)
      : undefined;
    let body: Buffer | Readable | undefined;
    if (requestToken) {
      const signal = this.abort.signal;
      body = prepend(inline, async () => {
        const r = await callbacks.fetchBody({ targetUri, token: requestToken, proxyUri }, signal);
        if (r.statusCode !== 200) {
          const text = await r.body.text().catch(() => "");
          throw new WorkerError(
            502,
            `the replica refused to hand over the request body (${r.statusCode} ${text.slice(0, 200)})`,
          );
        }
        return r.body;
      });
    } else if (inline?.length) {
      body = inline;
      headers["content-length"] = String(inline.length);
    } else {
      delete headers["content-length"];
    }
    return inference.request({
      method: req.requestMethod,
      path: req.requestPath || "/",
      headers,
      body: body ?? null,
      signal: this.abort.signal,
      // a long inference may take its time to answer (the poll window covers that); once it has,
      // a body that stops for inferenceIdleMs is cut, so its client gets an error, not a hang
      headersTimeout: 0,
      bodyTimeout: this.deps.cfg.inferenceIdleMs,
    });
  }

  private async checkProgress(): Promise<void> {
    if (!this.slot || !this.compat) return;
    const file = join(this.slot.dir, "progress");
    let mtime: number;
    try {
      mtime = (await stat(file)).mtimeMs;
    } catch {
      return;
    }
    if (mtime <= this.progressMtime) return;
    this.progressMtime = mtime;
    try {
      const p = JSON.parse(await readFile(file, "utf8")) as {
        id?: string;
        progress?: number;
        partialResponse?: unknown;
      };
      if (p.id !== undefined && p.id !== this.requestId) return;
      this.progress = {
        percent: typeof p.progress === "number" ? Math.max(0, Math.min(100, p.progress)) : undefined,
        partial: p.partialResponse,
      };
      this.progressUnreported = true;
    } catch (err) {
      this.deps.logger.debug(
        { requestId: this.requestId, err: (err as Error).message },
        "progress file is not valid JSON yet",
      );
    }
  }

  /** A framed 202 with the progress as it stands: the partial response and the percentage. */
  private inProgressMessage(): Buffer {
    const body =
      this.progress?.partial !== undefined
        ? Buffer.from(JSON.stringify(this.progress.partial))
        : Buffer.alloc(0);
    const headers: Array<[string, string]> = [];
    if (body.length) headers.push(["Content-Type", "application/json"]);
    if (this.progress?.percent !== undefined)
      headers.push(["NVCF-PERCENT-COMPLETE", String(this.progress.percent)]);
    headers.push(["Content-Length", String(body.length)]);
    return Buffer.concat([serializeResponseHead(202, headers), body]);
  }

  private async sendInProgress(target: CallbackTarget): Promise<void> {
    const message = this.inProgressMessage();
    this.progressUnreported = false;
    this.target = undefined;
    // polls may come only after the client has seen this 202, so listen before sending it
    this.listenForPolls();
    this.giveUpAt = Date.now() + Math.max(2 * this.pollSeconds, 10) * 1000;
    await this.post(target, message, message.length);
  }

  private listenForPolls(): void {
    if (this.pollSub) return;
    this.pollSub = this.deps.nc.subscribe(subjects.polling(this.deps.cfg.functionVersionId, this.requestId), {
      callback: (err, m) => {
        if (err) return;
        let poll: WorkRequest;
        try {
          poll = WorkItem.decode(m.data);
        } catch {
          this.deps.logger.warn({ requestId: this.requestId }, "undecodable status poll");
          return;
        }
        const cfg = poll.statelessConfig?.connectionConfigs[0]?.config;
        if (cfg?.case !== "http1Config") return;
        // a poll still waiting is superseded by this one; it is answered later (see superseded)
        if (this.target) {
          this.superseded.push({ target: this.target, deadline: this.deadline });
          if (this.superseded.length > MAX_SUPERSEDED) {
            const oldest = this.superseded.shift()!;
            const message = this.inProgressMessage();
            void this.post(oldest.target, message, message.length);
          }
        }
        this.target = {
          targetUri: cfg.value.targetURI,
          token: cfg.value.responseAuthorizationToken,
          proxyUri: cfg.value.proxyURI,
        };
        const seconds = Number(
          poll.requestHeaders.find((h) => h.key.toLowerCase() === "nvcf-poll-seconds")?.value,
        );
        const pollTime = poll.requestTime ? timestampMs(poll.requestTime) : Date.now();
        this.deadline = pollTime + (Number.isFinite(seconds) && seconds > 0 ? seconds : 60) * 1000;
        this.giveUpAt = Infinity;
        m.respond();
        this.notify();
      },
    });
  }

  private async sendFinal(target: CallbackTarget): Promise<WorkOutcome> {
    this.target = undefined;
    // No poll is taken from here on: one acknowledged while the final answer is being posted would
    // have no answer left to get and wait out its whole window (a 504). Unacknowledged, it finds no
    // responder and its client a final 404, as the final answer is delivered once.
    this.pollSub?.unsubscribe();
    this.pollSub = undefined;
    const result = this.inferenceResult!;
    if ("err" in result) {
      if (this.abort.signal.aborted) return "cancelled";
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
    if (this.compat && r.statusCode >= 400) {
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
    if (contentLength !== undefined && contentLength <= SMALL_BODY) {
      // A small answer of known size goes out in one write: head and body together. Reading at most
      // SMALL_BODY bytes keeps memory bounded; larger or open-ended answers stream below.
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

  private async post(
    target: CallbackTarget,
    body: Readable | Buffer,
    length: number | undefined,
    onFail?: () => void,
  ): Promise<void> {
    try {
      let res;
      try {
        res = await this.deps.callbacks.postResponse(target, body, length, this.abort.signal);
      } catch (err) {
        // A kept-alive connection that its server (a draining proxy or replica) closed just as
        // this answer went out on it: the answer was never read. One in memory is sent again, on a
        // new connection; its single-use token makes a second delivery impossible.
        if (!(body instanceof Buffer) || this.abort.signal.aborted || !closedUnanswered(err)) throw err;
        res = await this.deps.callbacks.postResponse(target, body, length, this.abort.signal);
      }
      const text = await res.body.text();
      if (res.statusCode !== 200) {
        this.deps.logger.warn(
          {
            requestId: this.requestId,
            status: res.statusCode,
            answer: text.slice(0, 300),
            target: target.targetUri,
          },
          "the replica did not take the response",
        );
      }
    } catch (err) {
      if (body instanceof Readable) body.destroy();
      onFail?.();
      // after a cancel (the client left mid-stream) the post is cut on purpose
      this.deps.logger[this.abort.signal.aborted ? "debug" : "warn"](
        { requestId: this.requestId, err: (err as Error).message, target: target.targetUri },
        "posting the response to the replica failed",
      );
    }
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

export class WorkerError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = "WorkerError";
  }
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
