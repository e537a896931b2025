// The two tiers of keys of the secret store: the MEKs a MekProvider holds, whose states (which one
// is primary) live in the database, and the per-namespace NEKs they wrap. This module reloads the
// provider and the key states, unwraps NEKs (through the unwrapped-NEK cache, used past its TTL
// while the provider fails), finds the NEK a secret names, makes a namespace's NEK or replaces it
// once it has encrypted too much, wraps NEKs under a MEK, and picks the MEK a rotation goes to.
// The other modules of the store share its error makers and `iso`.
import { randomBytes } from "node:crypto";
import { CallplaneError } from "../../../lib/errors.js";
import type { Logger } from "../../../lib/log.js";
import {
  EnvelopeError,
  KEY_BYTES,
  aad,
  encodeHeader,
  isValidKeyId,
  nekContext,
  parseEnvelope,
} from "../../../lib/secrets/index.js";
import type { MekProvider } from "../../../lib/secrets/index.js";
import type { SecretMetrics } from "./metrics.js";
import type { NekCache } from "./nek-cache.js";
import type { MekRow, NekRow, SecretStorage } from "./storage.js";

export function iso(ms: number | null | undefined): string | undefined {
  return ms === null || ms === undefined ? undefined : new Date(ms).toISOString();
}

export const unreadable = (detail: string, cause?: unknown) =>
  new CallplaneError("SECRET_UNREADABLE", detail, cause === undefined ? {} : { cause });
export const keyUnavailable = (detail: string, cause?: unknown) =>
  new CallplaneError("SECRET_KEY_UNAVAILABLE", detail, cause === undefined ? {} : { cause });

export interface KeyDeps {
  storage: SecretStorage;
  provider: MekProvider;
  cache: NekCache;
  metrics: SecretMetrics;
  logger: Logger;
  now: () => number;
  /** A NEK is replaced (and its secrets re-encrypted) before it encrypts more than this many values. */
  maxNekEncryptions: number;
}

/** The MEK/NEK hierarchy of one replica: what it last read of the key states, and how to use them. */
export class KeyHierarchy {
  private primary: string | undefined;
  private known: MekRow[] = [];
  /** How the last provider refresh went (for the status). */
  private lastRefresh: { ok: boolean; at: number; error?: string } = { ok: false, at: 0 };
  private lastOnDemandRefresh = 0;

  constructor(private readonly d: KeyDeps) {}

  /** The primary MEK as last read from the database. */
  get primaryKid(): string | undefined {
    return this.primary;
  }

  /** Every MEK the database names, as last read. */
  get meks(): readonly MekRow[] {
    return this.known;
  }

  /** Loads the provider and the key states; on a new database, makes the provider's first key primary. */
  async load(): Promise<void> {
    const { provider, storage, logger } = this.d;
    await provider.refresh().catch((err: unknown) => {
      throw new Error(`the ${provider.name} MEK provider cannot be read: ${(err as Error).message}`, {
        cause: err,
      });
    });
    this.lastRefresh = { ok: true, at: this.d.now() };
    this.d.metrics.providerUp.set(1);
    await this.readStates();
    if (!this.primary && this.known.length === 0) {
      let ids = provider.keyIds();
      if (ids.length === 0 && provider.createKey) ids = [await provider.createKey()];
      if (ids.length === 0)
        throw new Error(
          `the ${provider.name} MEK provider has no key, and the database names none: give the provider a keyring with at least one key`,
        );
      if (await storage.bootstrapMek(ids[0], this.d.now()))
        logger.info({ kid: ids[0], provider: provider.name }, "first start: this MEK is primary");
      await this.readStates();
    }
    const primaryKid = this.primary;
    if (!primaryKid) throw new Error("the database has MEKs but none is primary; it was edited by hand");
    if (!(await this.haveKey(primaryKid)))
      throw new Error(
        `the primary MEK ${primaryKid} (from the database) is not in the ${provider.name} MEK provider, which has ${provider.keyIds().join(", ") || "no keys"}: the keyring does not belong to this database, or lost a key. Restore the keyring that goes with this database`,
      );
  }

