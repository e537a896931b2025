// Workers on the Kubernetes backend prove who they are with their pod's projected token, which their
// cluster signed. This module is the API's side of that (issue 21; upstream's ICMS verifier with the
// gaps its review found closed):
// - each cluster's keys, as its compute agent (or an admin) registered them, cached briefly so that a
//   login costs no query for them; a token signed by a key the cache does not hold looks again at
//   once (a rotation pushed to another replica is seen without waiting for the cache);
// - a worker's token checked against them (lib/identity/pod-token.ts: size, audience, algorithm,
//   signature, issuer, times, the worker's account and pod), then against the live instance its
//   compute agent reported: the same service account (sub and uid, which upstream stored but never
//   compared), the same pod (name and uid), reported by that cluster's agent. The instance is looked
//   up on every login, never cached: an instance's end refuses its worker at once on every replica.
// - the proof an agent gives when it pushes new keys: its own token, verified by the keys on record.
import { createHash } from "node:crypto";
import {
  clusterAudience,
  verifyClusterToken,
  WORKER_ACCOUNT_PREFIX,
  workerOf,
  type ClusterKeys,
  type ClusterTokenClaims,
  type PodTokenFailure,
  type PublicJwk,
  type VerifiedIdentity,
} from "../../lib/identity/index.js";
import type { Store } from "./store/types.js";

/** A refusal, with why (logged) and how it is reported (the webhook's error code). */
export interface WorkerTokenRefusal {
  active: false;
  failure: "expired" | "invalid" | "revoked";
  reason: string;
  /** The pod-token check that refused it (a verification failure, or the instance check). */
  check: PodTokenFailure | "instance";
  clusterId?: string;
  subject?: string;
}

/** Who a verified pod token's worker is: the same fields as an identity the API signed, plus its cluster and pod. */
export type PodTokenIdentity = { active: true } & VerifiedIdentity & {
    clusterId: string;
    pod: { name: string; uid: string };
  };

/** The compute agent of a Kubernetes cluster reports its instances as this reporter. */
export const CLUSTER_REPORTER_PREFIX = "kubernetes-";
export const clusterReporter = (clusterId: string) => `${CLUSTER_REPORTER_PREFIX}${clusterId}`;

/** How long a replica trusts the key set it read (a rotation elsewhere is seen at the next unknown kid anyway). */
const KEYS_CACHE_MS = 5_000;
/** An unknown kid reads the keys again, at most this often per cluster (a flood of forged kids costs one query a second). */
const KEYS_RELOAD_MIN_MS = 1_000;
/**
 * Clusters whose keys (or whose absence) are remembered: past this, entries older than the cache's
 * life go, then clusters without keys (a flood of tokens naming made-up clusters must not grow it).
 */
const KEYS_MAX = 1_024;
/** Verified tokens remembered (only the crypto is spared: the instance is checked on every login). */
const VERIFIED_MAX = 10_000;

/** A verified token, with the key and issuer that vouched for it (a hit is taken only while both are on record). */
interface VerifiedToken {
  claims: ClusterTokenClaims;
  key: string;
}

/** What makes a registered key the same key (its public members), so that a reloaded set still matches. */
const keyMaterial = (k: PublicJwk) => JSON.stringify([k.kty, k.alg, k.n, k.e, k.crv, k.x, k.y]);

interface CachedKeys {
  keys: ClusterKeys | undefined;
  readAt: number;
}

export class PodTokens {
  private readonly keys = new Map<string, CachedKeys>();
  private readonly verified = new Map<string, VerifiedToken>();

  constructor(
    private readonly store: Store,
    private readonly now: () => number = Date.now,
  ) {}

  /** A pushed key set replaces the cached one now (this replica), not after the cache's life. */
  forget(clusterId: string): void {
    this.keys.delete(clusterId);
    for (const [h, v] of this.verified) if (v.claims.clusterId === clusterId) this.verified.delete(h);
  }

