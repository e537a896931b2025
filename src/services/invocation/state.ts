// What one invocation replica's handlers share, passed to each of them explicitly: the requests it
// holds (each a Pending), the attach tokens that lead a worker's callback back to one, the NATS
// handles (set by listen()), the API key cache and the metrics.
//
// Everything a request needs lives in this process's memory: the client's request and response,
// the two single-use attach tokens, the window timer. The request id names this replica (ids.ts),
// so later a callback that lands elsewhere can be relayed here.
import { Kvm, type KV } from "@nats-io/kv";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { CallplaneError } from "../../lib/errors.js";
import { newHolderId } from "../../lib/ids.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { createRegistry, type Registry } from "../../lib/metrics.js";
import { pollBucket } from "../../lib/nats/index.js";
import { createAuthCache, type AuthCache, type GrantVersion } from "../../plane/auth-cache.js";
import { KeyInFlight, type KeySlot } from "../../plane/key-limit.js";
import { PendingTable } from "../../plane/pending.js";
import type { ReplicaRegistry } from "../../plane/registry.js";
import type { Relay } from "../../plane/relay.js";
import { TokenTable } from "../../plane/tokens.js";
import type { WorkPublisher } from "../../plane/work-queue.js";
import type { Tracing } from "../../lib/tracing/index.js";
import { InvocationMetrics, type InvocationSeries } from "./metrics.js";
import type { InvocationOutcome } from "./outcome.js";
import type { InvocationServiceOptions, PollSettings } from "./options.js";
import type { WorkerContact } from "./worker-seen.js";

export type PendingState = "queued" | "responding" | "done";

export type AttachKind = "request" | "response";

export interface Pending {
  requestId: string;
  functionId: string;
  version: GrantVersion;
  clientReq: IncomingMessage;
  clientRes: ServerResponse;
  /** Body bytes already read past the inline part, served first on GET request-attach. */
  leftover: Buffer | undefined;
  requestToken: string | undefined;
  /** A worker is reading the rest of the client's body (GET request-attach), which has not ended. */
  bodyStreaming?: boolean;
  responseToken: string;
  state: PendingState;
  /** True for a status poll (GET /v2/nvcf/pexec/status/{id}): its message is not in the queue. */
  poll: boolean;
  /** The work message's stream sequence once its publish was confirmed (a cancel removes it by it). */
  seq?: number;
  started: number;
  /** The account of the key that made the request (NVCF's clientNcaId): only its keys may poll it. */
  clientNcaId: string;
  /** The key's slot among its requests in flight on this replica, given back on release. */
  slot: KeySlot | undefined;
  /** Its function version's metrics (metrics.ts); none for a status poll. */
  fn?: InvocationSeries | undefined;
  /** How it ended, marked where that is decided; counted when the client's response closes. */
  outcome?: InvocationOutcome | undefined;
  /** The error the plane answered the client with (a 504, a 502...), for the console's lookup. */
  problem?: CallplaneError | undefined;
  /** The worker's last contact about it (a callback, an answer, a poll's ack), for the console. */
  worker?: WorkerContact | undefined;
}

/** What the poll bucket keeps of a request that went in progress (202), keyed by its id. */
export interface PollRecord {
  /** The account whose keys may poll the request; a poll with a key of another is told it does not exist. */
  clientNcaId: string;
  functionId: string;
  functionVersionId: string;
  defaultInvocationPath: string;
  functionType: string;
}

