// The API's part in worker trust (its endpoints are in routes/worker-trust.ts):
// - the work queues: the API creates each deployed version's stream and consumer (on deploy, on
//   the first invocation, and whenever the compute agent syncs), so that neither workers nor
//   invocation replicas need JetStream admin rights;
// - what workers get to reach NATS (nats.workerAuth): the shared worker nkey in nkey mode, their
//   account (NVCF_NATS_ACCOUNT) in token mode;
// - per-worker identity: signs each instance's identity token for the compute agent (local backend),
//   refreshes it; verifies the pod tokens of Kubernetes workers against their cluster's registered
//   keys (pod-tokens.ts); answers RFC 7662 introspection for both; when an instance ends, revokes its
//   identity and closes the NATS connections that logged in with it;
// - the auth callout's webhook (POST /v2/nvcf/webhook/nats-auth): a worker token in, the user and
//   permissions of one function version out (the token is checked by introspect() here).
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "../../lib/log.js";
import type { Registry } from "../../lib/metrics.js";
import type { JetStreamAccountStats } from "@nats-io/jetstream";
import {
  accountConnections,
  type AccountConnection,
  closeConnections,
  connectNats,
  drainOrClose,
  NATS_ACCOUNTS,
  natsClusterHealth,
  type NatsClusterHealth,
  natsConnected,
  type NatsAccess,
  type QueueLimits,
  WorkQueues,
} from "../../lib/nats/index.js";
import { decodeJwt } from "jose";
import { IDENTITY_ISSUER, type IdentitySigner, type VerifiedIdentity } from "../../lib/identity/index.js";
import type { IdentityStore } from "./identity-store.js";
import { PodTokens, type PodTokenIdentity, type WorkerTokenRefusal } from "./pod-tokens.js";
import { ReplicaReports } from "./replica-reports.js";
import type { Store } from "./store/types.js";

export type WorkerAuthMode = "nkey" | "token";

export interface WorkerTrustOptions {
  region: string;
  queue: QueueLimits;
  /**
   * NATS for the queues (APP) and for closing revoked workers' connections (SYS); tests may leave it
   * out. `servers`: how many servers the cluster has (nats.cluster.size), each asked for the
   * connections it holds.
   */
  nats?: {
    app: NatsAccess;
    sys?: NatsAccess;
    servers?: number;
    /**
     * How many callback proxies answer the console's logs question besides the registered
     * replicas (default 0); undefined when not known (autoscaled): that question then spends its
     * whole wait.
     */
    callbackProxies?: number | undefined;
  };
  workerAuth: WorkerAuthMode;
  /** nkey mode: the shared worker nkey seed (read when asked, so a rotation is picked up). */
  workerNkeySeed?: () => string;
  identity: { signer: IdentitySigner; store: IdentityStore };
}

export type Introspection =
  | {
      active: false;
      reason: string;
      failure: "expired" | "invalid" | "revoked";
      kind: "api";
      check?: undefined;
    }
  | ({ active: true; kind: "api" } & VerifiedIdentity)
  | ({ kind: "pod" } & (WorkerTokenRefusal | PodTokenIdentity));

/** Whether a token is one the API signed (a local instance's) rather than a cluster's pod token. */
function signedByApi(token: string): boolean {
  try {
    return decodeJwt(token).iss === IDENTITY_ISSUER;
  } catch {
    return false;
  }
}

export class WorkerTrust {
  readonly signer: IdentitySigner;
  readonly identities: IdentityStore;
  readonly podTokens: PodTokens;
  private app: NatsConnection | undefined;
  private sys: NatsConnection | undefined;
  private queues: WorkQueues | undefined;
  private reports: ReplicaReports | undefined;

  constructor(
    readonly opts: WorkerTrustOptions,
    store: Store,
    private readonly logger: Logger,
    /** Where the APP connection's state is reported (callplane_nats_connected). */
    private readonly registry?: Registry,
  ) {
    this.signer = opts.identity.signer;
    this.identities = opts.identity.store;
    this.podTokens = new PodTokens(store);
  }

