// Putting work on a function version's queue and taking it back: the publish (a duplicate request id
// counts as published; a full queue and a silent JetStream are told apart; a queue that is missing is
// asked of the API, which alone may create queues, once), and the cancel (a broadcast to the
// version's workers, and a purge of the message if no worker took it yet). The invocation service
// and grpc-proxy share it.
import { jetstream, type JetStreamClient } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { request } from "undici";
import { CallplaneError } from "../lib/errors.js";
import type { Logger } from "../lib/log.js";
import { WorkQueues, classifyPublishError, subjects, type QueueLimits } from "../lib/queue.js";

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
  ) {
    this.js = jetstream(nc);
    this.queues = new WorkQueues(nc, region, limits);
  }

  async publish(fvid: string, requestId: string, data: Uint8Array): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        // No Nats-Msg-Id: the stream already keeps one message per subject, and the subject ends in
        // the request id, so a repeated publish is refused as a duplicate (and taken as success
        // below) without a header and a dedupe-window entry on every message.
        await this.js.publish(subjects.work(this.region, fvid, requestId), data);
        return;
      } catch (err) {
        const kind = classifyPublishError(err);
        if (kind === "duplicate") return;
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
        throw new CallplaneError(
          "UNAVAILABLE",
          "the work queue (NATS JetStream) did not accept the request; retry shortly",
          { cause: err },
        );
      }
    }
  }

  /** Tells the version's workers to stop the request and removes its message if none took it yet. */
  cancel(fvid: string, requestId: string, why: string): void {
    // a replica stopping now (its connection closing) cancels nothing: its messages expire by
    // themselves, and a publish queued on a closing connection would fail after the fact
    if (this.nc.isClosed() || this.nc.isDraining()) return;
    this.logger.debug({ requestId, why }, "cancelling request");
    try {
      this.nc.publish(subjects.cancel(fvid), requestId);
    } catch (err) {
      this.logger.warn({ requestId, err }, "could not publish the cancel");
    }
    this.queues
      .manager()
      .then((jsm) =>
        jsm.streams.purge(subjects.stream(this.region, fvid), {
          filter: subjects.work(this.region, fvid, requestId),
        }),
      )
      .catch((err: unknown) => this.logger.debug({ requestId, err }, "purge after cancel failed"));
  }
}
