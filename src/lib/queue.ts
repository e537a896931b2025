// The work queue on NATS JetStream, named as the NVCF contract names it (§3.2): per (region,
// function version) a work-queue stream rq_{region}_{fvid} on subjects rq.{region}.{fvid}.>, one
// message per request id (dedupe), and one durable pull consumer shared by that version's workers.
// Both the invocation service and the worker create the stream and consumer when missing, with the
// same configuration, so either may start first.
import {
  AckPolicy,
  DiscardPolicy,
  RetentionPolicy,
  StorageType,
  jetstreamManager,
  type JetStreamManager,
} from "@nats-io/jetstream";
import { nanos, type NatsConnection } from "@nats-io/transport-node";
import { connect } from "@nats-io/transport-node";
import type { Logger } from "./log.js";

export interface QueueLimits {
  maxMessages: number;
  maxMessageBytes: number;
  replicas: number;
  ackWaitSeconds: number;
}

export const DEFAULT_QUEUE_LIMITS: QueueLimits = {
  maxMessages: 100_000,
  maxMessageBytes: 6 * 1024 * 1024,
  replicas: 1,
  ackWaitSeconds: 30,
};

export const subjects = {
  stream: (region: string, fvid: string) => `rq_${region}_${fvid}`,
  consumer: (region: string, fvid: string) => `rq_${region}_${fvid}_workers`,
  work: (region: string, fvid: string, requestId: string) => `rq.${region}.${fvid}.${requestId}`,
  workFilter: (region: string, fvid: string) => `rq.${region}.${fvid}.>`,
  polling: (requestId: string) => `rq_polling.${requestId}`,
  cancel: (fvid: string) => `nvcf.cancel.${fvid}`,
  /** A gRPC session's worker listens here for tunnels to more replicas (session resumption). */
  reconnect: (requestId: string) => `stateful_session.reconnect.${requestId}`,
} as const;

export async function connectNats(url: string, name: string, logger: Logger): Promise<NatsConnection> {
  // noAsyncTraces: the client would otherwise build an Error (a stack capture) for every request,
  // a measurable share of the hot path's CPU; timeouts still reject with clear errors.
  const nc = await connect({
    noAsyncTraces: true,
    servers: url,
    name,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 500,
    pingInterval: 10_000,
  });
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === "disconnect" || s.type === "reconnect" || s.type === "error")
        logger.warn({ nats: s.type, server: "server" in s ? s.server : undefined }, `nats ${s.type}`);
    }
  })();
  return nc;
}

/** Creates (once per process and version) the work-queue stream and its durable consumer. */
export class WorkQueues {
  private readonly ensured = new Map<string, Promise<void>>();
  private jsm: Promise<JetStreamManager> | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly region: string,
    private readonly limits: QueueLimits,
  ) {}

  manager(): Promise<JetStreamManager> {
    this.jsm ??= jetstreamManager(this.nc);
    return this.jsm;
  }

  ensure(fvid: string): Promise<void> {
    let p = this.ensured.get(fvid);
    if (!p) {
      p = this.create(fvid);
      this.ensured.set(fvid, p);
      p.catch(() => this.ensured.delete(fvid));
    }
    return p;
  }

  /** Forget what was ensured (after the stream was found missing), so the next ensure recreates it. */
  forget(fvid: string): void {
    this.ensured.delete(fvid);
  }

  private async create(fvid: string): Promise<void> {
    const jsm = await this.manager();
    const name = subjects.stream(this.region, fvid);
    try {
      await jsm.streams.info(name);
    } catch (err) {
      if (!/stream not found/i.test(String(err))) throw err;
      try {
        await jsm.streams.add({
          name,
          subjects: [subjects.workFilter(this.region, fvid)],
          retention: RetentionPolicy.Workqueue,
          storage: StorageType.File,
          max_msgs: this.limits.maxMessages,
          max_msg_size: this.limits.maxMessageBytes,
          max_msgs_per_subject: 1,
          discard: DiscardPolicy.New,
          discard_new_per_subject: true,
          duplicate_window: nanos(5_000),
          num_replicas: this.limits.replicas,
          allow_direct: true,
        });
      } catch (addErr) {
        // another replica or worker created it between our info and add
        if (!/already in use/i.test(String(addErr))) throw addErr;
      }
    }
    const durable = subjects.consumer(this.region, fvid);
    try {
      await jsm.consumers.info(name, durable);
    } catch (err) {
      if (!/consumer not found/i.test(String(err))) throw err;
      try {
        await jsm.consumers.add(name, {
          durable_name: durable,
          ack_policy: AckPolicy.Explicit,
          ack_wait: nanos(this.limits.ackWaitSeconds * 1000),
          max_ack_pending: 100_000,
          max_waiting: 10_000,
          filter_subject: subjects.workFilter(this.region, fvid),
        });
      } catch (addErr) {
        if (!/already (in use|exists)/i.test(String(addErr))) throw addErr;
      }
    }
  }
}

/** How a publish failure reads to a client: the stream's limits are reached, or the id was a duplicate. */
export function classifyPublishError(err: unknown): "full" | "duplicate" | "no-stream" | "other" {
  const text = String((err as Error)?.message ?? err);
  if (/per subject/i.test(text)) return "duplicate";
  if (/maximum (messages|bytes) exceeded|insufficient resources/i.test(text)) return "full";
  if (/no (stream|responders)|stream not found/i.test(text)) return "no-stream";
  return "other";
}