  async start(): Promise<void> {
    if (!this.opts.nats) return;
    this.app = await connectNats(this.opts.nats.app, "api", this.logger, this.registry);
    this.queues = new WorkQueues(this.app, this.opts.region, this.opts.queue);
    this.reports = new ReplicaReports(this.app, this.logger, this.opts.nats.callbackProxies ?? 0);
    if (this.opts.nats.sys) this.sys = await connectNats(this.opts.nats.sys, "api-revoker", this.logger);
  }

  async close(): Promise<void> {
    await Promise.all([drainOrClose(this.app), drainOrClose(this.sys)]);
  }

  destroy(): void {
    void this.app?.close();
    void this.sys?.close();
  }

  async ensureQueue(fvid: string): Promise<void> {
    if (!this.queues) return;
    await this.queues.ensure(fvid);
  }

  /** Creates the queue if it can; a failure is logged (the next sync or invocation tries again). */
  ensureQueueSoft(fvid: string): Promise<void> {
    return this.ensureQueue(fvid).catch((err: unknown) =>
      this.logger.warn({ versionId: fvid, err: (err as Error).message }, "could not create the work queue"),
    );
  }

  /**
   * A version's queue backlog (lib/nats WorkQueues.backlog); undefined when the queue does not
   * exist, or when NATS is not configured or not connected now (nothing is asked then).
   */
  async queueBacklog(fvid: string): Promise<{ pending: number; ackPending: number } | undefined> {
    if (!this.queues || !natsConnected(this.app)) return undefined;
    return this.queues.backlog(fvid);
  }

  /**
   * What the invocation replicas report to the operator console (their requests in flight, how one
   * went, the live replicas), over the APP connection; undefined while NATS is not configured.
   */
  replicaReports(): ReplicaReports | undefined {
    return this.reports;
  }

  /** Whether the queues can be read now (NATS configured and connected). */
  get queuesReadable(): boolean {
    return this.queues !== undefined && natsConnected(this.app);
  }

  /**
   * The APP connection and the server it is on now, with what that server's INFO says of its
   * cluster (the console's health page); undefined without NATS.
   */
  natsServer():
    | { connected: boolean; version?: string; name?: string; cluster?: string; connectUrls: string[] }
    | undefined {
    if (!this.opts.nats) return undefined;
    const info = this.app?.info;
    return {
      connected: natsConnected(this.app),
      version: info?.version,
      name: info?.server_name,
      cluster: info?.cluster,
      connectUrls: info?.connect_urls ?? [],
    };
  }

  /** How many servers the NATS cluster has (nats.cluster.size); 0 without NATS. */
  get natsServers(): number {
    return this.opts.nats ? Math.max(1, this.opts.nats.servers ?? 1) : 0;
  }

  /**
   * Every server's health, routes and JetStream, through the SYS connection (the console's health
   * page: no stream details, so the answer stays small); undefined without it or while it is down.
   */
  async natsCluster(waitMs: number): Promise<NatsClusterHealth | undefined> {
    if (!natsConnected(this.sys)) return undefined;
    return natsClusterHealth(this.sys!, this.natsServers, { waitMs, streams: false });
  }

  /** The auth callout's connections (account AUTH) on every server; undefined without the SYS connection. */
  async authCalloutConnections(
    waitMs: number,
  ): Promise<{ servers: string[]; connections: AccountConnection[] } | undefined> {
    if (!natsConnected(this.sys)) return undefined;
    return accountConnections(this.sys!, NATS_ACCOUNTS.auth, this.natsServers, waitMs);
  }

  /** The APP account's JetStream use and limits; undefined while NATS is not configured or not connected. */
  async jetStreamAccount(): Promise<JetStreamAccountStats | undefined> {
    if (!this.queues || !natsConnected(this.app)) return undefined;
    return (await this.queues.manager()).getAccountInfo();
  }

  /** Checks the queue again even if this process remembers creating it (someone may have removed it). */
  async recreateQueue(fvid: string): Promise<void> {
    this.queues?.forget(fvid);
    await this.ensureQueue(fvid);
  }

