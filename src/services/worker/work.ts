// One work message, from pull to ack (contract §3.5). The worker calls the inference server with
// the request (inline bytes first, then the rest streamed from the replica), and answers the
// replica with the framed response. In NVCF's compatibility mode (every request but SSE) it races
// the inference call against the poll window and a progress file: whichever comes first is
// answered, a 202 with the latest partial response when the answer is not ready. After a 202 the
// client polls; each poll brings a fresh response token (and possibly another replica) and gets
// the next 202 or the final answer. A request whose client stops polling is cancelled.
//
// This module is the work item's lifecycle: the race above and the status polls. The inference
// call is inference-call.ts, the progress file progress.ts, the answers to the replica
// replica-answer.ts.
import { timestampMs } from "@bufbuild/protobuf/wkt";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type { Pool } from "undici";
import type { Logger } from "../../lib/log.js";
import type { TraceSpan } from "../../lib/tracing/index.js";
import { subjects } from "../../lib/nats/index.js";
import type { CallbackClient, CallbackTarget } from "./callback.js";
import type { WorkerConfig } from "./config.js";
import { callInference, type WorkRequest } from "./inference-call.js";
import type { NatsAnswers } from "./nats-answer.js";
import type { OutputSlot } from "./output-slot.js";
import { ProgressReport } from "./progress.js";
import { decodeWorkMessage } from "./work-decode.js";
import { ReplicaAnswer, type AnswerOutcome, type InferenceResult } from "./replica-answer.js";
import { NVCF_HEADERS } from "../../lib/contract.js";

const PROGRESS_CHECK_MS = 250;

export interface WorkDeps {
  cfg: WorkerConfig;
  logger: Logger;
  callbacks: CallbackClient;
  inference: Pool;
  nc: NatsConnection;
  /** Small answers over NATS (nats-answer.ts); without it every answer is posted. */
  answers?: NatsAnswers | undefined;
  /** The span of this work item (dispatch.ts): its calls are spans under it. */
  trace?: TraceSpan | undefined;
}

export type WorkOutcome = AnswerOutcome | "abandoned";

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
  private readonly progress: ProgressReport;
  private nextProgressCheck = 0;
  private inferenceResult: InferenceResult | undefined;
  private readonly answer: ReplicaAnswer;

  constructor(
    private readonly deps: WorkDeps,
    private readonly req: WorkRequest,
    /** An empty folder for NVCF-LARGE-OUTPUT-DIR (the agent reuses one per concurrency slot). */
    private readonly slot: OutputSlot | undefined,
  ) {
    this.requestId = req.requestId;
    const headers = new Map(req.requestHeaders.map((h) => [h.key.toLowerCase(), h.value]));
    const poll = Number(headers.get(NVCF_HEADERS.pollSeconds));
    this.pollSeconds = Number.isFinite(poll) && poll > 0 ? poll : 60;
    this.compat = headers.get("accept") !== "text/event-stream";
    const requestTime = req.requestTime ? timestampMs(req.requestTime) : Date.now();
    this.deadline = requestTime + this.pollSeconds * 1000;
    this.progress = new ProgressReport(this.requestId, deps.logger);
    this.answer = new ReplicaAnswer(deps, this.requestId, this.abort.signal);
  }

  static decode(data: Uint8Array): WorkRequest {
    return decodeWorkMessage(data);
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
      const call = callInference(
        {
          cfg: this.deps.cfg,
          inference: this.deps.inference,
          callbacks: this.deps.callbacks,
          req: this.req,
          deadline: this.deadline,
          slot: this.slot,
          compat: this.compat,
          signal: this.abort.signal,
          trace: this.deps.trace,
        },
        http1.targetURI,
        http1.requestAuthorizationToken,
        http1.proxyURI,
      );
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
          if (this.progress.unreported || now >= this.deadline) {
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
    const all = this.progress.unreported || this.inferenceResult !== undefined;
    const due = all ? this.superseded : this.superseded.filter((s) => now >= s.deadline);
    if (!due.length) return;
    this.superseded = all ? [] : this.superseded.filter((s) => now < s.deadline);
    const message = this.progress.message();
    for (const s of due) void this.answer.post(s.target, message, message.length);
  }

  private discardInference(): void {
    if (this.inferenceResult && "ok" in this.inferenceResult) this.inferenceResult.ok.body.destroy();
  }

  private async checkProgress(): Promise<void> {
    if (!this.slot || !this.compat) return;
    await this.progress.check(this.slot.dir);
  }

  private async sendInProgress(target: CallbackTarget): Promise<void> {
    const message = this.progress.message();
    this.progress.unreported = false;
    this.target = undefined;
    // polls may come only after the client has seen this 202, so listen before sending it
    this.listenForPolls();
    this.giveUpAt = Date.now() + Math.max(2 * this.pollSeconds, 10) * 1000;
    await this.answer.post(target, message, message.length);
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
            const message = this.progress.message();
            void this.answer.post(oldest.target, message, message.length);
          }
        }
        this.target = {
          targetUri: cfg.value.targetURI,
          token: cfg.value.responseAuthorizationToken,
          proxyUri: cfg.value.proxyURI,
        };
        const seconds = Number(
          poll.requestHeaders.find((h) => h.key.toLowerCase() === NVCF_HEADERS.pollSeconds)?.value,
        );
        const pollTime = poll.requestTime ? timestampMs(poll.requestTime) : Date.now();
        this.deadline = pollTime + (Number.isFinite(seconds) && seconds > 0 ? seconds : 60) * 1000;
        this.giveUpAt = Infinity;
        // the ack names this instance: the polling replica's console shows which worker has it
        m.respond(this.deps.cfg.instanceId);
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
    return await this.answer.final(target, this.inferenceResult!, this.compat);
  }
}
