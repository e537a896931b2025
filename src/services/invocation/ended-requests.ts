// How the last requests a replica held ended, so the operator console can answer "what happened to
// request X" after the request is gone (services/invocation/console-report.ts). A ring of fixed
// size: the newest overwrites the oldest. Its columns are arrays made with the ring, so recording
// an end is a few writes of values the request already has (its id, its function's ids, the code
// and message of the error it got), never a new object per request.
import type { InvocationOutcome } from "./outcome.js";
import type { WorkerContact } from "./worker-seen.js";

export const ENDED_REQUESTS = 10_000;

export interface EndedRequest {
  requestId: string;
  functionId: string;
  versionId: string;
  outcome: InvocationOutcome;
  /** The status the client got; 0 when none went out. */
  status: number;
  code: string | undefined;
  detail: string | undefined;
  durationMs: number;
  endedAt: number;
  /** The worker's last contact about it (the request's own record of it, kept by reference). */
  worker: WorkerContact | undefined;
}

export class EndedRequests {
  private readonly ids: Array<string | undefined>;
  private readonly functionIds: string[];
  private readonly versionIds: string[];
  private readonly outcomes: InvocationOutcome[];
  private readonly codes: Array<string | undefined>;
  private readonly details: Array<string | undefined>;
  private readonly statuses: Uint16Array;
  private readonly durations: Float64Array;
  private readonly ends: Float64Array;
  private readonly workers: Array<WorkerContact | undefined>;
  /** The slot the next end is written to. */
  private next = 0;

  constructor(readonly capacity = ENDED_REQUESTS) {
    this.ids = new Array<string | undefined>(capacity).fill(undefined);
    this.functionIds = new Array<string>(capacity).fill("");
    this.versionIds = new Array<string>(capacity).fill("");
    this.outcomes = new Array<InvocationOutcome>(capacity).fill("answered");
    this.codes = new Array<string | undefined>(capacity).fill(undefined);
    this.details = new Array<string | undefined>(capacity).fill(undefined);
    this.statuses = new Uint16Array(capacity);
    this.durations = new Float64Array(capacity);
    this.ends = new Float64Array(capacity);
    this.workers = new Array<WorkerContact | undefined>(capacity).fill(undefined);
  }

  record(
    requestId: string,
    functionId: string,
    versionId: string,
    outcome: InvocationOutcome,
    status: number,
    code: string | undefined,
    detail: string | undefined,
    durationMs: number,
    endedAt: number,
    worker?: WorkerContact,
  ): void {
    const i = this.next;
    this.next = i + 1 === this.capacity ? 0 : i + 1;
    this.ids[i] = requestId;
    this.functionIds[i] = functionId;
    this.versionIds[i] = versionId;
    this.outcomes[i] = outcome;
    this.statuses[i] = status;
    this.codes[i] = code;
    this.details[i] = detail;
    this.durations[i] = durationMs;
    this.ends[i] = endedAt;
    this.workers[i] = worker;
  }

  /**
   * The latest end of a request, or undefined when it is not among the last `capacity`. A linear
   * search from the newest: asked by an operator now and then, it costs the hot path no index.
   */
  find(requestId: string): EndedRequest | undefined {
    for (let n = 0, i = this.next; n < this.capacity; n++) {
      i = i === 0 ? this.capacity - 1 : i - 1;
      const id = this.ids[i];
      if (id === undefined) return undefined;
      if (id !== requestId) continue;
      return {
        requestId,
        functionId: this.functionIds[i],
        versionId: this.versionIds[i],
        outcome: this.outcomes[i],
        status: this.statuses[i],
        code: this.codes[i],
        detail: this.details[i],
        durationMs: this.durations[i],
        endedAt: this.ends[i],
        worker: this.workers[i],
      };
    }
    return undefined;
  }
}