  /** What the compute agent hands every worker it starts to reach NATS, by mode. */
  workerNatsEnv(): { workerAuth: WorkerAuthMode; env: Record<string, string> } {
    if (this.opts.workerAuth === "token")
      return { workerAuth: "token", env: { NVCF_NATS_ACCOUNT: NATS_ACCOUNTS.app } };
    const seed = this.opts.workerNkeySeed?.();
    return { workerAuth: "nkey", env: seed ? { NKEY_SEED: seed } : {} };
  }

  /**
   * Who a worker token says the worker is: an identity the API signed (local instances), or a pod
   * token its cluster signed (Kubernetes). Either is checked against the live instance it names.
   */
  async introspect(token: string): Promise<Introspection> {
    if (!signedByApi(token)) return { kind: "pod", ...(await this.podTokens.introspect(token)) };
    const v = await this.signer.verify(token);
    const refuse = (failure: "expired" | "invalid" | "revoked", reason: string): Introspection => ({
      kind: "api",
      active: false,
      failure,
      reason,
    });
    if ("failure" in v) return refuse(v.failure === "expired" ? "expired" : "invalid", v.reason);
    const rec = await this.identities.get(v.instanceId);
    if (!rec) return refuse("invalid", "no identity was issued for this instance");
    if (rec.status === "REVOKED")
      return refuse(
        "revoked",
        `the identity of instance ${v.instanceId} was revoked at ${rec.revokedAt} (${rec.revokedWhy ?? "revoked"})`,
      );
    if (rec.versionId !== v.functionVersionId)
      return refuse("invalid", "the token names another version than its instance");
    return { kind: "api", active: true, ...v };
  }

  /**
   * An instance report replaced the reporter's previous one: the instances that ended (live before,
   * not now: the store tells, in the report's own transaction) lose their identity and their NATS
   * connections; so do those it reports TERMINATED (an identity the API issued is revoked once).
   */
  async onReport(
    after: Array<{ instanceId: string; status: string }>,
    ended: readonly string[],
  ): Promise<void> {
    const endedNow = new Set(ended);
    const terminated = after.filter((i) => i.status === "TERMINATED").map((i) => i.instanceId);
    // a pod's worker has no identity the API issued, but its connections go as well: it was live
    for (const id of new Set([...ended, ...terminated]))
      await this.revoke(id, "instance terminated", endedNow.has(id));
  }

  /**
   * Revokes an instance's identity (one the API issued) and closes its workers' NATS connections:
   * when an identity was revoked now, or when `wasLive` (a pod's worker, whose token the cluster
   * signed: its instance's end is what refuses it from now on).
   */
  async revoke(instanceId: string, why: string, wasLive = false): Promise<boolean> {
    const was = await this.identities.revoke(instanceId, why, new Date().toISOString());
    if (was || wasLive) {
      const kicked = await this.kick(instanceId).catch((err: unknown) => {
        this.logger.warn(
          { instanceId, err: (err as Error).message },
          "could not close the revoked worker's NATS connections; they end when their user JWT expires",
        );
        return 0;
      });
      this.logger.info({ instanceId, why, natsConnectionsClosed: kicked }, "worker identity revoked");
    }
    return was;
  }

  /** Closes every NATS connection that logged in with this instance's identity (token mode), on every server. */
  private async kick(instanceId: string): Promise<number> {
    if (!this.sys) return 0;
    const r = await closeConnections(
      this.sys,
      (u) => u.startsWith("worker-") && u.endsWith(`.${instanceId}`),
      { servers: this.opts.nats?.servers ?? 1 },
    );
    if (r.servers.length < r.expected)
      this.logger.warn(
        {
          instanceId,
          answered: r.servers.map((s) => s.name),
          expected: r.expected,
          natsConnectionsClosed: r.closed,
        },
        "not every NATS server answered: a connection the revoked worker holds on a server that did not answer ends when its user JWT expires",
      );
    return r.closed;
  }
}
