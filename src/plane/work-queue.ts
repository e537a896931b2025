// Putting work on a function version's queue and taking it back: the publish (a duplicate request id
// counts as published; a full queue and a silent JetStream are told apart; a queue that is missing is
// asked of the API, which alone may create queues, once), and the cancel (a broadcast to the
// version's workers, and the removal of the message if no worker took it yet). The invocation
// service and grpc-proxy share it.
import { jetstream, type JetStreamClient } from "@nats-io/jetstream";
import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node";
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import { CallplaneError } from "../lib/errors.js";
import type { Logger } from "../lib/log.js";
import { tracePublish, type TraceSpan } from "../lib/tracing/index.js";
import {
  WorkQueues,
  classifyPublishError,
  publishToStream,
  subjects,
  type QueueLimits,
  type Replies,
} from "../lib/nats/index.js";

/**
 * How a replica asks the control plane to create a version's queue (stream and consumer): the
 * API's internal endpoint, with the replica's service token.
 */
export function askApiForQueue(apiUrl: string, serviceToken: string): (fvid: string) => Promise<void> {
  return async (fvid) => {
    const res = await request(new URL(`/v1/internal/work-queues/${fvid}`, apiUrl), {
      method: "PUT",
      headers: { authorization: `Bearer ${serviceToken}` },
      headersTimeout: 10_000,
      bodyTimeout: 10_000,
    });
    const text = await res.body.text();
    if (res.statusCode >= 300) throw new Error(`the API answered ${res.statusCode}: ${text.slice(0, 300)}`);
  };
}

/** How long a publish to a replicated queue is retried: a leader election on a healthy cluster takes seconds. */
const REPLICATED_RETRY_MS = 15_000;

export class WorkPublisher {
  private readonly js: JetStreamClient;
  private readonly queues: WorkQueues;

  constructor(
    private readonly nc: NatsConnection,
    private readonly region: string,
    private readonly limits: QueueLimits,
    private readonly logger: Logger,
    /** Asks the control plane to create a version's queue (its stream and consumer). */
    private readonly ensureQueue: (fvid: string) => Promise<void>,
    /**
     * The connection's reply inbox (its own prefix): each publish's acknowledgement comes back
     * through it, cheaper than jetstream(nc).publish(); without it, that is used.
     */
    private readonly replies?: Replies,
  ) {
    this.js = jetstream(nc);
    this.queues = new WorkQueues(nc, region, limits);
  }

  /**
   * Puts the request on its version's queue; resolves with the message's stream sequence (what
   * `cancel` removes it by), or undefined when the stream already held a message for the id. With
   * `parent` (the request's span), the publish is a span of its own under it, whose context the
   * message carries in its headers (W3C trace context) to the worker.
   */
  async publish(
    fvid: string,
    requestId: string,
    data: Uint8Array,
    parent?: TraceSpan,
  ): Promise<number | undefined> {
    if (!parent) return this.send(fvid, requestId, data, undefined);
    const { span, headers } = tracePublish(parent, this.region, fvid, requestId, data.length);
    return span.until(this.send(fvid, requestId, data, headers));
  }

  private async send(
    fvid: string,
    requestId: string,
    data: Uint8Array,
    headers: MsgHdrs | undefined,
  ): Promise<number | undefined> {
    // A replicated queue (a NATS cluster) loses its leader when a node goes, and answers nothing
    // (or "no responders") until the others elect a new one, in a few seconds: an unconfirmed
    // publish is sent again for up to REPLICATED_RETRY_MS. Sending again is safe: the stream keeps
    // one message per request id. One server has no one to take over: the first failure is final.
    const retryUntil = this.limits.replicas > 1 ? Date.now() + REPLICATED_RETRY_MS : 0;
    for (let attempt = 0; ; attempt++) {
      try {
        // No Nats-Msg-Id: the stream already keeps one message per subject, and the subject ends in
        // the request id, so a repeated publish is refused as a duplicate (and taken as success
        // below) without a header and a dedupe-window entry on every message.
        const subject = subjects.work(this.region, fvid, requestId);
        return this.replies
          ? (await publishToStream(this.replies, subject, data, undefined, headers)).seq
          : (await this.js.publish(subject, data, headers ? { headers } : undefined)).seq;
      } catch (err) {
        const kind = classifyPublishError(err);
        if (kind === "duplicate") return undefined;
        if (kind === "full") {
          throw new CallplaneError(
            "QUEUE_FULL",
            `the queue of function version ${fvid} is full (${this.limits.maxMessages} waiting requests); retry later or deploy more instances`,
            { cause: err },
          );
        }
        // The API creates every deployed version's queue; one that is missing (removed by hand,
        // a NATS store lost) is asked for again, once.
        if (kind === "no-stream" && attempt === 0) {
          await this.ensureQueue(fvid).catch((e: unknown) =>
            this.logger.warn({ fvid, err: (e as Error).message }, "the API could not create the work queue"),
          );
          continue;
        }
        if (Date.now() < retryUntil && !this.nc.isClosed()) {
          this.logger.debug(
            { requestId, attempt, err: (err as Error).message },
            "publish unconfirmed; again",
          );
          await sleep(Math.min(250 * (attempt + 1), 1000));
          continue;
        }
        // no confirmation is not "not stored": the message may be in the stream (its leader took it
        // and the answer was lost, a NATS cluster changing leaders). The client is told to retry,
        // so the message is withdrawn (cancel and purge, best effort), or a worker would run a
        // request nobody waits for.
        this.cancel(fvid, requestId, "publish unconfirmed");
        throw new CallplaneError(
          "UNAVAILABLE",
          "the work queue (NATS JetStream) did not accept the request; retry shortly",
          { cause: err },
        );
      }
    }
  }

  /**
   * Tells the version's workers to stop the request and removes its message if none took it yet:
   * by its sequence when the publish was confirmed, else by a purge filtered on its subject. The
   * sequence is what keeps a cancel cheap for nats-server: a filtered purge makes the consumer look
   * up every message it has delivered and not seen acknowledged (each request a worker holds), so
   * with tens of thousands in progress a burst of cancels stalled the server (publishes then went
   * unconfirmed, and their withdrawals were purges too); a delete by sequence touches one entry.
   */
  cancel(fvid: string, requestId: string, why: string, seq?: number): void {
    // a replica stopping now (its connection closing) cancels nothing: its messages expire by
    // themselves, and a publish queued on a closing connection would fail after the fact
    if (this.nc.isClosed() || this.nc.isDraining()) return;
    this.logger.debug({ requestId, why, seq }, "cancelling request");
    try {
      this.nc.publish(subjects.cancel(fvid), requestId);
    } catch (err) {
      this.logger.warn({ requestId, err }, "could not publish the cancel");
    }
    const stream = subjects.stream(this.region, fvid);
    this.queues
      .manager()
      .then((jsm): Promise<unknown> =>
        seq === undefined
          ? jsm.streams.purge(stream, { filter: subjects.work(this.region, fvid, requestId) })
          : // no erase: the message is marked deleted, not overwritten on disk
            jsm.streams.deleteMessage(stream, seq, false),
      )
      // a message a worker already acknowledged is gone: "no message found" is the common answer
      .catch((err: unknown) =>
        this.logger.debug({ requestId, seq, err }, "removing the cancelled message failed"),
      );
  }
}