export class ReplicaState {
  readonly logger: Logger;
  readonly registry: Registry;
  readonly holderId: number;
  /** When this replica started (ISO 8601), as its console report says. */
  readonly startedAt = new Date().toISOString();
  readonly region: string;
  readonly inlineLimit: number;
  readonly poll: PollSettings;
  readonly statusTimeoutMs: number;
  /** Handed to workers as proxyURI. */
  readonly proxyUri: string | undefined;
  /** Copies of the poll bucket (as many as the work queues'). */
  private readonly queueReplicas: number | undefined;
  readonly auth: AuthCache;
  readonly inFlightPerKey: KeyInFlight;
  /** How long the inline part of a body may take, and how long any body may pause (ms). */
  readonly inlineBodyMs: number;
  readonly bodyIdleMs: number;
  readonly metrics: InvocationMetrics;
  readonly tracing: Tracing | undefined;
  // An attach token names the replica that holds it (the one that minted it: for a status poll,
  // the polling replica, not the request's first holder), so a callback that lands elsewhere can be
  // relayed to it.
  readonly tokens: TokenTable<{ kind: AttachKind; pending: Pending }>;
  readonly pendings: PendingTable<Pending>;

  // Set by the service's listen():
  nc: NatsConnection | undefined;
  /** The workers' small answers over NATS (answer-message.ts). */
  answers: Subscription | undefined;
  /** The operator console's questions (console-report.ts). */
  console: Subscription[] | undefined;
  publisher: WorkPublisher | undefined;
  /** The callback target handed to workers (the pod address). */
  targetUri = "";
  replicas: ReplicaRegistry | undefined;
  relay: Relay | undefined;
  private pollKv: Promise<KV> | undefined;

  constructor(opts: InvocationServiceOptions) {
    this.logger = opts.logger ?? silentLogger();
    this.registry = opts.registry ?? createRegistry("invocation");
    this.holderId = opts.holderId ?? newHolderId();
    this.region = opts.region;
    this.inlineLimit = opts.inlineBodyBytes ?? 32 * 1024;
    this.poll = opts.poll ?? {
      defaultSeconds: 60,
      streamingDefaultSeconds: 1200,
      maxSeconds: 3600,
      graceSeconds: 2,
    };
    this.statusTimeoutMs = opts.statusRequestTimeoutMs ?? 5000;
    this.proxyUri = opts.proxyUri;
    this.queueReplicas = opts.queue.replicas;
    this.auth = createAuthCache(opts, this.logger, this.registry);
    this.inFlightPerKey = new KeyInFlight(opts.maxInFlightPerKey ?? 1024, "invocation.maxInFlightPerKey");
    this.inlineBodyMs = opts.inlineBodyMs ?? 30_000;
    this.bodyIdleMs = opts.bodyIdleMs ?? 10_000;
    this.metrics = new InvocationMetrics(this.registry, opts.functionSeriesLimit);
    this.tracing = opts.tracing;
    this.tokens = new TokenTable(this.holderId);
    this.pendings = new PendingTable<Pending>();
  }

  /** Ready for traffic: connected to NATS. */
  ready(): boolean {
    return this.nc !== undefined && !this.nc.isClosed();
  }

  attachToken(pending: Pending, kind: AttachKind): string {
    return this.tokens.mint({ kind, pending });
  }

  pollKvBucket(): Promise<KV> {
    this.pollKv ??= new Kvm(this.nc!).create(pollBucket(this.region), {
      history: 1,
      ttl: 3600_000,
      storage: "memory" as never,
      // as many copies as the work queues: on a cluster, polls survive the loss of a node
      replicas: this.queueReplicas,
    });
    return this.pollKv;
  }

  /** Lets go of a request (once, however many paths end it): its window and its tokens go. */
  release(p: Pending): void {
    if (p.state === "done") return;
    p.state = "done";
    p.slot?.release();
    this.pendings.release(p);
    this.tokens.delete(p.responseToken);
    this.tokens.delete(p.requestToken);
  }

  /** Tells the worker to stop and removes the message if no worker took it yet. */
  cancel(p: Pending, why: string): void {
    // A status poll that ends (client left, window over) does not end the request: the client may
    // poll again, and the worker gives up on its own when polls stop coming.
    if (p.poll) return;
    this.publisher?.cancel(p.version.functionVersionId, p.requestId, why, p.seq);
  }

  /** The replica stops: every request it still holds is cancelled and its client cut off. */
  releaseAll(why: string): void {
    for (const p of this.pendings.values()) {
      this.cancel(p, why);
      p.clientRes.destroy();
      this.release(p);
    }
  }
}
