// One work message, from pull to ack: the kind of work it is (one HTTP request, a WorkItem, or a
// gRPC session, a StatefulSession), an output folder for it, the in-progress acks that keep it from
// being redelivered while it runs, and the confirmed ack when it is done (failed or not). Also
// answers the cancels of the work in progress.
import type { NatsConnection } from "@nats-io/transport-node";
import type { SecureContext } from "node:tls";
import type { Pool } from "undici";
import type { Logger } from "../../lib/log.js";
import type { Counter, Histogram } from "../../lib/metrics.js";
import type { PulledMessage } from "../../lib/nats/index.js";
import type { LookupFunction } from "../../lib/net/index.js";
import { subjects } from "../../lib/nats/index.js";
import { ATTR, traceWork, type TraceSpan, type Tracing } from "../../lib/tracing/index.js";
import type { CallbackClient } from "./callback.js";
import type { NatsAnswers } from "./nats-answer.js";
import type { WorkerConfig } from "./config.js";
import type { OutputSlot } from "./output-slot.js";
import type { ConfirmedAcks } from "./queue-consumer.js";
import { StatefulSession } from "./stateful.js";
import { WorkItem, type WorkOutcome } from "./work.js";

export type InflightWork = Map<string, WorkItem | StatefulSession>;

export interface DispatchDeps {
  cfg: WorkerConfig;
  logger: Logger;
  nc: NatsConnection;
  callbacks: CallbackClient;
  /** Small answers over NATS (nats-answer.ts). */
  answers: NatsAnswers | undefined;
  inference: Pool;
  lookup: LookupFunction;
  secureContext: SecureContext | undefined;
  acks: ConfirmedAcks;
  /** The work in progress by request id (the agent aborts it all on stop). */
  inflight: InflightWork;
  /** The output folders not in use, one per free concurrency slot. */
  freeSlots: OutputSlot[];
  /** callplane_worker_requests_total, by outcome. */
  items: Counter;
  /** callplane_worker_request_seconds: from pull to ack. */
  duration: Histogram;
  /** A span per message, under the replica's publish (its context is in the message's headers). */
  tracing?: Tracing | undefined;
}

export class WorkDispatcher {
  constructor(private readonly deps: DispatchDeps) {}

  async handle(m: PulledMessage): Promise<void> {
    const { cfg, logger, nc, inflight, freeSlots } = this.deps;
    const started = performance.now();
    // in progress until the ack is confirmed (ackConfirmed stops it): a message whose ack is still
    // on its way must not be redelivered meanwhile
    const keepAlive = setInterval(() => {
      try {
        if (!nc.isClosed()) m.working();
      } catch {
        // the connection is closing: nothing to keep alive
      }
    }, cfg.keepAliveMs);
    let acking = false;
    let outcome: WorkOutcome = "failed";
    let item: WorkItem | StatefulSession | undefined;
    const slot = freeSlots.pop();
    const trace =
      this.deps.tracing &&
      traceWork(this.deps.tracing, m.headers, cfg, subjects.consumer(cfg.region, cfg.functionVersionId));
    try {
      item = this.open(m, slot, trace);
      inflight.set(item.requestId, item);
      outcome = await item.run();
    } catch (err) {
      if (item?.abort.signal.aborted) {
        // a cancel (the client left, or its window ended) cut the work short: expected, not a fault
        outcome = "cancelled";
        logger.info({ requestId: item.requestId, err: (err as Error).message }, "work cancelled");
      } else logger.error({ err, requestId: item?.requestId }, "work failed");
    } finally {
      if (item) inflight.delete(item.requestId);
      // acked even on failure (contract §3.2): a redelivery would find the tokens used, and run the
      // inference again; not after destroy() closed the connection (the ack could only fail)
      if (!nc.isClosed()) {
        acking = true;
        this.deps.acks.ackConfirmed(m, item?.requestId, keepAlive);
      }
      if (!acking) clearInterval(keepAlive);
      trace?.set(ATTR.outcome, outcome).end(outcome === "failed" ? outcome : undefined);
      this.deps.items.inc({ outcome });
      this.deps.duration.observe((performance.now() - started) / 1000);
      if (slot) {
        await slot.reset().then(
          () => freeSlots.push(slot),
          (err: unknown) => logger.warn({ dir: slot.dir, err }, "cannot empty an output folder; dropping it"),
        );
      }
    }
  }

  /** A cancel for a request (its id is the message): aborts its work if it runs here. */
  cancel(requestId: string): void {
    const item = this.deps.inflight.get(requestId);
    if (item) {
      this.deps.logger.info({ requestId }, "cancel received: stopping the inference call");
      item.abort.abort();
    }
  }

  /** The kind of work: a gRPC session (statefulConfig) or one HTTP request (statelessConfig). */
  private open(
    m: PulledMessage,
    slot: OutputSlot | undefined,
    trace: TraceSpan | undefined,
  ): WorkItem | StatefulSession {
    const { cfg, logger, nc, lookup, secureContext, callbacks, answers, inference } = this.deps;
    const req = WorkItem.decode(m.data);
    trace?.identify(req.requestId, cfg.functionId, cfg.functionVersionId);
    return req.statefulConfig
      ? new StatefulSession({ cfg, logger, nc, lookup, secureContext, trace }, req)
      : new WorkItem({ cfg, logger, callbacks, answers, inference, nc, trace }, req, slot);
  }
}
