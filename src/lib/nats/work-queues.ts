// The work queue on NATS JetStream, named as the NVCF contract names it (§3.2): per (region,
// function version) a work-queue stream rq_{region}_{fvid} on subjects rq.{region}.{fvid}.>, one
// message per request id (dedupe), and one durable pull consumer shared by that version's workers.
// The control plane (the API) creates the stream and consumer, on deploy and on first use; workers
// and invocation replicas have no right to (see permissions.ts).
import {
  AckPolicy,
  DiscardPolicy,
  RetentionPolicy,
  StorageType,
  jetstreamManager,
  type JetStreamManager,
} from "@nats-io/jetstream";
import { nanos, type NatsConnection } from "@nats-io/transport-node";
import { subjects } from "./subjects.js";

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
    // checkAPI: the account-info probe is a JetStream API call the caller need not be allowed
    this.jsm ??= jetstreamManager(this.nc, { checkAPI: false });
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

  /**
   * A version's queue as its consumer sees it: messages no worker has taken yet (pending) and
   * those taken but not acknowledged (ackPending); undefined when the queue does not exist (yet).
   */
  async backlog(fvid: string): Promise<{ pending: number; ackPending: number } | undefined> {
    const jsm = await this.manager();
    try {
      const info = await jsm.consumers.info(
        subjects.stream(this.region, fvid),
        subjects.consumer(this.region, fvid),
      );
      return { pending: info.num_pending, ackPending: info.num_ack_pending };
    } catch (err) {
      if (/(consumer|stream) not found/i.test(String(err))) return undefined;
      throw err;
    }
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
  // nats.js v3 reports a publish that no stream captures (no responders) as "jetstream is not enabled"
  if (
    /no (stream|responders)|stream not found|jetstream is not enabled/i.test(text) ||
    (err as Error)?.name === "JetStreamNotEnabled"
  )
    return "no-stream";
  return "other";
}
