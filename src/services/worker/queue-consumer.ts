// The worker's side of its function version's work queue: wait for the queue to exist, pull work
// by credit (never more messages than free slots, so a busy worker leaves messages to the others;
// the pulls are lib/nats/credit-pull.ts), and acknowledge each message with a confirmation from
// JetStream.
import { jetstream } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "../../lib/log.js";
import type { Gauge } from "../../lib/metrics.js";
import { CreditPull, subjects, type PulledMessage, type Replies } from "../../lib/nats/index.js";
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
): Promise<void> {
  const { cfg, logger, signal } = deps;
  const stream = subjects.stream(cfg.region, cfg.functionVersionId);
  const name = subjects.consumer(cfg.region, cfg.functionVersionId);
  for (let said = false; ;) {
    try {
      await jetstream(conn).consumers.get(stream, name);
      return;
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
  ackConfirmed(m: PulledMessage, requestId: string | undefined, keepAlive: NodeJS.Timeout): void {
    const p = this.ackUntilConfirmed(m, requestId).finally(() => clearInterval(keepAlive));
    this.pending.add(p);
    void p.finally(() => this.pending.delete(p));
  }

  private async ackUntilConfirmed(m: PulledMessage, requestId: string | undefined): Promise<void> {
    const { nc: conn, logger } = this;
    const subject = m.reply;
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
  handle: (m: PulledMessage) => Promise<void>;
  /** The agent's lifecycle: no more work is asked for once `stopping` is set. */
  lifecycle: { readonly stopping: boolean };
}

const NAK = new TextEncoder().encode("-NAK");

/** Work pulled by credit: as many messages asked for as there are free slots, never more. */
export class QueueConsumer {
  private busySlots = 0;
  private readonly pull: CreditPull;

  constructor(
    private readonly deps: QueueConsumerDeps,
    private readonly nc: NatsConnection,
    inboxPrefix: string,
  ) {
    const { cfg, logger } = deps;
    this.pull = new CreditPull(nc, {
      stream: subjects.stream(cfg.region, cfg.functionVersionId),
      consumer: subjects.consumer(cfg.region, cfg.functionVersionId),
      inboxPrefix,
      logger,
      onMessage: (m) => this.take(m),
    });
  }

  /** The requests in progress. */
  get active(): number {
    return this.busySlots;
  }

  /** Starts asking for work: every slot free. */
  start(): void {
    this.pull.credit(this.deps.cfg.concurrency - this.busySlots);
  }

  /** A graceful stop: no more work is asked for (the work in progress goes on). */
  stop(): void {
    this.pull.stop();
  }

  /** One message takes a slot until its handling settles. */
  private take(m: PulledMessage): void {
    const { cfg, busy, handle, lifecycle, logger } = this.deps;
    if (this.busySlots >= cfg.concurrency || lifecycle.stopping) {
      // never expected (credit never exceeds the free slots): given back at once for another worker
      logger.warn({ busy: this.busySlots }, "a message came with no slot free; giving it back");
      this.nc.publish(m.reply, NAK);
      return;
    }
    this.busySlots++;
    busy.set(this.busySlots);
    void handle(m).finally(() => {
      this.busySlots--;
      busy.set(this.busySlots);
      if (!lifecycle.stopping) this.pull.credit(cfg.concurrency - this.busySlots);
    });
  }
}
