// The secret store: envelope encryption with two tiers of keys, as the NVCF seed's Encrypted
// Secret Store has them. One MEK (from a MekProvider) wraps one NEK per namespace; NEKs encrypt
// the secret values. A namespace is a function: every version of a function shares its NEK,
// deleting the function deletes its NEK, and a value encrypted for one function cannot be opened
// as another's (different key, and the namespace is in the authenticated data).
//
// Every API replica runs this store against one database. Which MEK is primary lives in the
// database; each replica re-reads it, and reloads its provider, every `refreshMs`, and records a
// heartbeat with the keys it holds. This module is the store's public face: storing, listing,
// reading and deleting secrets, and the status report. The keys live in keys.ts, the background
// work and the MEK rotation state machine in rotation.ts.
// Nothing here logs, returns or counts a plaintext value.
import { randomBytes } from "node:crypto";
import { CallplaneError } from "../../../lib/errors.js";
import { silentLogger, type Logger } from "../../../lib/log.js";
import { createRegistry, type Registry } from "../../../lib/metrics.js";
import { EnvelopeError, openSecret, parseEnvelope, sealSecret } from "../../../lib/secrets/index.js";
import type { MekProvider } from "../../../lib/secrets/index.js";
import { KeyHierarchy, iso, keyUnavailable, unreadable } from "./keys.js";
import { createSecretMetrics, type SecretMetrics } from "./metrics.js";
import { NekCache } from "./nek-cache.js";
import { Rotation } from "./rotation.js";
import type { SecretRow, SecretStorage } from "./storage.js";

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
async function decryptRow(keys: KeyHierarchy, row: SecretRow): Promise<SecretValue> {
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
  const key = await keys.secretKey(env.header.nekId, ns, where);
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

function validName(name: string): void {
  if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$/.test(name))
    throw new CallplaneError("SECRET_NOT_FOUND", `"${name.slice(0, 64)}" is not a secret name`);
}

/** One replica's secret store; `createSecretStore` makes it, `start` loads the keys and begins the background work. */
export class SecretStore {
  readonly replicaId: string;
  readonly registry: Registry;
  /** For benchmarks and tests: the unwrapped-NEK cache. */
  readonly cache: NekCache;
  private readonly storage: SecretStorage;
  private readonly provider: MekProvider;
  private readonly logger: Logger;
  private readonly now: () => number;
  private readonly metrics: SecretMetrics;
  private readonly keys: KeyHierarchy;
  private readonly rotation: Rotation;

  constructor(private readonly opts: SecretStoreOptions) {
    this.storage = opts.storage;
    this.provider = opts.provider;
    this.logger = opts.logger ?? silentLogger();
    this.registry = opts.registry ?? createRegistry("secrets", { defaultMetrics: false });
    this.now = opts.now ?? Date.now;
    this.replicaId = opts.replicaId ?? `${process.pid}-${randomBytes(4).toString("hex")}`;
    const { maxEntries, ttlMs, outageMs } = opts.nekCache;
    this.cache = new NekCache(maxEntries, ttlMs, outageMs, this.now);
    this.metrics = createSecretMetrics(this.registry);
    const base = {
      storage: this.storage,
      provider: this.provider,
      cache: this.cache,
      metrics: this.metrics,
      logger: this.logger,
      now: this.now,
    };
    this.keys = new KeyHierarchy({ ...base, maxNekEncryptions: opts.maxNekEncryptions });
    this.rotation = new Rotation({
      ...base,
      keys: this.keys,
      replicaId: this.replicaId,
      refreshMs: opts.refreshMs,
      rotationGraceMs: opts.rotationGraceMs,
      decrypt: (row) => decryptRow(this.keys, row),
    });
  }

  /** Loads the provider and the key states; on a new database, makes the provider's first key primary. */
  async start(): Promise<void> {
    await this.keys.load();
    await this.rotation.start();
  }

  async close(): Promise<void> {
    await this.rotation.stop();
    this.cache.clear();
    // a replica that stopped must not hold a rotation back until its heartbeat ages out
    await this.storage.removeReplica(this.replicaId).catch(() => undefined);
    await this.provider.close?.();
  }