  async refreshProvider(): Promise<void> {
    const { provider, metrics } = this.d;
    try {
      await provider.refresh();
      this.lastRefresh = { ok: true, at: this.d.now() };
      metrics.providerUp.set(1);
    } catch (err) {
      this.lastRefresh = { ok: false, at: this.d.now(), error: (err as Error).message };
      metrics.providerUp.set(0);
      metrics.providerErrors.inc({ op: "refresh" });
      this.d.logger.warn(
        { provider: provider.name, err: (err as Error).message },
        "the MEK provider could not be refreshed; keeping the keys it had",
      );
    }
  }

  async readStates(): Promise<void> {
    this.known = await this.d.storage.meks();
    this.primary = this.known.find((m) => m.state === "primary")?.kid;
    for (const s of ["primary", "decrypt-only", "retired"] as const)
      this.d.metrics.mekGauge.set({ state: s }, this.known.filter((m) => m.state === s).length);
  }

  /** A key this replica does not hold yet may have been added moments ago: reload, at most once a second. */
  async haveKey(kid: string): Promise<boolean> {
    const { provider, now } = this.d;
    if (provider.keyIds().includes(kid)) return true;
    if (now() - this.lastOnDemandRefresh < 1000) return false;
    this.lastOnDemandRefresh = now();
    await this.refreshProvider();
    return provider.keyIds().includes(kid);
  }