  private async keysOf(clusterId: string, fresh = false): Promise<ClusterKeys | undefined> {
    const c = this.keys.get(clusterId);
    if (c && !fresh && this.now() - c.readAt < KEYS_CACHE_MS) return c.keys;
    if (c && fresh && this.now() - c.readAt < KEYS_RELOAD_MIN_MS) return c.keys;
    const r = await this.store.clusterKeys(clusterId);
    const keys = r && { clusterId, issuer: r.issuer, jwks: r.jwks };
    if (!this.keys.has(clusterId) && this.keys.size >= KEYS_MAX) this.sweepKeys();
    this.keys.set(clusterId, { keys, readAt: this.now() });
    return keys;
  }

  private sweepKeys(): void {
    const now = this.now();
    for (const [id, c] of this.keys) if (now - c.readAt >= KEYS_CACHE_MS) this.keys.delete(id);
    if (this.keys.size >= KEYS_MAX) for (const [id, c] of this.keys) if (!c.keys) this.keys.delete(id);
    // (still full: that many enrolled clusters read within the cache's life; the oldest go)
    if (this.keys.size >= KEYS_MAX)
      for (const id of [...this.keys.keys()].slice(0, KEYS_MAX / 2)) this.keys.delete(id);
  }

  /** Verifies a token of a cluster (signature, audience, issuer, times), reading the keys again once for an unknown key. */
  async verify(token: string): Promise<{ ok: true; claims: ClusterTokenClaims } | WorkerTokenRefusal> {
    const hash = createHash("sha256").update(token).digest("base64url");
    const seen = this.verified.get(hash);
    // a hit stands only while the key and issuer that verified it are still the cluster's (as this
    // replica last read them): keys replaced on another replica end it when this one reads them again,
    // not when the token says it expires (a token signed with a leaked key says what it likes)
    if (seen && seen.claims.expiresAt * 1000 > this.now()) {
      const c = seen.claims;
      const keys = await this.keysOf(c.clusterId);
      const key = keys?.jwks.keys.find((k) => k.kid === c.keyId);
      if (keys?.issuer === c.issuer && key && keyMaterial(key) === seen.key) return { ok: true, claims: c };
    }
    if (seen) this.verified.delete(hash);
    let r = await verifyClusterToken(token, (id) => this.keysOf(id), { now: this.now() });
    if (!r.ok && (r.failure === "signature" || r.failure === "issuer" || r.failure === "unknown-cluster"))
      r = await verifyClusterToken(token, (id) => this.keysOf(id, true), { now: this.now() });
    if (!r.ok)
      return {
        active: false,
        failure: r.failure === "expired" ? "expired" : "invalid",
        reason: r.reason,
        check: r.failure,
        ...(r.clusterId ? { clusterId: r.clusterId } : {}),
      };
    // the key that verified it, as the cache holds it now (verifyClusterToken read it from there)
    const key = this.keys.get(r.claims.clusterId)?.keys?.jwks.keys.find((k) => k.kid === r.claims.keyId);
    if (key) {
      if (this.verified.size >= VERIFIED_MAX) this.sweep();
      this.verified.set(hash, { claims: r.claims, key: keyMaterial(key) });
    }
    return r;
  }

  private sweep(): void {
    const now = this.now();
    for (const [h, v] of this.verified) if (v.claims.expiresAt * 1000 <= now) this.verified.delete(h);
    // still full of live tokens: forget the oldest half (a Map iterates in insertion order)
    if (this.verified.size >= VERIFIED_MAX)
      for (const h of [...this.verified.keys()].slice(0, VERIFIED_MAX / 2)) this.verified.delete(h);
  }

