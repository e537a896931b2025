// The secret store: envelope encryption with two tiers of keys, as the NVCF seed's Encrypted
// Secret Store has them. One MEK (from a MekProvider) wraps one NEK per namespace; NEKs encrypt
// the secret values. A namespace is a function: every version of a function shares its NEK,
// deleting the function deletes its NEK, and a value encrypted for one function cannot be opened
// as another's (different key, and the namespace is in the authenticated data).
//
// Every API replica runs this store against one database. Which MEK is primary lives in the
// database; each replica re-reads it, and reloads its provider, every `refreshMs`, and records a
// heartbeat with the keys it holds. A MEK rotation is a state machine advanced by whichever
// replica's tick gets there first (each step is a conditional update, so only one wins):
//   distributing  the new MEK is decrypt-only; wait at least the grace period (>= 2 x refreshMs)
//                 and until every live replica reports holding it
//   rewrapping    the new MEK is primary; every replica re-wraps NEKs in the background
//   done          no NEK is wrapped with the old MEK, the grace period has passed since the
//                 promotion and every live replica uses the new primary: the old MEK is retired
//                 (and destroyed by the provider, if it can)
// Nothing here logs, returns or counts a plaintext value.
import { randomBytes, randomUUID } from "node:crypto";
import { CallplaneError } from "../../../lib/errors.js";
import { silentLogger, type Logger } from "../../../lib/log.js";
import { Counter, Gauge, createRegistry, type Registry } from "../../../lib/metrics.js";
import {
  EnvelopeError,
  KEY_BYTES,
  aad,
  encodeHeader,
  isValidKeyId,
  nekContext,
  openSecret,
  parseEnvelope,
  sealSecret,
} from "../../../lib/secrets/envelope.js";
import type { MekProvider } from "../../../lib/secrets/mek.js";
import { NekCache } from "./nek-cache.js";
import type { MekRow, NekRow, ReplicaRow, RotationRow, SecretRow, SecretStorage } from "./storage.js";

export type SecretValue = string | Record<string, unknown>;
export interface VersionRef {
  functionId: string;
  versionId: string;
}

export interface SecretStoreOptions {
  storage: SecretStorage;
  provider: MekProvider;
  /** How often this replica reloads its provider and the key states (and beats its heartbeat). */
  refreshMs: number;
  /** Wait at least this long after adding a MEK before promoting it, and after promoting before retiring. */
  rotationGraceMs: number;
  nekCache: { maxEntries: number; ttlMs: number; outageMs: number };
  /** A NEK is replaced (and its secrets re-encrypted) before it encrypts more than this many values. */
  maxNekEncryptions: number;
  replicaId?: string;
  logger?: Logger;
  registry?: Registry;
  now?: () => number;
}

export interface SecretListing {
  name: string;
  createdAt: string;
  updatedAt: string;
  readable?: boolean;
  problem?: string;
}

export interface SecretValues {
  revision: number;
  values: Record<string, SecretValue>;
  unreadable: Array<{ name: string; code: string; problem: string }>;
}

export const namespaceOf = (functionId: string): string => `function:${functionId}`;

const BATCH = 50;
const TICK_BUDGET_MS = 500;

function iso(ms: number | null | undefined): string | undefined {
  return ms === null || ms === undefined ? undefined : new Date(ms).toISOString();
}

export type SecretStore = ReturnType<typeof createSecretStore>;