  /** One round of background work; concurrent calls share the round under way. */
  tick(): Promise<boolean> {
    return this.rotation.tick();
  }

  /** Stores secrets of one version, replacing those with the same names (NVCF's merge). */
  async put(ref: VersionRef, secrets: ReadonlyArray<{ name: string; value: SecretValue }>): Promise<void> {
    const ns = namespaceOf(ref.functionId);
    for (let attempt = 0; attempt < 3; attempt++) {
      const nek = await this.keys.activeNek(ns, secrets.length);
      const t = this.now();
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
      const r = await this.storage.putSecrets(rows);
      if (r === "stored") {
        this.metrics.encryptions.inc({ what: "secret" }, rows.length);
        return;
      }
      // the NEK was removed between reading and writing (a concurrent rotation emptied it)
      this.cache.drop(nek.row.nekId);
    }
    throw keyUnavailable(`the NEK of ${ns} kept changing while storing; try again`);
  }

  /** decryptRow, counted by result. */
  private async decryptCounted(row: SecretRow): Promise<SecretValue> {
    try {
      const v = await decryptRow(this.keys, row);
      this.metrics.decryptions.inc({ result: "ok" });
      return v;
    } catch (err) {
      const code = err instanceof CallplaneError ? err.code : "INTERNAL";
      this.metrics.decryptions.inc({
        result: code === "SECRET_KEY_UNAVAILABLE" ? "key_unavailable" : "unreadable",
      });
      throw err;
    }
  }

  async remove(ref: VersionRef, name: string): Promise<boolean> {
    validName(name);
    return this.storage.deleteSecret(ref.versionId, name);
  }

  async removeVersion(ref: VersionRef): Promise<void> {
    await this.storage.deleteVersion(ref.versionId);
  }

  /** Deletes every secret of a function and its NEKs (crypto-shredding what any backup still holds). */
  async removeFunction(functionId: string): Promise<void> {
    const ns = namespaceOf(functionId);
    const neks = await this.storage.activeNek(ns);
    if (neks) this.cache.drop(neks.nekId);
    await this.storage.deleteNamespace(ns, functionId);
  }

  /** Secret names by version id (never values). */
  names(versionIds?: readonly string[]): Promise<Map<string, string[]>> {
    return this.storage.names(versionIds);
  }

  revisions(): Promise<Map<string, number>> {
    return this.storage.revisions();
  }

  async list(ref: VersionRef, check = false): Promise<SecretListing[]> {
    const rows = await this.storage.secrets(ref.versionId);
    const out: SecretListing[] = [];
    for (const row of rows) {
      const item: SecretListing = {
        name: row.name,
        createdAt: iso(row.createdMs)!,
        updatedAt: iso(row.updatedMs)!,
      };
      if (check) {
        try {
          await this.decryptCounted(row);
          item.readable = true;
        } catch (err) {
          item.readable = false;
          item.problem = err instanceof CallplaneError ? `${err.code}: ${err.message}` : "INTERNAL";
        }
      }
      out.push(item);
    }
    return out;
  }

  /** The plaintext values of one version, for the compute agent; unreadable ones are named, not fatal. */
  async values(ref: VersionRef): Promise<SecretValues> {
    const [rows, revisions] = await Promise.all([
      this.storage.secrets(ref.versionId),
      this.storage.revisions(),
    ]);
    const out: SecretValues = { revision: revisions.get(ref.versionId) ?? 0, values: {}, unreadable: [] };
    for (const row of rows) {
      try {
        out.values[row.name] = await this.decryptCounted(row);
      } catch (err) {
        const e = err instanceof CallplaneError ? err : new CallplaneError("INTERNAL", "internal error");
        this.logger.warn(
          { versionId: row.versionId, name: row.name, code: e.code, err: e.message },
          "a secret cannot be read",
        );
        out.unreadable.push({ name: row.name, code: e.code, problem: e.message });
      }
    }
    return out;
  }

