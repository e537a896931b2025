// The background work of one replica of the secret store, and the MEK rotation state machine it
// advances. Every API replica runs this against one database: each re-reads which MEK is primary,
// and reloads its provider, every `refreshMs`, and records a heartbeat with the keys it holds. A
// MEK rotation is a state machine advanced by whichever replica's tick gets there first (each step
// is a conditional update, so only one wins):
//   distributing  the new MEK is decrypt-only; wait at least the grace period (>= 2 x refreshMs)
//                 and until every live replica reports holding it
//   rewrapping    the new MEK is primary; every replica re-wraps NEKs in the background
//   done          no NEK is wrapped with the old MEK, the grace period has passed since the
//                 promotion and every live replica uses the new primary: the old MEK is retired
//                 (and destroyed by the provider, if it can)
// A tick also moves secrets off NEKs that a NEK rotation replaced, and removes those NEKs once empty.
import { randomUUID } from "node:crypto";
import { CallplaneError } from "../../../lib/errors.js";
import { encodeHeader, sealSecret } from "../../../lib/secrets/index.js";
import { iso, keyUnavailable, type KeyDeps, type KeyHierarchy } from "./keys.js";
import type { ReplicaRow, RotationRow, SecretRow } from "./storage.js";

const BATCH = 50;
const TICK_BUDGET_MS = 500;
const movedOn = () =>
  new CallplaneError("ROTATION_IN_PROGRESS", "the rotation moved on meanwhile; run the command again");

export interface RotationDeps extends Omit<KeyDeps, "maxNekEncryptions"> {
  keys: KeyHierarchy;
  replicaId: string;
  /** How often this replica reloads its provider and the key states (and beats its heartbeat). */
  refreshMs: number;
  /** Wait at least this long after adding a MEK before promoting it, and after promoting before retiring. */
  rotationGraceMs: number;
  /** Decrypts one stored secret, checked against where it is stored (the store's decryptRow). */
  decrypt: (row: SecretRow) => Promise<unknown>;
}

export class Rotation {
  /** A replica whose heartbeat is older than this is not live. */
  readonly liveMs: number;
  // NEKs and values that failed this round (unreadable): not retried on every tick
  private readonly rewrapFailed = new Map<string, string>();
  private readonly reencryptFailed = new Map<string, string>();
  private failedSince: number;
  private readonly destroyTried = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<boolean> | undefined;
  private closed = false;

  constructor(private readonly d: RotationDeps) {
    this.liveMs = Math.max(3 * d.refreshMs, d.refreshMs + 5000);
    this.failedSince = d.now();
  }

  /** The first round of background work, then one every `refreshMs`. */
  async start(): Promise<void> {
    await this.tick();
    this.schedule(this.d.refreshMs);
  }

  /** Stops the rounds, waiting for the one under way. */
  async stop(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    await this.ticking;
  }

  /** Whether a replica counts at `t`: one that stopped beating is not waited for. */
  isLive(r: ReplicaRow, t: number): boolean {
    return t - r.seenMs <= this.liveMs;
  }

  private liveReplicas(all: ReplicaRow[]): ReplicaRow[] {
    const t = this.d.now();
    return all.filter((r) => this.isLive(r, t));
  }

  private async destroyRetired(r: RotationRow): Promise<void> {
    const { provider, logger } = this.d;
    if (r.keyDestroyed || this.destroyTried.has(r.rotationId)) return;
    const victim = r.phase === "aborted" ? r.toKid : r.fromKid;
    if (!provider.destroyKey) return;
    // once per process: a provider that cannot (a read-only keyring) is not asked on every tick
    this.destroyTried.add(r.rotationId);
    try {
      await provider.destroyKey(victim);
      await this.d.storage.markKeyDestroyed(r.rotationId);
      logger.info({ kid: victim, provider: provider.name }, "the retired MEK was removed from the provider");
    } catch (err) {
      this.d.metrics.providerErrors.inc({ op: "destroy" });
      logger.warn(
        { kid: victim, err: (err as Error).message },
        "could not remove the retired MEK from the provider",
      );
    }
  }