export function createSecretStore(opts: SecretStoreOptions) {
  const { storage, provider } = opts;
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("secrets", { defaultMetrics: false });
  const now = opts.now ?? Date.now;
  const replicaId = opts.replicaId ?? `${process.pid}-${randomBytes(4).toString("hex")}`;
  const cache = new NekCache(opts.nekCache.maxEntries, opts.nekCache.ttlMs, opts.nekCache.outageMs, now);
  const liveMs = Math.max(3 * opts.refreshMs, opts.refreshMs + 5000);

  const encryptions = new Counter({
    name: "callplane_secret_encryptions_total",
    help: "Secret values and NEKs encrypted, by what",
    labelNames: ["what"],
    registers: [registry],
  });
  const decryptions = new Counter({
    name: "callplane_secret_decryptions_total",
    help: "Secret values decrypted, by result",
    labelNames: ["result"],
    registers: [registry],
  });
  const cacheLookups = new Counter({
    name: "callplane_secret_nek_cache_lookups_total",
    help: "Unwrapped-NEK cache lookups, by result (stale: used past its TTL because the MEK provider failed)",
    labelNames: ["result"],
    registers: [registry],
  });
  const providerErrors = new Counter({
    name: "callplane_secret_mek_provider_errors_total",
    help: "MEK provider failures, by operation",
    labelNames: ["op"],
    registers: [registry],
  });
  const providerUp = new Gauge({
    name: "callplane_secret_mek_provider_up",
    help: "1 when the last MEK provider refresh succeeded",
    registers: [registry],
  });
  const mekGauge = new Gauge({
    name: "callplane_secret_meks",
    help: "MEKs by state",
    labelNames: ["state"],
    registers: [registry],
  });
  const toRewrap = new Gauge({
    name: "callplane_secret_neks_not_under_primary",
    help: "NEKs wrapped with a MEK other than the primary (what a rotation still has to re-wrap)",
    registers: [registry],
  });
  const rewrapped = new Counter({
    name: "callplane_secret_neks_rewrapped_total",
    help: "NEKs re-wrapped under the primary MEK by this replica",
    registers: [registry],
  });
  const reencrypted = new Counter({
    name: "callplane_secret_values_reencrypted_total",
    help: "Secret values moved to a namespace's new NEK by this replica",
    registers: [registry],
  });

  let primaryKid: string | undefined;
  let meks: MekRow[] = [];
  let lastRefresh: { ok: boolean; at: number; error?: string } = { ok: false, at: 0 };
  let lastOnDemandRefresh = 0;
  // NEKs and values that failed this round (unreadable): not retried on every tick
  const rewrapFailed = new Map<string, string>();
  const reencryptFailed = new Map<string, string>();
  let failedSince = now();
  let timer: NodeJS.Timeout | undefined;
  let ticking: Promise<boolean> | undefined;
  let closed = false;

  const unreadable = (detail: string, cause?: unknown) =>
    new CallplaneError("SECRET_UNREADABLE", detail, cause === undefined ? {} : { cause });
  const keyUnavailable = (detail: string, cause?: unknown) =>
    new CallplaneError("SECRET_KEY_UNAVAILABLE", detail, cause === undefined ? {} : { cause });

  async function refreshProvider(): Promise<void> {
    try {
      await provider.refresh();
      lastRefresh = { ok: true, at: now() };
      providerUp.set(1);
    } catch (err) {
      lastRefresh = { ok: false, at: now(), error: (err as Error).message };
      providerUp.set(0);
      providerErrors.inc({ op: "refresh" });
      logger.warn(
        { provider: provider.name, err: (err as Error).message },
        "the MEK provider could not be refreshed; keeping the keys it had",
      );
    }
  }

  async function readStates(): Promise<void> {
    meks = await storage.meks();
    primaryKid = meks.find((m) => m.state === "primary")?.kid;
    for (const s of ["primary", "decrypt-only", "retired"] as const)
      mekGauge.set({ state: s }, meks.filter((m) => m.state === s).length);
  }

  /** A key this replica does not hold yet may have been added moments ago: reload, at most once a second. */
  async function haveKey(kid: string): Promise<boolean> {
    if (provider.keyIds().includes(kid)) return true;
    if (now() - lastOnDemandRefresh < 1000) return false;
    lastOnDemandRefresh = now();
    await refreshProvider();
    return provider.keyIds().includes(kid);
  }

  async function unwrapNek(row: NekRow): Promise<Buffer> {
    let env;
    try {
      env = parseEnvelope(row.wrapped, "nek");
    } catch (err) {
      throw unreadable(`the NEK ${row.nekId} of ${row.namespace} is corrupt: ${(err as Error).message}`);
    }
    if (env.header.nekId !== row.nekId || env.header.mekKid !== row.mekKid)
      throw unreadable(
        `the NEK ${row.nekId} of ${row.namespace} is corrupt: its header names NEK ${env.header.nekId} under MEK ${env.header.mekKid}, its row NEK ${row.nekId} under MEK ${row.mekKid}`,
      );
    if (!(await haveKey(row.mekKid)))
      throw keyUnavailable(
        `the MEK ${row.mekKid} that wraps the NEK of ${row.namespace} is not in the ${provider.name} MEK provider (it has ${provider.keyIds().join(", ") || "no keys"}); restore that key, or wait for this replica to load it`,
      );
    let key: Buffer;
    try {
      key = await provider.unwrap(row.mekKid, env.body, aad(env.headerBytes, nekContext(row.namespace)));
    } catch (err) {
      if (err instanceof EnvelopeError)
        throw unreadable(`the NEK ${row.nekId} of ${row.namespace} cannot be unwrapped: ${err.message}`);
      providerErrors.inc({ op: "unwrap" });
      throw keyUnavailable(
        `the ${provider.name} MEK provider could not unwrap the NEK of ${row.namespace}: ${(err as Error).message}`,
        err,
      );
    }
    if (key.length !== KEY_BYTES)
      throw unreadable(`the NEK ${row.nekId} of ${row.namespace} is not a 256-bit key`);
    return key;
  }

  /** The plaintext NEK: from the cache, else unwrapped (and cached); stale while the provider fails. */
  async function nekKey(row: NekRow): Promise<Buffer> {
    const hit = cache.lookup(row.nekId);
    if (hit.state === "fresh" && hit.namespace === row.namespace) {
      cacheLookups.inc({ result: "hit" });
      return hit.key;
    }
    try {
      const key = await unwrapNek(row);
      cacheLookups.inc({ result: "miss" });
      cache.put(row.nekId, row.namespace, key);
      return key;
    } catch (err) {
      if (
        hit.state === "stale" &&
        hit.namespace === row.namespace &&
        err instanceof CallplaneError &&
        err.code === "SECRET_KEY_UNAVAILABLE"
      ) {
        cacheLookups.inc({ result: "stale" });
        logger.warn(
          { nekId: row.nekId, ageSeconds: Math.round(hit.ageMs / 1000), err: err.message },
          "the MEK provider failed; using the cached NEK past its TTL",
        );
        return hit.key;
      }
      throw err;
    }
  }

  async function newNek(namespace: string, replaceActive: boolean): Promise<{ row: NekRow; key: Buffer }> {
    for (let attempt = 0; attempt < 3; attempt++) {
      if (!primaryKid) await readStates();
      const kid = primaryKid;
      if (!kid) throw keyUnavailable("no MEK is primary yet; the store has not finished starting");
      if (!(await haveKey(kid)))
        throw keyUnavailable(`the primary MEK ${kid} is not in the ${provider.name} MEK provider`);
      const key = randomBytes(KEY_BYTES);
      const nekId = `nek-${randomBytes(8).toString("hex")}`;
      const header = encodeHeader({ kind: "nek", mekKid: kid, nekId });
      let body: Buffer;
      try {
        body = await provider.wrap(kid, key, aad(header, nekContext(namespace)));
      } catch (err) {
        providerErrors.inc({ op: "wrap" });
        throw keyUnavailable(
          `the ${provider.name} MEK provider could not wrap a new NEK: ${(err as Error).message}`,
          err,
        );
      }
      encryptions.inc({ what: "nek" });
      const t = now();
      const row: NekRow = {
        nekId,
        namespace,
        state: "active",
        mekKid: kid,
        wrapped: Buffer.concat([header, body]),
        encryptions: 0,
        createdMs: t,
        wrappedMs: t,
      };
      const r = await storage.insertNek(row, replaceActive);
      if (r === "inserted") {
        cache.put(nekId, namespace, key);
        if (replaceActive)
          logger.info({ namespace, nekId }, "NEK rotated: a new NEK encrypts, the old one is being emptied");
        return { row, key };
      }
      if (r === "exists") {
        // another replica made this namespace's NEK first: use that one
        const other = await storage.activeNek(namespace);
        if (other) return { row: other, key: await nekKey(other) };
      }
      // the primary changed under us (retired-mek): read the states again and retry
      await readStates();
    }
    throw keyUnavailable(`could not create a NEK for ${namespace}; try again`);
  }

  async function activeNek(namespace: string, count: number): Promise<{ row: NekRow; key: Buffer }> {
    const row = await storage.activeNek(namespace);
    if (!row) return newNek(namespace, false);
    if (row.encryptions + count > opts.maxNekEncryptions) {
      logger.info(
        { namespace, nekId: row.nekId, encryptions: row.encryptions },
        "the NEK reached secrets.nek.maxEncryptions: rotating it",
      );
      return newNek(namespace, true);
    }
    return { row, key: await nekKey(row) };
  }

  function parseValue(plaintext: Buffer, where: string): SecretValue {
    let v: unknown;
    try {
      v = JSON.parse(plaintext.toString("utf8"));
    } catch {
      throw unreadable(`${where} decrypted to something that is not a stored value`);
    }
    if (typeof v === "string" || (v !== null && typeof v === "object" && !Array.isArray(v)))
      return v as SecretValue;
    throw unreadable(`${where} decrypted to something that is not a stored value`);
  }

  /** Decrypts one stored secret, checking that it belongs where it is stored. */
  async function decryptRow(row: SecretRow): Promise<SecretValue> {
    const ns = namespaceOf(row.functionId);
    const where = `the secret ${row.name} of version ${row.versionId}`;
    let env;
    try {
      env = parseEnvelope(row.ciphertext, "secret");
    } catch (err) {
      throw unreadable(`${where} is corrupt: ${(err as Error).message}`);
    }
    if (env.header.nekId !== row.nekId)
      throw unreadable(`${where} is corrupt: its header names NEK ${env.header.nekId}, its row ${row.nekId}`);
    const moved = (other: string) =>
      unreadable(`${where} was encrypted for another namespace (${other}), not ${ns}: it was moved`);
    // a fresh cache entry knows its namespace: no need to read the NEK's row
    const hit = cache.lookup(env.header.nekId);
    let key: Buffer;
    if (hit.state === "fresh") {
      if (hit.namespace !== ns) throw moved(hit.namespace);
      cacheLookups.inc({ result: "hit" });
      key = hit.key;
    } else {
      const nek = await storage.nek(env.header.nekId);
      if (!nek)
        throw unreadable(`${where} names the NEK ${env.header.nekId}, which this store does not have`);
      if (nek.namespace !== ns) throw moved(nek.namespace);
      key = await nekKey(nek);
    }
    try {
      return parseValue(
        openSecret(env, key, { namespace: ns, versionId: row.versionId, name: row.name }),
        where,
      );
    } catch (err) {
      if (err instanceof EnvelopeError) throw unreadable(`${where} cannot be decrypted: ${err.message}`);
      throw err;
    }
  }

  async function decryptCounted(row: SecretRow): Promise<SecretValue> {
    try {
      const v = await decryptRow(row);
      decryptions.inc({ result: "ok" });
      return v;
    } catch (err) {
      const code = err instanceof CallplaneError ? err.code : "INTERNAL";
      decryptions.inc({ result: code === "SECRET_KEY_UNAVAILABLE" ? "key_unavailable" : "unreadable" });
      throw err;
    }
  }

  function liveReplicas(all: ReplicaRow[]): ReplicaRow[] {
    const t = now();
    return all.filter((r) => t - r.seenMs <= liveMs);
  }

  const destroyTried = new Set<string>();
  async function destroyRetired(r: RotationRow): Promise<void> {
    if (r.keyDestroyed || destroyTried.has(r.rotationId)) return;
    const victim = r.phase === "aborted" ? r.toKid : r.fromKid;
    if (!provider.destroyKey) return;
    // once per process: a provider that cannot (a read-only keyring) is not asked on every tick
    destroyTried.add(r.rotationId);
    try {
      await provider.destroyKey(victim);
      await storage.markKeyDestroyed(r.rotationId);
      logger.info({ kid: victim, provider: provider.name }, "the retired MEK was removed from the provider");
    } catch (err) {
      providerErrors.inc({ op: "destroy" });
      logger.warn(
        { kid: victim, err: (err as Error).message },
        "could not remove the retired MEK from the provider",
      );
    }
  }

  async function advanceRotation(): Promise<void> {
    const r = await storage.latestRotation();
    if (!r) return;
    if (r.phase === "done" || r.phase === "aborted") return destroyRetired(r);
    const t = now();
    const live = liveReplicas(await storage.replicas());
    if (r.phase === "distributing") {
      if (t < r.promoteAfterMs) return;
      if (!provider.keyIds().includes(r.toKid)) return;
      if (live.some((x) => !x.keyIds.includes(r.toKid))) return;
      if (await storage.promote(r.rotationId, t)) {
        logger.info(
          { kid: r.toKid, previous: r.fromKid },
          "MEK rotation: the new MEK is primary; re-wrapping NEKs",
        );
        await readStates();
      }
      return;
    }
    // rewrapping
    const left = (await storage.neksByMek()).get(r.fromKid) ?? 0;
    if (left > 0) return;
    if (r.promotedMs === null || t < r.promotedMs + opts.rotationGraceMs) return;
    if (live.some((x) => x.primaryKid !== r.toKid)) return;
    if (await storage.retire(r.rotationId, t)) {
      logger.info(
        { kid: r.fromKid, primary: r.toKid, rolledBack: r.rolledBack },
        "MEK rotation done: the old MEK wraps nothing and is retired",
      );
      await readStates();
      const done = await storage.latestRotation();
      if (done) await destroyRetired(done);
    }
  }

  /** Re-wraps NEKs not under the primary MEK. Returns whether more are left. */
  async function rewrapSome(deadline: number): Promise<boolean> {
    const kid = primaryKid;
    if (!kid || !provider.keyIds().includes(kid)) return false;
    const batch = await storage.neksNotUnder(kid, BATCH, new Set(rewrapFailed.keys()));
    for (const n of batch) {
      if (closed || now() > deadline) return true;
      let key: Buffer;
      try {
        key = await nekKey(n);
      } catch (err) {
        // a NEK no secret uses any more is simply removed; one that secrets still use blocks the
        // rotation until they are deleted or its MEK is restored (status says which)
        if (
          (await storage.countSecretsUnderNek(n.nekId)) === 0 &&
          (await storage.deleteNekIfUnused(n.nekId))
        ) {
          cache.drop(n.nekId);
          logger.warn(
            { nekId: n.nekId, namespace: n.namespace },
            "removed an unreadable NEK that no secret used",
          );
          continue;
        }
        rewrapFailed.set(n.nekId, `${n.namespace}: ${(err as Error).message}`);
        logger.warn(
          { nekId: n.nekId, namespace: n.namespace, err: (err as Error).message },
          "cannot re-wrap a NEK",
        );
        continue;
      }
      const header = encodeHeader({ kind: "nek", mekKid: kid, nekId: n.nekId });
      let body: Buffer;
      try {
        body = await provider.wrap(kid, key, aad(header, nekContext(n.namespace)));
      } catch (err) {
        providerErrors.inc({ op: "wrap" });
        logger.warn(
          { err: (err as Error).message },
          "the MEK provider could not re-wrap a NEK; retrying later",
        );
        return false;
      }
      encryptions.inc({ what: "nek" });
      if (await storage.rewrapNek(n.nekId, n.mekKid, kid, Buffer.concat([header, body]), now()))
        rewrapped.inc();
    }
    return batch.length === BATCH;
  }

  /** Moves secrets off retiring NEKs (NEK rotation) and removes NEKs left empty. */
  async function reencryptSome(deadline: number): Promise<boolean> {
    const retiring = await storage.retiringNeks(BATCH);
    let more = false;
    for (const old of retiring) {
      const rows = await storage.secretsUnderNek(old.nekId, BATCH, new Set(reencryptFailed.keys()));
      if (rows.length === 0) {
        if (await storage.deleteNekIfUnused(old.nekId)) {
          cache.drop(old.nekId);
          logger.info(
            { nekId: old.nekId, namespace: old.namespace },
            "the rotated-out NEK is empty and removed",
          );
        }
        continue;
      }
      more ||= rows.length === BATCH;
      const target = await activeNek(old.namespace, rows.length);
      for (const row of rows) {
        if (closed || now() > deadline) return true;
        let value: SecretValue;
        try {
          value = await decryptRow(row);
        } catch (err) {
          reencryptFailed.set(`${row.versionId}/${row.name}`, (err as Error).message);
          continue;
        }
        const ct = sealSecret(
          { id: target.row.nekId, key: target.key },
          { namespace: old.namespace, versionId: row.versionId, name: row.name },
          Buffer.from(JSON.stringify(value), "utf8"),
        );
        encryptions.inc({ what: "secret" });
        if (await storage.reencrypt(row.versionId, row.name, old.nekId, target.row.nekId, ct, now()))
          reencrypted.inc();
      }
    }
    return more;
  }

  async function tickOnce(): Promise<boolean> {
    await refreshProvider();
    await readStates();
    await storage.heartbeat({
      replicaId,
      provider: provider.name,
      keyIds: provider.keyIds(),
      primaryKid: primaryKid ?? null,
      seenMs: now(),
    });
    // failures are retried after a while, not on every tick
    if (now() - failedSince > 60_000) {
      rewrapFailed.clear();
      reencryptFailed.clear();
      failedSince = now();
    }
    await advanceRotation();
    const deadline = now() + TICK_BUDGET_MS;
    const moreRewrap = await rewrapSome(deadline);
    const moreReencrypt = await reencryptSome(deadline);
    const byMek = await storage.neksByMek();
    toRewrap.set([...byMek].filter(([k]) => k !== primaryKid).reduce((a, [, n]) => a + n, 0));
    await storage.pruneReplicas(now() - 86_400_000);
    return moreRewrap || moreReencrypt;
  }

  /** One round of background work; concurrent calls share the round under way. */
  function tick(): Promise<boolean> {
    ticking ??= tickOnce()
      .catch((err: unknown) => {
        logger.warn({ err: (err as Error).message }, "secret store background work failed; retrying");
        return false;
      })
      .finally(() => {
        ticking = undefined;
      });
    return ticking;
  }

  function schedule(ms: number): void {
    if (closed) return;
    if (timer) clearTimeout(timer);
    timer = setTimeout(() => {
      void tick().then((more) => schedule(more ? 20 : opts.refreshMs));
    }, ms);
    timer.unref();
  }

  function validName(name: string): void {
    if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$/.test(name))
      throw new CallplaneError("SECRET_NOT_FOUND", `"${name.slice(0, 64)}" is not a secret name`);
  }

  async function status() {
    const [rotation, replicas, byMek, stats] = await Promise.all([
      storage.latestRotation(),
      storage.replicas(),
      storage.neksByMek(),
      storage.nekStats(),
    ]);
    await readStates();
    const t = now();
    const live = liveReplicas(replicas);
    const waitingFor: string[] = [];
    if (rotation?.phase === "distributing") {
      if (t < rotation.promoteAfterMs)
        waitingFor.push(
          `the grace period: ${Math.ceil((rotation.promoteAfterMs - t) / 1000)} s left (secrets.mek.rotationGraceSeconds)`,
        );
      for (const r of live.filter((x) => !x.keyIds.includes(rotation.toKid)))
        waitingFor.push(`replica ${r.replicaId} has not loaded the new MEK ${rotation.toKid} yet`);
    } else if (rotation?.phase === "rewrapping") {
      const left = byMek.get(rotation.fromKid) ?? 0;
      if (left > 0) waitingFor.push(`${left} NEK(s) still wrapped with ${rotation.fromKid}`);
      if (rotation.promotedMs !== null && t < rotation.promotedMs + opts.rotationGraceMs)
        waitingFor.push(
          `the grace period after the promotion: ${Math.ceil((rotation.promotedMs + opts.rotationGraceMs - t) / 1000)} s left`,
        );
      for (const r of live.filter((x) => x.primaryKid !== rotation.toKid))
        waitingFor.push(`replica ${r.replicaId} still uses ${r.primaryKid ?? "no MEK"} as primary`);
    }
    const blocked = [...rewrapFailed.values()];
    return {
      replicaId,
      provider: {
        name: provider.name,
        keyIds: provider.keyIds(),
        canCreateKeys: typeof provider.createKey === "function",
        canDestroyKeys: typeof provider.destroyKey === "function",
        lastRefresh: {
          ok: lastRefresh.ok,
          at: iso(lastRefresh.at),
          ...(lastRefresh.error ? { error: lastRefresh.error } : {}),
        },
      },
      primaryKid: primaryKid ?? null,
      meks: meks.map((m) => ({
        kid: m.kid,
        state: m.state,
        addedAt: iso(m.addedMs),
        ...(m.promotedMs !== null ? { promotedAt: iso(m.promotedMs) } : {}),
        ...(m.retiredMs !== null ? { retiredAt: iso(m.retiredMs) } : {}),
        neks: byMek.get(m.kid) ?? 0,
        inProvider: provider.keyIds().includes(m.kid),
      })),
      rotation: rotation
        ? {
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
          }
        : null,
      replicas: replicas.map((r) => ({
        id: r.replicaId,
        provider: r.provider,
        keyIds: r.keyIds,
        primaryKid: r.primaryKid,
        seenAt: iso(r.seenMs),
        live: t - r.seenMs <= liveMs,
      })),
      neks: {
        total: stats.total,
        retiring: stats.retiring,
        highestEncryptions: stats.maxEncryptions,
        maxEncryptions: opts.maxNekEncryptions,
        ...(reencryptFailed.size ? { unreadableSecrets: reencryptFailed.size } : {}),
      },
      cache: {
        entries: cache.size,
        maxEntries: opts.nekCache.maxEntries,
        ttlSeconds: opts.nekCache.ttlMs / 1000,
        outageSeconds: opts.nekCache.outageMs / 1000,
      },
      settings: { refreshSeconds: opts.refreshMs / 1000, rotationGraceSeconds: opts.rotationGraceMs / 1000 },
    };
  }

  return {
    replicaId,
    registry,
    /** For benchmarks and tests: the unwrapped-NEK cache. */
    cache,

    /** Loads the provider and the key states; on a new database, makes the provider's first key primary. */
    async start(): Promise<void> {
      await provider.refresh().catch((err: unknown) => {
        throw new Error(`the ${provider.name} MEK provider cannot be read: ${(err as Error).message}`, {
          cause: err,
        });
      });
      lastRefresh = { ok: true, at: now() };
      providerUp.set(1);
      await readStates();
      if (!primaryKid && meks.length === 0) {
        let ids = provider.keyIds();
        if (ids.length === 0 && provider.createKey) ids = [await provider.createKey()];
        if (ids.length === 0)
          throw new Error(
            `the ${provider.name} MEK provider has no key, and the database names none: give the provider a keyring with at least one key`,
          );
        if (await storage.bootstrapMek(ids[0], now()))
          logger.info({ kid: ids[0], provider: provider.name }, "first start: this MEK is primary");
        await readStates();
      }
      if (!primaryKid) throw new Error("the database has MEKs but none is primary; it was edited by hand");
      if (!(await haveKey(primaryKid)))
        throw new Error(
          `the primary MEK ${primaryKid} (from the database) is not in the ${provider.name} MEK provider, which has ${provider.keyIds().join(", ") || "no keys"}: the keyring does not belong to this database, or lost a key. Restore the keyring that goes with this database`,
        );
      await tick();
      schedule(opts.refreshMs);
    },

    async close(): Promise<void> {
      closed = true;
      if (timer) clearTimeout(timer);
      await ticking;
      cache.clear();
      // a replica that stopped must not hold a rotation back until its heartbeat ages out
      await storage.removeReplica(replicaId).catch(() => undefined);
      await provider.close?.();
    },

    tick,

    /** Stores secrets of one version, replacing those with the same names (NVCF's merge). */
    async put(ref: VersionRef, secrets: ReadonlyArray<{ name: string; value: SecretValue }>): Promise<void> {
      const ns = namespaceOf(ref.functionId);
      for (let attempt = 0; attempt < 3; attempt++) {
        const nek = await activeNek(ns, secrets.length);
        const t = now();
        const rows: SecretRow[] = secrets.map((s) => ({
          functionId: ref.functionId,
          versionId: ref.versionId,
          name: s.name,
          nekId: nek.row.nekId,
          ciphertext: sealSecret(
            { id: nek.row.nekId, key: nek.key },
            { namespace: ns, versionId: ref.versionId, name: s.name },
            Buffer.from(JSON.stringify(s.value), "utf8"),
          ),
          createdMs: t,
          updatedMs: t,
        }));
        const r = await storage.putSecrets(rows);
        if (r === "stored") {
          encryptions.inc({ what: "secret" }, rows.length);
          return;
        }
        // the NEK was removed between reading and writing (a concurrent rotation emptied it)
        cache.drop(nek.row.nekId);
      }
      throw keyUnavailable(`the NEK of ${ns} kept changing while storing; try again`);
    },

    async remove(ref: VersionRef, name: string): Promise<boolean> {
      validName(name);
      return storage.deleteSecret(ref.versionId, name);
    },

    async removeVersion(ref: VersionRef): Promise<void> {
      await storage.deleteVersion(ref.versionId);
    },

    /** Deletes every secret of a function and its NEKs (crypto-shredding what any backup still holds). */
    async removeFunction(functionId: string): Promise<void> {
      const ns = namespaceOf(functionId);
      const neks = await storage.activeNek(ns);
      if (neks) cache.drop(neks.nekId);
      await storage.deleteNamespace(ns, functionId);
    },

    /** Secret names by version id (never values). */
    names: (versionIds?: readonly string[]) => storage.names(versionIds),

    revisions: () => storage.revisions(),

    async list(ref: VersionRef, check = false): Promise<SecretListing[]> {
      const rows = await storage.secrets(ref.versionId);
      const out: SecretListing[] = [];
      for (const row of rows) {
        const item: SecretListing = {
          name: row.name,
          createdAt: iso(row.createdMs)!,
          updatedAt: iso(row.updatedMs)!,
        };
        if (check) {
          try {
            await decryptCounted(row);
            item.readable = true;
          } catch (err) {
            item.readable = false;
            item.problem = err instanceof CallplaneError ? `${err.code}: ${err.message}` : "INTERNAL";
          }
        }
        out.push(item);
      }
      return out;
    },

    /** The plaintext values of one version, for the compute agent; unreadable ones are named, not fatal. */
    async values(ref: VersionRef): Promise<SecretValues> {
      const [rows, revisions] = await Promise.all([storage.secrets(ref.versionId), storage.revisions()]);
      const out: SecretValues = { revision: revisions.get(ref.versionId) ?? 0, values: {}, unreadable: [] };
      for (const row of rows) {
        try {
          out.values[row.name] = await decryptCounted(row);
        } catch (err) {
          const e = err instanceof CallplaneError ? err : new CallplaneError("INTERNAL", "internal error");
          logger.warn(
            { versionId: row.versionId, name: row.name, code: e.code, err: e.message },
            "a secret cannot be read",
          );
          out.unreadable.push({ name: row.name, code: e.code, problem: e.message });
        }
      }
      return out;
    },

    /** One secret's value (tests, benchmarks); throws SECRET_NOT_FOUND or SECRET_UNREADABLE. */
    async value(ref: VersionRef, name: string): Promise<SecretValue> {
      const row = await storage.secret(ref.versionId, name);
      if (!row)
        throw new CallplaneError("SECRET_NOT_FOUND", `version ${ref.versionId} has no secret ${name}`);
      return decryptCounted(row);
    },

    status,

    async startMekRotation(keyId?: string) {
      const latest = await storage.latestRotation();
      if (latest && (latest.phase === "distributing" || latest.phase === "rewrapping"))
        throw new CallplaneError(
          "ROTATION_IN_PROGRESS",
          `a MEK rotation to ${latest.toKid} is ${latest.phase}; follow it with \`callplane secrets rotate-mek\` (or GET /v1/admin/secrets/keys), or abort it with \`callplane secrets rotate-mek --abort\``,
        );
      await refreshProvider();
      await readStates();
      const from = primaryKid;
      if (!from) throw keyUnavailable("no MEK is primary; the store has not finished starting");
      let kid: string;
      if (keyId !== undefined) {
        if (!isValidKeyId(keyId))
          throw new CallplaneError("VALIDATION_FAILED", "keyId: must be 1-255 printable ASCII characters", {
            extra: { errors: [{ field: "keyId", message: "not a key id" }] },
          });
        if (!provider.keyIds().includes(keyId))
          throw new CallplaneError(
            "MEK_UNKNOWN",
            `the ${provider.name} MEK provider of this replica has no key ${keyId} (it has ${provider.keyIds().join(", ")}); add the key to every API replica's provider first, then start the rotation`,
          );
        kid = keyId;
      } else if (provider.createKey) {
        kid = await provider.createKey();
      } else {
        throw new CallplaneError(
          "VALIDATION_FAILED",
          `keyId: required with the ${provider.name} MEK provider, which cannot create keys; add a new key to every replica's keyring (\`callplane secrets mek-generate\` makes one), restart them, then rotate with --key-id <kid>`,
          { extra: { errors: [{ field: "keyId", message: "required with this MEK provider" }] } },
        );
      }
      if (meks.some((m) => m.kid === kid))
        throw new CallplaneError(
          "VALIDATION_FAILED",
          `keyId: the MEK ${kid} is already known here (${meks.find((m) => m.kid === kid)!.state}); a rotation needs a new key, and a key id is never reused`,
          { extra: { errors: [{ field: "keyId", message: "already used" }] } },
        );
      const t = now();
      const neksAtStart = (await storage.neksByMek()).get(from) ?? 0;
      const r = await storage.startRotation({
        rotationId: randomUUID(),
        fromKid: from,
        toKid: kid,
        phase: "distributing",
        rolledBack: false,
        startedMs: t,
        promoteAfterMs: t + opts.rotationGraceMs,
        promotedMs: null,
        finishedMs: null,
        neksAtStart,
        keyDestroyed: false,
      });
      if (r === "open")
        throw new CallplaneError("ROTATION_IN_PROGRESS", "another MEK rotation started at the same moment");
      logger.info(
        { kid, previous: from, promoteAfter: iso(t + opts.rotationGraceMs) },
        "MEK rotation started: the new MEK is decrypt-only until every replica has it and the grace period is over",
      );
      schedule(0);
      return status();
    },

    async abortMekRotation() {
      const r = await storage.latestRotation();
      if (!r || r.phase === "done" || r.phase === "aborted")
        throw new CallplaneError(
          "NO_ROTATION",
          "no MEK rotation is in progress; to go back to a previous key, start a new rotation (a retired key id is never reused)",
        );
      if (r.phase === "distributing") {
        if (!(await storage.abortBeforePromotion(r.rotationId, now())))
          throw new CallplaneError(
            "ROTATION_IN_PROGRESS",
            "the rotation moved on meanwhile; run the command again",
          );
        logger.info({ kid: r.toKid }, "MEK rotation aborted before promotion: the new MEK is dropped");
      } else {
        if (r.rolledBack)
          throw new CallplaneError(
            "ROTATION_IN_PROGRESS",
            `this rotation is already being rolled back to ${r.toKid}; wait for it to finish, then start a new one`,
          );
        if (!(await storage.rollBack(r.rotationId, now())))
          throw new CallplaneError(
            "ROTATION_IN_PROGRESS",
            "the rotation moved on meanwhile; run the command again",
          );
        logger.info(
          { primary: r.fromKid, abandoned: r.toKid },
          "MEK rotation rolled back: the previous MEK is primary again; NEKs are re-wrapped back to it",
        );
      }
      schedule(0);
      return status();
    },

    /** Gives namespaces (one function's, or all) a new NEK; their secrets move over in the background. */
    async rotateNeks(functionId?: string): Promise<{ rotated: string[] }> {
      const namespaces = functionId !== undefined ? [namespaceOf(functionId)] : await storage.namespaces();
      const rotated: string[] = [];
      for (const ns of namespaces) {
        if (!(await storage.activeNek(ns))) continue;
        await newNek(ns, true);
        rotated.push(ns);
      }
      schedule(0);
      return { rotated };
    },
  };
}
