// The worker's side of its function version's work queue: wait for the queue to exist, pull work
// by credit (never more messages than free slots, so a busy worker leaves messages to the others),
// and acknowledge each message with a confirmation from JetStream.
import { jetstream, type Consumer, type JsMsg } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "../../lib/log.js";
import type { Gauge } from "../../lib/metrics.js";
import { subjects, type Replies } from "../../lib/nats/index.js";
import type { WorkerConfig } from "./config.js";

/**
 * How long one ack waits for JetStream's confirmation, and for how long it is sent again: long
 * enough for a NATS cluster to elect a new consumer leader and for a worker whose node went to
 * reconnect to another (seconds each).
 */
const ACK_TIMEOUT_MS = 2000;
const ACK_RETRY_MS = 60_000;
const ACK_BODY = new TextEncoder().encode("+ACK");

/**
 * The control plane creates the version's queue (workers may not); until it exists, wait.
 */
export async function waitForConsumer(
  conn: NatsConnection,
  deps: { cfg: WorkerConfig; logger: Logger; signal: AbortSignal },
): Promise<Consumer> {
  const { cfg, logger, signal } = deps;
  const stream = subjects.stream(cfg.region, cfg.functionVersionId);
  const name = subjects.consumer(cfg.region, cfg.functionVersionId);
  for (let said = false; ;) {
    try {
      return await jetstream(conn).consumers.get(stream, name);
    } catch (err) {
      if (!/not found/i.test(String(err)) || signal.aborted) throw err;
      if (!said)
        logger.info({ stream, consumer: name }, "waiting for the control plane to create the work queue");
      said = true;
      await sleep(1000, undefined, { signal });
    }
  }
}

/** Acks on their way to JetStream; a graceful stop waits for them. */
export class ConfirmedAcks {
  private readonly pending = new Set<Promise<void>>();

  constructor(
    private readonly nc: NatsConnection,
    private readonly logger: Logger,
    /** The connection's request-reply for the ack's confirmation. */
    private readonly replies: Replies,
  ) {}

  /** How many acks still wait for their confirmation. */
  get size(): number {
    return this.pending.size;
  }

  /**
   * Acknowledges a message and waits for JetStream to confirm it, asking again when no answer
   * comes. A plain ack is one publish that nobody confirms: on a NATS cluster, one sent while the
   * consumer's leader is lost (a node killed, its leader moving) is dropped, and the message is
   * redelivered after the ack wait and run a second time. The ack goes on in the background (the
   * slot is free at once); `keepAlive` keeps the message in progress until it is confirmed.
   */
  ackConfirmed(m: JsMsg, requestId: string | undefined, keepAlive: NodeJS.Timeout): void {
    const p = this.ackUntilConfirmed(m, requestId).finally(() => clearInterval(keepAlive));
    this.pending.add(p);
    void p.finally(() => this.pending.delete(p));
  }

  private async ackUntilConfirmed(m: JsMsg, requestId: string | undefined): Promise<void> {
    const { nc: conn, logger } = this;
    // the ack subject ($JS.ACK...): JsMsg's own ackAck() sends once only, so it is asked by hand
    const subject = (m as JsMsg & { reply: string }).reply;
    const until = Date.now() + ACK_RETRY_MS;
    for (let attempt = 1; ; attempt++) {
      if (conn.isClosed()) return;
      try {
        await this.replies.request(subject, ACK_BODY, ACK_TIMEOUT_MS);
        if (attempt > 1) logger.info({ requestId, attempts: attempt }, "ack confirmed");
        return;
      } catch (err) {
        if (Date.now() > until || conn.isClosed()) {
          logger.warn(
            { requestId, attempts: attempt, err: (err as Error).message },
            "JetStream did not confirm the ack; the message may be delivered again",
          );
          return;
        }
        logger.debug(
          { requestId, attempt, err: (err as Error).message },
          "ack unconfirmed; sending it again",
        );
        await sleep(Math.min(250 * attempt, 1000));
      }
    }
  }
}

export interface QueueConsumerDeps {
  cfg: WorkerConfig;
  logger: Logger;
  /** callplane_worker_busy_slots: the requests in progress. */
  busy: Gauge;
  /** Runs one message to its ack; the slot is free again when it settles. */
  handle: (m: JsMsg) => Promise<void>;
  /** The agent's lifecycle: the loop ends once `stopping` is set. */
  lifecycle: { readonly stopping: boolean };
}

/** The credit-based pull loop: fetches at most as many messages as there are free slots. */
export class QueueConsumer {
  private busySlots = 0;
  /** Wakes the loop waiting for a free slot. */
  private slotFreed: (() => void) | undefined;
  private currentFetch: { stop(): void } | undefined;

  constructor(
    private readonly deps: QueueConsumerDeps,
    private readonly consumer: Consumer,
  ) {}

  /** The requests in progress. */
  get active(): number {
    return this.busySlots;
  }

  async pullLoop(): Promise<void> {
    const { cfg, logger, lifecycle } = this.deps;
    while (!lifecycle.stopping) {
      const free = cfg.concurrency - this.busySlots;
      if (free <= 0) {
        await new Promise<void>((resolve) => (this.slotFreed = resolve));
        continue;
      }
      let batch;
      try {
        batch = await this.consumer.fetch({ max_messages: free, expires: 30_000 });
      } catch (err) {
        if (lifecycle.stopping) return;
        logger.warn({ err: (err as Error).message }, "pulling work failed; retrying");
        await sleep(1000);
        continue;
      }
      this.currentFetch = batch;
      try {
        for await (const m of batch) this.take(m);
      } catch (err) {
        if (lifecycle.stopping) return;
        logger.warn({ err: (err as Error).message }, "the pull was interrupted; pulling again");
        await sleep(500);
      } finally {
        this.currentFetch = undefined;
      }
    }
  }

  /** A graceful stop: ends the fetch in flight and wakes a loop waiting for a free slot. */
  wake(): void {
    this.currentFetch?.stop();
    this.slotFreed?.();
  }

  /** One message takes a slot until its handling settles. */
  private take(m: JsMsg): void {
    const { busy, handle } = this.deps;
    this.busySlots++;
    busy.set(this.busySlots);
    void handle(m).finally(() => {
      this.busySlots--;
      busy.set(this.busySlots);
      const f = this.slotFreed;
      this.slotFreed = undefined;
      f?.();
    });
  }
}