  private async advanceRotation(): Promise<void> {
    const { storage, provider, logger } = this.d;
    const r = await storage.latestRotation();
    if (!r) return;
    if (r.phase === "done" || r.phase === "aborted") return this.destroyRetired(r);
    const t = this.d.now();
    const live = this.liveReplicas(await storage.replicas());
    if (r.phase === "distributing") {
      if (t < r.promoteAfterMs) return;
      if (!provider.keyIds().includes(r.toKid)) return;
      if (live.some((x) => !x.keyIds.includes(r.toKid))) return;
      if (await storage.promote(r.rotationId, t)) {
        logger.info(
          { kid: r.toKid, previous: r.fromKid },
          "MEK rotation: the new MEK is primary; re-wrapping NEKs",
        );
        await this.d.keys.readStates();
      }
      return;
    }
    // rewrapping
    const left = (await storage.neksByMek()).get(r.fromKid) ?? 0;
    if (left > 0) return;
    if (r.promotedMs === null || t < r.promotedMs + this.d.rotationGraceMs) return;
    if (live.some((x) => x.primaryKid !== r.toKid)) return;
    if (await storage.retire(r.rotationId, t)) {
      logger.info(
        { kid: r.fromKid, primary: r.toKid, rolledBack: r.rolledBack },
        "MEK rotation done: the old MEK wraps nothing and is retired",
      );
      await this.d.keys.readStates();
      const done = await storage.latestRotation();
      if (done) await this.destroyRetired(done);
    }
  }

  /** Re-wraps NEKs not under the primary MEK. Returns whether more are left. */
  private async rewrapSome(deadline: number): Promise<boolean> {
    const { storage, provider, logger, metrics, now } = this.d;
    const kid = this.d.keys.primaryKid;
    if (!kid || !provider.keyIds().includes(kid)) return false;
    const batch = await storage.neksNotUnder(kid, BATCH, new Set(this.rewrapFailed.keys()));
    for (const n of batch) {
      if (this.closed || now() > deadline) return true;
      let key: Buffer;
      try {
        key = await this.d.keys.nekKey(n);
      } catch (err) {
        // a NEK no secret uses any more is simply removed; one that secrets still use blocks the
        // rotation until they are deleted or its MEK is restored (status says which)
        if (
          (await storage.countSecretsUnderNek(n.nekId)) === 0 &&
          (await storage.deleteNekIfUnused(n.nekId))
        ) {
          this.d.cache.drop(n.nekId);
          logger.warn(
            { nekId: n.nekId, namespace: n.namespace },
            "removed an unreadable NEK that no secret used",
          );
          continue;
        }
        this.rewrapFailed.set(n.nekId, `${n.namespace}: ${(err as Error).message}`);
        logger.warn(
          { nekId: n.nekId, namespace: n.namespace, err: (err as Error).message },
          "cannot re-wrap a NEK",
        );
        continue;
      }
      const header = encodeHeader({ kind: "nek", mekKid: kid, nekId: n.nekId });
      let wrapped: Buffer;
      try {
        wrapped = await this.d.keys.wrapNek(kid, header, n.namespace, key);
      } catch (err) {
        logger.warn(
          { err: (err as Error).message },
          "the MEK provider could not re-wrap a NEK; retrying later",
        );
        return false;
      }
      if (await storage.rewrapNek(n.nekId, n.mekKid, kid, wrapped, now())) metrics.rewrapped.inc();
    }
    return batch.length === BATCH;
  }