  /** One secret's value (tests, benchmarks); throws SECRET_NOT_FOUND or SECRET_UNREADABLE. */
  async value(ref: VersionRef, name: string): Promise<SecretValue> {
    const row = await this.storage.secret(ref.versionId, name);
    if (!row) throw new CallplaneError("SECRET_NOT_FOUND", `version ${ref.versionId} has no secret ${name}`);
    return this.decryptCounted(row);
  }

  /**
   * The provider as this replica holds it, from memory (no database read): its name, its keys,
   * which is primary, how its last reload went. The console's health page shows it.
   */
  providerSummary(): {
    name: string;
    keyIds: string[];
    primaryKid: string | undefined;
    lastRefresh: { ok: boolean; at: string | undefined; error?: string };
  } {
    const p = this.keys.providerStatus();
    return { name: p.name, keyIds: p.keyIds, primaryKid: this.keys.primaryKid, lastRefresh: p.lastRefresh };
  }

  /**
   * Wraps and unwraps 32 random bytes under the primary MEK: whether the provider does its job now
   * (for a plugin, a round trip to its KMS). Throws with the provider's reason.
   */
  async checkPrimaryMek(): Promise<string> {
    const kid = this.keys.primaryKid;
    if (!kid) throw new Error("no MEK is primary");
    const probe = randomBytes(32);
    const aad = Buffer.from("callplane-console-health-check");
    const back = await this.provider.unwrap(kid, await this.provider.wrap(kid, probe, aad), aad);
    if (!back.equals(probe)) throw new Error(`the ${this.provider.name} MEK provider unwrapped other bytes`);
    return kid;
  }

  /** The keys, the rotation, the replicas and the NEKs, for GET /v1/admin/secrets/keys. */
  async status() {
    const { storage, opts } = this;
    const [rotation, replicas, byMek, stats] = await Promise.all([
      storage.latestRotation(),
      storage.replicas(),
      storage.neksByMek(),
      storage.nekStats(),
    ]);
    await this.keys.readStates();
    const t = this.now();
    const unreadableSecrets = this.rotation.unreadableSecrets;
    return {
      replicaId: this.replicaId,
      provider: this.keys.providerStatus(),
      primaryKid: this.keys.primaryKid ?? null,
      meks: this.keys.mekStatus(byMek),
      rotation: this.rotation.describe(rotation, replicas, byMek, t),
      replicas: replicas.map((r) => ({
        id: r.replicaId,
        provider: r.provider,
        keyIds: r.keyIds,
        primaryKid: r.primaryKid,
        seenAt: iso(r.seenMs),
        live: this.rotation.isLive(r, t),
      })),
      neks: {
        total: stats.total,
        retiring: stats.retiring,
        highestEncryptions: stats.maxEncryptions,
        maxEncryptions: opts.maxNekEncryptions,
        ...(unreadableSecrets ? { unreadableSecrets } : {}),
      },
      cache: {
        entries: this.cache.size,
        maxEntries: opts.nekCache.maxEntries,
        ttlSeconds: opts.nekCache.ttlMs / 1000,
        outageSeconds: opts.nekCache.outageMs / 1000,
      },
      settings: { refreshSeconds: opts.refreshMs / 1000, rotationGraceSeconds: opts.rotationGraceMs / 1000 },
    };
  }

  async startMekRotation(keyId?: string) {
    await this.rotation.startMekRotation(keyId);
    return this.status();
  }

  async abortMekRotation() {
    await this.rotation.abortMekRotation();
    return this.status();
  }

  /** Gives namespaces (one function's, or all) a new NEK; their secrets move over in the background. */
  async rotateNeks(functionId?: string): Promise<{ rotated: string[] }> {
    const namespaces = functionId !== undefined ? [namespaceOf(functionId)] : await this.storage.namespaces();
    const rotated: string[] = [];
    for (const ns of namespaces) {
      if (!(await this.storage.activeNek(ns))) continue;
      await this.keys.newNek(ns, true);
      rotated.push(ns);
    }
    this.rotation.schedule(0);
    return { rotated };
  }
}

export function createSecretStore(opts: SecretStoreOptions): SecretStore {
  return new SecretStore(opts);
}