  /** A worker's pod token: who it is, checked against the live instance its cluster's agent reported. */
  async introspect(token: string): Promise<PodTokenIdentity | WorkerTokenRefusal> {
    const v = await this.verify(token);
    if (!("ok" in v)) return v;
    const c = v.claims;
    const w = workerOf(c);
    if (!w.ok)
      return {
        active: false,
        failure: "invalid",
        reason: w.reason,
        check: w.failure,
        clusterId: c.clusterId,
        subject: c.subject,
      };
    const worker = w.worker;
    const refuse = (
      reason: string,
      failure: WorkerTokenRefusal["failure"] = "invalid",
    ): WorkerTokenRefusal => ({
      active: false,
      failure,
      reason,
      check: "instance",
      clusterId: c.clusterId,
      subject: c.subject,
    });
    const inst = await this.store.workerAuthBySubject(worker.subject, clusterReporter(c.clusterId));
    if (!inst)
      return refuse(
        `no live instance has the service account ${worker.subject}: its pod was deleted, its instance ended, or the compute agent has not reported it yet`,
        "revoked",
      );
    const auth = inst.workerAuth;
    if (inst.reporter !== clusterReporter(c.clusterId))
      return refuse(
        `instance ${inst.instanceId} was reported by ${inst.reporter}, not by the compute agent of cluster ${c.clusterId} whose key signed the token`,
      );
    if (!("sub" in auth)) return refuse(`instance ${inst.instanceId} has no pod identity`);
    if (auth.saUid !== worker.serviceAccount.uid)
      return refuse(
        `the token's service account ${worker.serviceAccount.name} has uid ${worker.serviceAccount.uid}, not ${auth.saUid} of instance ${inst.instanceId}: the account was deleted and made again under the same name`,
      );
    if (!auth.workerIdentifiers.some((p) => p.name === worker.pod.name && p.uid === worker.pod.uid))
      return refuse(
        `the token is bound to pod ${worker.pod.name} (uid ${worker.pod.uid}), which is not the pod of instance ${inst.instanceId}: the pod was deleted and made again, or the token belongs to another pod`,
        "revoked",
      );
    return {
      active: true,
      instanceId: inst.instanceId,
      functionId: inst.functionId,
      functionVersionId: inst.versionId,
      deploymentId: inst.deploymentId,
      subject: worker.subject,
      audience: clusterAudience(c.clusterId),
      issuer: c.issuer,
      tokenId: createHash("sha256").update(token).digest("base64url").slice(0, 22),
      issuedAt: c.issuedAt ?? 0,
      expiresAt: c.expiresAt,
      clusterId: c.clusterId,
      pod: worker.pod,
    };
  }

  /**
   * An agent's proof of its cluster (a key push, an instance report): one of `proofs` verifies against
   * `keys` (those on record; at an enrollment, the ones enrolled), is not a worker's token (a worker
   * pod must not speak for its cluster), and is the agent's own when one is pinned. The subject of
   * the proof that passed, or why each was refused.
   */
  async proveCluster(
    keys: ClusterKeys & { agentSubject?: string | undefined },
    proofs: readonly string[],
  ): Promise<{ ok: true; subject: string } | { ok: false; reasons: string[] }> {
    const reasons: string[] = [];
    for (const [i, proof] of proofs.entries()) {
      const r = await verifyClusterToken(proof, (id) => (id === keys.clusterId ? keys : undefined), {
        now: this.now(),
      });
      if (!r.ok) reasons.push(`proof ${i}: ${r.reason}`);
      else if (r.claims.subject.split(":").at(-1)?.startsWith(WORKER_ACCOUNT_PREFIX))
        reasons.push(
          `proof ${i}: a worker's token (${r.claims.subject}); only the cluster's compute agent proves it`,
        );
      else if (keys.agentSubject !== undefined && r.claims.subject !== keys.agentSubject)
        reasons.push(
          `proof ${i}: a token of ${r.claims.subject}, not of the cluster's compute agent ${keys.agentSubject} (pinned by its first proof; enrolling again with an admin credential resets it)`,
        );
      else return { ok: true, subject: r.claims.subject };
    }
    if (!proofs.length) reasons.push("no proof was sent (the agent's own projected token)");
    return { ok: false, reasons };
  }
}