  /** Moves secrets off retiring NEKs (NEK rotation) and removes NEKs left empty. */
  private async reencryptSome(deadline: number): Promise<boolean> {
    const { storage, metrics, now } = this.d;
    const retiring = await storage.retiringNeks(BATCH);
    let more = false;
    for (const old of retiring) {
      const rows = await storage.secretsUnderNek(old.nekId, BATCH, new Set(this.reencryptFailed.keys()));
      if (rows.length === 0) {
        if (await storage.deleteNekIfUnused(old.nekId)) {
          this.d.cache.drop(old.nekId);
          this.d.logger.info(
            { nekId: old.nekId, namespace: old.namespace },
            "the rotated-out NEK is empty and removed",
          );
        }
        continue;
      }
      more ||= rows.length === BATCH;
      const target = await this.d.keys.activeNek(old.namespace, rows.length);
      for (const row of rows) {
        if (this.closed || now() > deadline) return true;
        let value: unknown;
        try {
          value = await this.d.decrypt(row);
        } catch (err) {
          this.reencryptFailed.set(`${row.versionId}/${row.name}`, (err as Error).message);
          continue;
        }
        const ct = sealSecret(
          { id: target.row.nekId, key: target.key },
          { namespace: old.namespace, versionId: row.versionId, name: row.name },
          Buffer.from(JSON.stringify(value), "utf8"),
        );
        metrics.encryptions.inc({ what: "secret" });
        if (await storage.reencrypt(row.versionId, row.name, old.nekId, target.row.nekId, ct, now()))
          metrics.reencrypted.inc();
      }
    }
    return more;
  }

  private async tickOnce(): Promise<boolean> {
    const { storage, provider, keys, now } = this.d;
    await keys.refreshProvider();
    await keys.readStates();
    await storage.heartbeat({
      replicaId: this.d.replicaId,
      provider: provider.name,
      keyIds: provider.keyIds(),
      primaryKid: keys.primaryKid ?? null,
      seenMs: now(),
    });
    // failures are retried after a while, not on every tick
    if (now() - this.failedSince > 60_000) {
      this.rewrapFailed.clear();
      this.reencryptFailed.clear();
      this.failedSince = now();
    }
    await this.advanceRotation();
    const deadline = now() + TICK_BUDGET_MS;
    const moreRewrap = await this.rewrapSome(deadline);
    const moreReencrypt = await this.reencryptSome(deadline);
    const byMek = await storage.neksByMek();
    const primaryKid = keys.primaryKid;
    this.d.metrics.toRewrap.set([...byMek].filter(([k]) => k !== primaryKid).reduce((a, [, n]) => a + n, 0));
    await storage.pruneReplicas(now() - 86_400_000);
    return moreRewrap || moreReencrypt;
  }

  /** One round of background work; concurrent calls share the round under way. */
  tick(): Promise<boolean> {
    this.ticking ??= this.tickOnce()
      .catch((err: unknown) => {
        this.d.logger.warn({ err: (err as Error).message }, "secret store background work failed; retrying");
        return false;
      })
      .finally(() => {
        this.ticking = undefined;
      });
    return this.ticking;
  }

