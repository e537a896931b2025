// The API's part in worker trust (its endpoints are in routes/worker-trust.ts):
// - the work queues: the API creates each deployed version's stream and consumer (on deploy, on
//   the first invocation, and whenever the compute agent syncs), so that neither workers nor
//   invocation replicas need JetStream admin rights;
// - what workers get to reach NATS (nats.workerAuth): the shared worker nkey in nkey mode, their
//   account (NVCF_NATS_ACCOUNT) in token mode;
// - per-worker identity: signs each instance's identity token for the compute agent, refreshes it,
//   answers RFC 7662 introspection, revokes it when the instance is terminated and closes the NATS
//   connections that logged in with it;
// - the auth callout's webhook (POST /v2/nvcf/webhook/nats-auth): a worker token in, the user and
//   permissions of one function version out (the token is checked by introspect() here).
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "../../lib/log.js";
import {
  closeConnections,
  connectNats,
  drainOrClose,
  NATS_ACCOUNTS,
  type NatsAccess,
  type QueueLimits,
  WorkQueues,
} from "../../lib/nats/index.js";
import type { IdentitySigner, VerifiedIdentity } from "../../lib/identity/index.js";
import type { IdentityStore } from "./identity-store.js";

export type WorkerAuthMode = "nkey" | "token";

export interface WorkerTrustOptions {
  region: string;
  queue: QueueLimits;
  /**
   * NATS for the queues (APP) and for closing revoked workers' connections (SYS); tests may leave it
   * out. `servers`: how many servers the cluster has (nats.cluster.size), each asked for the
   * connections it holds.
   */
  nats?: { app: NatsAccess; sys?: NatsAccess; servers?: number };
  workerAuth: WorkerAuthMode;
  /** nkey mode: the shared worker nkey seed (read when asked, so a rotation is picked up). */
  workerNkeySeed?: () => string;
  identity: { signer: IdentitySigner; store: IdentityStore };
}

export type Introspection =
  | { active: false; reason: string; failure: "expired" | "invalid" | "revoked" }
  | ({ active: true } & VerifiedIdentity);

export class WorkerTrust {
  readonly signer: IdentitySigner;
  readonly identities: IdentityStore;
  private app: NatsConnection | undefined;
  private sys: NatsConnection | undefined;
  private queues: WorkQueues | undefined;
  /** The instances each reporter last reported live, by reporter. */
  private readonly lastReport = new Map<string, Set<string>>();

  constructor(
    readonly opts: WorkerTrustOptions,
    private readonly logger: Logger,
  ) {
    this.signer = opts.identity.signer;
    this.identities = opts.identity.store;
  }

  async start(): Promise<void> {
    if (!this.opts.nats) return;
    this.app = await connectNats(this.opts.nats.app, "api", this.logger);
    this.queues = new WorkQueues(this.app, this.opts.region, this.opts.queue);
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

  async introspect(token: string): Promise<Introspection> {
    const v = await this.signer.verify(token);
    if ("failure" in v)
      return { active: false, failure: v.failure === "expired" ? "expired" : "invalid", reason: v.reason };
    const rec = await this.identities.get(v.instanceId);
    if (!rec)
      return { active: false, failure: "invalid", reason: "no identity was issued for this instance" };
    if (rec.status === "REVOKED")
      return {
        active: false,
        failure: "revoked",
        reason: `the identity of instance ${v.instanceId} was revoked at ${rec.revokedAt} (${rec.revokedWhy ?? "revoked"})`,
      };
    if (rec.versionId !== v.functionVersionId)
      return {
        active: false,
        failure: "invalid",
        reason: "the token names another version than its instance",
      };
    return { active: true, ...v };
  }

  /**
   * An instance report replaces the reporter's previous one: instances it reports TERMINATED,
   * and those it no longer reports, are gone, and their identities are revoked.
   */
  async onReport(reporter: string, after: Array<{ instanceId: string; status: string }>): Promise<void> {
    const before = this.lastReport.get(reporter) ?? new Set<string>();
    const live = new Set(after.filter((i) => i.status !== "TERMINATED").map((i) => i.instanceId));
    this.lastReport.set(reporter, live);
    const gone = new Set([...before, ...after.map((i) => i.instanceId)].filter((id) => !live.has(id)));
    for (const id of gone) await this.revoke(id, "instance terminated");
  }

  async revoke(instanceId: string, why: string): Promise<boolean> {
    const was = await this.identities.revoke(instanceId, why, new Date().toISOString());
    if (was) {
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