  async unwrapNek(row: NekRow): Promise<Buffer> {
    const { provider } = this.d;
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
    if (!(await this.haveKey(row.mekKid)))
      throw keyUnavailable(
        `the MEK ${row.mekKid} that wraps the NEK of ${row.namespace} is not in the ${provider.name} MEK provider (it has ${provider.keyIds().join(", ") || "no keys"}); restore that key, or wait for this replica to load it`,
      );
    let key: Buffer;
    try {
      key = await provider.unwrap(row.mekKid, env.body, aad(env.headerBytes, nekContext(row.namespace)));
    } catch (err) {
      if (err instanceof EnvelopeError)
        throw unreadable(`the NEK ${row.nekId} of ${row.namespace} cannot be unwrapped: ${err.message}`);
      this.d.metrics.providerErrors.inc({ op: "unwrap" });
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
  async nekKey(row: NekRow): Promise<Buffer> {
    const { cache, metrics } = this.d;
    const hit = cache.lookup(row.nekId);
    if (hit.state === "fresh" && hit.namespace === row.namespace) {
      metrics.cacheLookups.inc({ result: "hit" });
      return hit.key;
    }
    try {
      const key = await this.unwrapNek(row);
      metrics.cacheLookups.inc({ result: "miss" });
      cache.put(row.nekId, row.namespace, key);
      return key;
    } catch (err) {
      if (
        hit.state === "stale" &&
        hit.namespace === row.namespace &&
        err instanceof CallplaneError &&
        err.code === "SECRET_KEY_UNAVAILABLE"
      ) {
        metrics.cacheLookups.inc({ result: "stale" });
        this.d.logger.warn(
          { nekId: row.nekId, ageSeconds: Math.round(hit.ageMs / 1000), err: err.message },
          "the MEK provider failed; using the cached NEK past its TTL",
        );
        return hit.key;
      }
      throw err;
    }
  }

  /** A NEK as stored: its `header`, then its key wrapped under the MEK `kid`. A provider failure is counted and rethrown. */
  async wrapNek(kid: string, header: Buffer, namespace: string, key: Buffer): Promise<Buffer> {
    let body: Buffer;
    try {
      body = await this.d.provider.wrap(kid, key, aad(header, nekContext(namespace)));
    } catch (err) {
      this.d.metrics.providerErrors.inc({ op: "wrap" });
      throw err;
    }
    this.d.metrics.encryptions.inc({ what: "nek" });
    return Buffer.concat([header, body]);
  }

  /** The plaintext NEK that a secret of `namespace` names, refused if the NEK belongs elsewhere. */
  async secretKey(nekId: string, namespace: string, where: string): Promise<Buffer> {
    const moved = (other: string) =>
      unreadable(`${where} was encrypted for another namespace (${other}), not ${namespace}: it was moved`);
    // a fresh cache entry knows its namespace: no need to read the NEK's row
    const hit = this.d.cache.lookup(nekId);
    if (hit.state === "fresh") {
      if (hit.namespace !== namespace) throw moved(hit.namespace);
      this.d.metrics.cacheLookups.inc({ result: "hit" });
      return hit.key;
    }
    const nek = await this.d.storage.nek(nekId);
    if (!nek) throw unreadable(`${where} names the NEK ${nekId}, which this store does not have`);
    if (nek.namespace !== namespace) throw moved(nek.namespace);
    return this.nekKey(nek);
  }

  async newNek(namespace: string, replaceActive: boolean): Promise<{ row: NekRow; key: Buffer }> {
    const { provider, storage } = this.d;
    for (let attempt = 0; attempt < 3; attempt++) {
      if (!this.primary) await this.readStates();
      const kid = this.primary;
      if (!kid) throw keyUnavailable("no MEK is primary yet; the store has not finished starting");
      if (!(await this.haveKey(kid)))
        throw keyUnavailable(`the primary MEK ${kid} is not in the ${provider.name} MEK provider`);
      const key = randomBytes(KEY_BYTES);
      const nekId = `nek-${randomBytes(8).toString("hex")}`;
      const header = encodeHeader({ kind: "nek", mekKid: kid, nekId });
      let wrapped: Buffer;
      try {
        wrapped = await this.wrapNek(kid, header, namespace, key);
      } catch (err) {
        throw keyUnavailable(
          `the ${provider.name} MEK provider could not wrap a new NEK: ${(err as Error).message}`,
          err,
        );
      }
      const t = this.d.now();
      const row: NekRow = {
        nekId,
        namespace,
        state: "active",
        mekKid: kid,
        wrapped,
        encryptions: 0,
        createdMs: t,
        wrappedMs: t,
      };
      const r = await storage.insertNek(row, replaceActive);
      if (r === "inserted") {
        this.d.cache.put(nekId, namespace, key);
        if (replaceActive)
          this.d.logger.info(
            { namespace, nekId },
            "NEK rotated: a new NEK encrypts, the old one is being emptied",
          );
        return { row, key };
      }
      if (r === "exists") {
        // another replica made this namespace's NEK first: use that one
        const other = await storage.activeNek(namespace);
        if (other) return { row: other, key: await this.nekKey(other) };
      }
      // the primary changed under us (retired-mek): read the states again and retry
      await this.readStates();
    }
    throw keyUnavailable(`could not create a NEK for ${namespace}; try again`);
  }

  /** The NEK that encrypts `count` more values of a namespace: made on first use, replaced when worn. */
  async activeNek(namespace: string, count: number): Promise<{ row: NekRow; key: Buffer }> {
    const row = await this.d.storage.activeNek(namespace);
    if (!row) return this.newNek(namespace, false);
    if (row.encryptions + count > this.d.maxNekEncryptions) {
      this.d.logger.info(
        { namespace, nekId: row.nekId, encryptions: row.encryptions },
        "the NEK reached secrets.nek.maxEncryptions: rotating it",
      );
      return this.newNek(namespace, true);
    }
    return { row, key: await this.nekKey(row) };
  }

  /**
   * The MEK a rotation goes to: `keyId`, which this replica's provider must hold, or else a key the
   * provider creates. Either way a key the database already knows is refused: ids are never reused.
   */
  async nextMek(keyId: string | undefined): Promise<string> {
    const { provider } = this.d;
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
    const known = this.known.find((m) => m.kid === kid);
    if (known)
      throw new CallplaneError(
        "VALIDATION_FAILED",
        `keyId: the MEK ${kid} is already known here (${known.state}); a rotation needs a new key, and a key id is never reused`,
        { extra: { errors: [{ field: "keyId", message: "already used" }] } },
      );
    return kid;
  }

  /** The provider and MEK parts of the store's status. */
  providerStatus() {
    const { provider } = this.d;
    const last = this.lastRefresh;
    return {
      name: provider.name,
      keyIds: provider.keyIds(),
      canCreateKeys: typeof provider.createKey === "function",
      canDestroyKeys: typeof provider.destroyKey === "function",
      lastRefresh: { ok: last.ok, at: iso(last.at), ...(last.error ? { error: last.error } : {}) },
    };
  }

  mekStatus(byMek: ReadonlyMap<string, number>) {
    const { provider } = this.d;
    return this.known.map((m) => ({
      kid: m.kid,
      state: m.state,
      addedAt: iso(m.addedMs),
      ...(m.promotedMs !== null ? { promotedAt: iso(m.promotedMs) } : {}),
      ...(m.retiredMs !== null ? { retiredAt: iso(m.retiredMs) } : {}),
      neks: byMek.get(m.kid) ?? 0,
      inProvider: provider.keyIds().includes(m.kid),
    }));
  }
}