  /** The next round in `ms` (0: now, after a change an operator asked for). */
  schedule(ms: number): void {
    if (this.closed) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      void this.tick().then((more) => this.schedule(more ? 20 : this.d.refreshMs));
    }, ms);
    this.timer.unref();
  }

  /** Opens a MEK rotation to `keyId` (or to a key the provider creates); the ticks carry it out. */
  async startMekRotation(keyId?: string): Promise<void> {
    const { storage, keys, logger } = this.d;
    const latest = await storage.latestRotation();
    if (latest && (latest.phase === "distributing" || latest.phase === "rewrapping"))
      throw new CallplaneError(
        "ROTATION_IN_PROGRESS",
        `a MEK rotation to ${latest.toKid} is ${latest.phase}; follow it with \`callplane secrets rotate-mek\` (or GET /v1/admin/secrets/keys), or abort it with \`callplane secrets rotate-mek --abort\``,
      );
    await keys.refreshProvider();
    await keys.readStates();
    const from = keys.primaryKid;
    if (!from) throw keyUnavailable("no MEK is primary; the store has not finished starting");
    const kid = await keys.nextMek(keyId);
    const t = this.d.now();
    const neksAtStart = (await storage.neksByMek()).get(from) ?? 0;
    const r = await storage.startRotation({
      rotationId: randomUUID(),
      fromKid: from,
      toKid: kid,
      phase: "distributing",
      rolledBack: false,
      startedMs: t,
      promoteAfterMs: t + this.d.rotationGraceMs,
      promotedMs: null,
      finishedMs: null,
      neksAtStart,
      keyDestroyed: false,
    });
    if (r === "open")
      throw new CallplaneError("ROTATION_IN_PROGRESS", "another MEK rotation started at the same moment");
    logger.info(
      { kid, previous: from, promoteAfter: iso(t + this.d.rotationGraceMs) },
      "MEK rotation started: the new MEK is decrypt-only until every replica has it and the grace period is over",
    );
    this.schedule(0);
  }

  /** Drops the new MEK before its promotion, or rolls back to the previous one after it. */
  async abortMekRotation(): Promise<void> {
    const { storage, logger, now } = this.d;
    const r = await storage.latestRotation();
    if (!r || r.phase === "done" || r.phase === "aborted")
      throw new CallplaneError(
        "NO_ROTATION",
        "no MEK rotation is in progress; to go back to a previous key, start a new rotation (a retired key id is never reused)",
      );
    if (r.phase === "distributing") {
      if (!(await storage.abortBeforePromotion(r.rotationId, now()))) throw movedOn();
      logger.info({ kid: r.toKid }, "MEK rotation aborted before promotion: the new MEK is dropped");
    } else {
      if (r.rolledBack)
        throw new CallplaneError(
          "ROTATION_IN_PROGRESS",
          `this rotation is already being rolled back to ${r.toKid}; wait for it to finish, then start a new one`,
        );
      if (!(await storage.rollBack(r.rotationId, now()))) throw movedOn();
      logger.info(
        { primary: r.fromKid, abandoned: r.toKid },
        "MEK rotation rolled back: the previous MEK is primary again; NEKs are re-wrapped back to it",
      );
    }
    this.schedule(0);
  }

  /** The rotation part of the store's status: where the latest rotation is and what it waits for. */
  describe(
    rotation: RotationRow | undefined,
    replicas: ReplicaRow[],
    byMek: ReadonlyMap<string, number>,
    t: number,
  ) {
    if (!rotation) return null;
    const live = replicas.filter((r) => this.isLive(r, t));
    const grace = this.d.rotationGraceMs;
    const waitingFor: string[] = [];
    if (rotation.phase === "distributing") {
      if (t < rotation.promoteAfterMs)
        waitingFor.push(
          `the grace period: ${Math.ceil((rotation.promoteAfterMs - t) / 1000)} s left (secrets.mek.rotationGraceSeconds)`,
        );
      for (const r of live.filter((x) => !x.keyIds.includes(rotation.toKid)))
        waitingFor.push(`replica ${r.replicaId} has not loaded the new MEK ${rotation.toKid} yet`);
    } else if (rotation.phase === "rewrapping") {
      const left = byMek.get(rotation.fromKid) ?? 0;
      if (left > 0) waitingFor.push(`${left} NEK(s) still wrapped with ${rotation.fromKid}`);
      if (rotation.promotedMs !== null && t < rotation.promotedMs + grace)
        waitingFor.push(
          `the grace period after the promotion: ${Math.ceil((rotation.promotedMs + grace - t) / 1000)} s left`,
        );
      for (const r of live.filter((x) => x.primaryKid !== rotation.toKid))
        waitingFor.push(`replica ${r.replicaId} still uses ${r.primaryKid ?? "no MEK"} as primary`);
    }
    const blocked = [...this.rewrapFailed.values()];
    return {
      id: rotation.rotationId,
      phase: rotation.phase,
      fromKid: rotation.fromKid,
      toKid: rotation.toKid,
      rolledBack: rotation.rolledBack,
      startedAt: iso(rotation.startedMs),
      promoteAfter: iso(rotation.promoteAfterMs),
      ...(rotation.promotedMs !== null ? { promotedAt: iso(rotation.promotedMs) } : {}),
      ...(rotation.finishedMs !== null ? { finishedAt: iso(rotation.finishedMs) } : {}),
      neksAtStart: rotation.neksAtStart,
      neksLeft:
        rotation.phase === "rewrapping"
          ? (byMek.get(rotation.fromKid) ?? 0)
          : rotation.phase === "distributing"
            ? rotation.neksAtStart
            : 0,
      keyDestroyed: rotation.keyDestroyed,
      waitingFor,
      ...(blocked.length ? { blockedBy: blocked } : {}),
    };
  }

  /** How many secrets the NEK rotation could not read this round. */
  get unreadableSecrets(): number {
    return this.reencryptFailed.size;
  }
}
