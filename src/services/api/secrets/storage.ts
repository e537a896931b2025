/* eslint-disable @typescript-eslint/require-await -- better-sqlite3 is synchronous; the interface is async so that a networked backend (PostgreSQL) can implement it. */
// Where the secret store keeps its rows: wrapped NEKs, encrypted secret values, the MEK states and
// rotations, and a heartbeat per API replica. The secret store owns this schema (its own migration
// table), so that it can move to another backend without the rest of the API. Every method that
// writes more than one row is one transaction; the checks that keep rotation safe across replicas
// (never wrap under a retired MEK, never retire a MEK that still wraps a NEK, never delete a NEK a
// secret still uses) are made inside those transactions.
import type Database from "better-sqlite3";

export type MekState = "primary" | "decrypt-only" | "retired";
export type RotationPhase = "distributing" | "rewrapping" | "done" | "aborted";

export interface MekRow {
  kid: string;
  state: MekState;
  addedMs: number;
  promotedMs: number | null;
  retiredMs: number | null;
}

export interface RotationRow {
  rotationId: string;
  fromKid: string;
  toKid: string;
  phase: RotationPhase;
  rolledBack: boolean;
  startedMs: number;
  promoteAfterMs: number;
  promotedMs: number | null;
  finishedMs: number | null;
  neksAtStart: number;
  keyDestroyed: boolean;
}

export interface NekRow {
  nekId: string;
  namespace: string;
  state: "active" | "retiring";
  mekKid: string;
  wrapped: Buffer;
  encryptions: number;
  createdMs: number;
  wrappedMs: number;
}

export interface SecretRow {
  functionId: string;
  versionId: string;
  name: string;
  nekId: string;
  ciphertext: Buffer;
  createdMs: number;
  updatedMs: number;
}

export interface ReplicaRow {
  replicaId: string;
  provider: string;
  keyIds: string[];
  primaryKid: string | null;
  seenMs: number;
}

export interface SecretStorage {
  meks(): Promise<MekRow[]>;
  /** Makes `kid` the primary MEK if there is none yet (the first start); false if another was first. */
  bootstrapMek(kid: string, now: number): Promise<boolean>;
  latestRotation(): Promise<RotationRow | undefined>;
  /** Adds `toKid` decrypt-only and opens a rotation; "open" if one is already open. */
  startRotation(r: RotationRow): Promise<"started" | "open">;
  promote(rotationId: string, now: number): Promise<boolean>;
  /** Retires the old MEK once no NEK is wrapped with it; false while one still is. */
  retire(rotationId: string, now: number): Promise<boolean>;
  abortBeforePromotion(rotationId: string, now: number): Promise<boolean>;
  rollBack(rotationId: string, now: number): Promise<boolean>;
  markKeyDestroyed(rotationId: string): Promise<void>;

  activeNek(namespace: string): Promise<NekRow | undefined>;
  nek(nekId: string): Promise<NekRow | undefined>;
  /** Inserts a NEK; "retired-mek" if its MEK was retired meanwhile, "exists" if the namespace has an active one. */
  insertNek(n: NekRow, retireActive: boolean): Promise<"inserted" | "exists" | "retired-mek">;
  neksNotUnder(kid: string, limit: number, skip: ReadonlySet<string>): Promise<NekRow[]>;
  rewrapNek(nekId: string, fromKid: string, toKid: string, wrapped: Buffer, now: number): Promise<boolean>;
  neksByMek(): Promise<Map<string, number>>;
  retiringNeks(limit: number): Promise<NekRow[]>;
  nekStats(): Promise<{ total: number; retiring: number; maxEncryptions: number }>;
  /** Deletes a NEK no secret uses; false if one does. */
  deleteNekIfUnused(nekId: string): Promise<boolean>;
  namespaces(): Promise<string[]>;

  /** Upserts secrets of one version, counts the encryptions on their NEK, bumps the version's revision. */
  putSecrets(rows: SecretRow[]): Promise<"stored" | "nek-gone">;
  /** Replaces one secret's ciphertext if it is still under `fromNek` (NEK rotation). */
  reencrypt(
    versionId: string,
    name: string,
    fromNek: string,
    toNek: string,
    ciphertext: Buffer,
    now: number,
  ): Promise<boolean>;
  secrets(versionId: string): Promise<SecretRow[]>;
  secret(versionId: string, name: string): Promise<SecretRow | undefined>;
  secretsUnderNek(nekId: string, limit: number, skip: ReadonlySet<string>): Promise<SecretRow[]>;
  countSecretsUnderNek(nekId: string): Promise<number>;
  deleteSecret(versionId: string, name: string): Promise<boolean>;
  deleteVersion(versionId: string): Promise<number>;
  deleteNamespace(namespace: string, functionId: string): Promise<void>;
  names(versionIds?: readonly string[]): Promise<Map<string, string[]>>;
  revisions(): Promise<Map<string, number>>;

  heartbeat(r: ReplicaRow): Promise<void>;
  replicas(): Promise<ReplicaRow[]>;
  pruneReplicas(olderThanMs: number): Promise<void>;
  removeReplica(replicaId: string): Promise<void>;
}

export const SECRET_MIGRATIONS: ReadonlyArray<{ version: number; name: string; sql: string }> = [
  {
    version: 1,
    name: "MEK states and rotations, wrapped NEKs, encrypted secret values, replica heartbeats",
    sql: `
      CREATE TABLE secret_meks (
        kid         TEXT PRIMARY KEY,
        state       TEXT NOT NULL CHECK (state IN ('primary', 'decrypt-only', 'retired')),
        added_ms    INTEGER NOT NULL,
        promoted_ms INTEGER,
        retired_ms  INTEGER
      );
      CREATE UNIQUE INDEX secret_meks_one_primary ON secret_meks(state) WHERE state = 'primary';
      CREATE TABLE secret_mek_rotations (
        rotation_id      TEXT PRIMARY KEY,
        from_kid         TEXT NOT NULL,
        to_kid           TEXT NOT NULL,
        phase            TEXT NOT NULL CHECK (phase IN ('distributing', 'rewrapping', 'done', 'aborted')),
        open             INTEGER UNIQUE,
        rolled_back      INTEGER NOT NULL DEFAULT 0,
        started_ms       INTEGER NOT NULL,
        promote_after_ms INTEGER NOT NULL,
        promoted_ms      INTEGER,
        finished_ms      INTEGER,
        neks_at_start    INTEGER NOT NULL,
        key_destroyed    INTEGER NOT NULL DEFAULT 0
      );
      CREATE TABLE secret_neks (
        nek_id      TEXT PRIMARY KEY,
        namespace   TEXT NOT NULL,
        state       TEXT NOT NULL CHECK (state IN ('active', 'retiring')),
        mek_kid     TEXT NOT NULL,
        wrapped     BLOB NOT NULL,
        encryptions INTEGER NOT NULL DEFAULT 0,
        created_ms  INTEGER NOT NULL,
        wrapped_ms  INTEGER NOT NULL
      );
      CREATE UNIQUE INDEX secret_neks_one_active ON secret_neks(namespace) WHERE state = 'active';
      CREATE INDEX secret_neks_by_mek ON secret_neks(mek_kid);
      CREATE TABLE secret_values (
        version_id  TEXT NOT NULL,
        name        TEXT NOT NULL,
        function_id TEXT NOT NULL,
        nek_id      TEXT NOT NULL REFERENCES secret_neks(nek_id),
        ciphertext  BLOB NOT NULL,
        created_ms  INTEGER NOT NULL,
        updated_ms  INTEGER NOT NULL,
        PRIMARY KEY (version_id, name)
      );
      CREATE INDEX secret_values_by_nek ON secret_values(nek_id);
      CREATE INDEX secret_values_by_function ON secret_values(function_id);
      CREATE TABLE secret_revisions (
        version_id TEXT PRIMARY KEY,
        revision   INTEGER NOT NULL
      );
      CREATE TABLE secret_replicas (
        replica_id  TEXT PRIMARY KEY,
        provider    TEXT NOT NULL,
        key_ids     TEXT NOT NULL,
        primary_kid TEXT,
        seen_ms     INTEGER NOT NULL
      );
    `,
  },
];

export function migrateSecrets(db: Database.Database): number {
  db.exec(
    "CREATE TABLE IF NOT EXISTS secret_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)",
  );
  let n = 0;
  // two API processes may start on one new database at once: the check and the migration are one
  // (immediate) transaction, so only one of them runs it
  for (const m of SECRET_MIGRATIONS) {
    const ran = db
      .transaction(() => {
        if (db.prepare("SELECT 1 FROM secret_schema_migrations WHERE version = ?").get(m.version))
          return false;
        db.exec(m.sql);
        db.prepare("INSERT INTO secret_schema_migrations (version, name, applied_at) VALUES (?, ?, ?)").run(
          m.version,
          m.name,
          new Date().toISOString(),
        );
        return true;
      })
      .immediate();
    if (ran) n++;
  }
  return n;
}

interface MekDbRow {
  kid: string;
  state: MekState;
  added_ms: number;
  promoted_ms: number | null;
  retired_ms: number | null;
}
interface RotationDbRow {
  rotation_id: string;
  from_kid: string;
  to_kid: string;
  phase: RotationPhase;
  rolled_back: number;
  started_ms: number;
  promote_after_ms: number;
  promoted_ms: number | null;
  finished_ms: number | null;
  neks_at_start: number;
  key_destroyed: number;
}
interface NekDbRow {
  nek_id: string;
  namespace: string;
  state: "active" | "retiring";
  mek_kid: string;
  wrapped: Buffer;
  encryptions: number;
  created_ms: number;
  wrapped_ms: number;
}
interface SecretDbRow {
  function_id: string;
  version_id: string;
  name: string;
  nek_id: string;
  ciphertext: Buffer;
  created_ms: number;
  updated_ms: number;
}

const mek = (r: MekDbRow): MekRow => ({
  kid: r.kid,
  state: r.state,
  addedMs: r.added_ms,
  promotedMs: r.promoted_ms,
  retiredMs: r.retired_ms,
});
const rotation = (r: RotationDbRow): RotationRow => ({
  rotationId: r.rotation_id,
  fromKid: r.from_kid,
  toKid: r.to_kid,
  phase: r.phase,
  rolledBack: r.rolled_back === 1,
  startedMs: r.started_ms,
  promoteAfterMs: r.promote_after_ms,
  promotedMs: r.promoted_ms,
  finishedMs: r.finished_ms,
  neksAtStart: r.neks_at_start,
  keyDestroyed: r.key_destroyed === 1,
});
const nek = (r: NekDbRow): NekRow => ({
  nekId: r.nek_id,
  namespace: r.namespace,
  state: r.state,
  mekKid: r.mek_kid,
  wrapped: r.wrapped,
  encryptions: r.encryptions,
  createdMs: r.created_ms,
  wrappedMs: r.wrapped_ms,
});
const secret = (r: SecretDbRow): SecretRow => ({
  functionId: r.function_id,
  versionId: r.version_id,
  name: r.name,
  nekId: r.nek_id,
  ciphertext: r.ciphertext,
  createdMs: r.created_ms,
  updatedMs: r.updated_ms,
});

/** `skip` as a SQL list of bound parameters (ids known to fail this round). */
function notIn(column: string, skip: ReadonlySet<string>): { sql: string; args: string[] } {
  if (skip.size === 0) return { sql: "", args: [] };
  return { sql: ` AND ${column} NOT IN (${[...skip].map(() => "?").join(", ")})`, args: [...skip] };
}

export function openSqliteSecretStorage(db: Database.Database): SecretStorage {
  migrateSecrets(db);
  const bumpRevision = db.prepare(
    "INSERT INTO secret_revisions (version_id, revision) VALUES (?, 1) ON CONFLICT(version_id) DO UPDATE SET revision = revision + 1",
  );
  const countUnderNek = db.prepare("SELECT COUNT(*) AS n FROM secret_values WHERE nek_id = ?");
  const mekState = db.prepare("SELECT state FROM secret_meks WHERE kid = ?");
  const getRotation = db.prepare("SELECT * FROM secret_mek_rotations WHERE rotation_id = ?");
  // the statements of the hot paths (every encrypt and decrypt), prepared once
  const getNek = db.prepare("SELECT * FROM secret_neks WHERE nek_id = ?");
  const getActiveNek = db.prepare("SELECT * FROM secret_neks WHERE namespace = ? AND state = 'active'");
  const getSecret = db.prepare("SELECT * FROM secret_values WHERE version_id = ? AND name = ?");
  const upsertSecret = db.prepare(
    `INSERT INTO secret_values (version_id, name, function_id, nek_id, ciphertext, created_ms, updated_ms)
     VALUES (@versionId, @name, @functionId, @nekId, @ciphertext, @createdMs, @updatedMs)
     ON CONFLICT(version_id, name) DO UPDATE SET nek_id = excluded.nek_id, ciphertext = excluded.ciphertext, updated_ms = excluded.updated_ms`,
  );
  const countEncryptions = db.prepare(
    "UPDATE secret_neks SET encryptions = encryptions + ? WHERE nek_id = ?",
  );

  return {
    async meks() {
      return (db.prepare("SELECT * FROM secret_meks ORDER BY added_ms, kid").all() as MekDbRow[]).map(mek);
    },
    async bootstrapMek(kid, now) {
      return db
        .transaction(() => {
          if (db.prepare("SELECT 1 FROM secret_meks").get()) return false;
          db.prepare(
            "INSERT INTO secret_meks (kid, state, added_ms, promoted_ms) VALUES (?, 'primary', ?, ?)",
          ).run(kid, now, now);
          return true;
        })
        .immediate();
    },
    async latestRotation() {
      const r = db
        .prepare("SELECT * FROM secret_mek_rotations ORDER BY started_ms DESC, rowid DESC LIMIT 1")
        .get() as RotationDbRow | undefined;
      return r && rotation(r);
    },
    async startRotation(r) {
      return db
        .transaction((): "started" | "open" => {
          if (db.prepare("SELECT 1 FROM secret_mek_rotations WHERE open = 1").get()) return "open";
          const known = mekState.get(r.toKid) as { state: MekState } | undefined;
          if (known) throw new Error(`the MEK ${r.toKid} is already known (${known.state})`);
          db.prepare("INSERT INTO secret_meks (kid, state, added_ms) VALUES (?, 'decrypt-only', ?)").run(
            r.toKid,
            r.startedMs,
          );
          db.prepare(
            `INSERT INTO secret_mek_rotations (rotation_id, from_kid, to_kid, phase, open, rolled_back, started_ms, promote_after_ms, neks_at_start)
             VALUES (?, ?, ?, 'distributing', 1, 0, ?, ?, ?)`,
          ).run(r.rotationId, r.fromKid, r.toKid, r.startedMs, r.promoteAfterMs, r.neksAtStart);
          return "started";
        })
        .immediate();
    },
    async promote(rotationId, now) {
      return db
        .transaction(() => {
          const r = getRotation.get(rotationId) as RotationDbRow | undefined;
          if (!r || r.phase !== "distributing") return false;
          db.prepare("UPDATE secret_meks SET state = 'decrypt-only' WHERE kid = ? AND state = 'primary'").run(
            r.from_kid,
          );
          db.prepare("UPDATE secret_meks SET state = 'primary', promoted_ms = ? WHERE kid = ?").run(
            now,
            r.to_kid,
          );
          db.prepare(
            "UPDATE secret_mek_rotations SET phase = 'rewrapping', promoted_ms = ? WHERE rotation_id = ?",
          ).run(now, rotationId);
          return true;
        })
        .immediate();
    },
    async retire(rotationId, now) {
      return db
        .transaction(() => {
          const r = getRotation.get(rotationId) as RotationDbRow | undefined;
          if (!r || r.phase !== "rewrapping") return false;
          const left = db
            .prepare("SELECT COUNT(*) AS n FROM secret_neks WHERE mek_kid = ?")
            .get(r.from_kid) as {
            n: number;
          };
          if (left.n > 0) return false;
          db.prepare("UPDATE secret_meks SET state = 'retired', retired_ms = ? WHERE kid = ?").run(
            now,
            r.from_kid,
          );
          db.prepare(
            "UPDATE secret_mek_rotations SET phase = 'done', open = NULL, finished_ms = ? WHERE rotation_id = ?",
          ).run(now, rotationId);
          return true;
        })
        .immediate();
    },
    async abortBeforePromotion(rotationId, now) {
      return db
        .transaction(() => {
          const r = getRotation.get(rotationId) as RotationDbRow | undefined;
          if (!r || r.phase !== "distributing") return false;
          // nothing can be wrapped with a key that was never primary, but be sure
          const used = db
            .prepare("SELECT COUNT(*) AS n FROM secret_neks WHERE mek_kid = ?")
            .get(r.to_kid) as {
            n: number;
          };
          if (used.n > 0) return false;
          db.prepare("UPDATE secret_meks SET state = 'retired', retired_ms = ? WHERE kid = ?").run(
            now,
            r.to_kid,
          );
          db.prepare(
            "UPDATE secret_mek_rotations SET phase = 'aborted', open = NULL, finished_ms = ? WHERE rotation_id = ?",
          ).run(now, rotationId);
          return true;
        })
        .immediate();
    },
    async rollBack(rotationId, now) {
      return db
        .transaction(() => {
          const r = getRotation.get(rotationId) as RotationDbRow | undefined;
          if (!r || r.phase !== "rewrapping") return false;
          db.prepare("UPDATE secret_meks SET state = 'decrypt-only' WHERE kid = ?").run(r.to_kid);
          db.prepare("UPDATE secret_meks SET state = 'primary', promoted_ms = ? WHERE kid = ?").run(
            now,
            r.from_kid,
          );
          // the same rotation, backwards: re-wrap onto the old key, then retire the new one
          db.prepare(
            "UPDATE secret_mek_rotations SET from_kid = ?, to_kid = ?, rolled_back = 1, promoted_ms = ? WHERE rotation_id = ?",
          ).run(r.to_kid, r.from_kid, now, rotationId);
          return true;
        })
        .immediate();
    },
    async markKeyDestroyed(rotationId) {
      db.prepare("UPDATE secret_mek_rotations SET key_destroyed = 1 WHERE rotation_id = ?").run(rotationId);
    },

    async activeNek(namespace) {
      const r = getActiveNek.get(namespace) as NekDbRow | undefined;
      return r && nek(r);
    },
    async nek(nekId) {
      const r = getNek.get(nekId) as NekDbRow | undefined;
      return r && nek(r);
    },
    async insertNek(n, retireActive) {
      return db
        .transaction((): "inserted" | "exists" | "retired-mek" => {
          const s = mekState.get(n.mekKid) as { state: MekState } | undefined;
          if (!s || s.state === "retired") return "retired-mek";
          const active = db
            .prepare("SELECT nek_id FROM secret_neks WHERE namespace = ? AND state = 'active'")
            .get(n.namespace) as { nek_id: string } | undefined;
          if (active) {
            if (!retireActive) return "exists";
            db.prepare("UPDATE secret_neks SET state = 'retiring' WHERE nek_id = ?").run(active.nek_id);
          }
          db.prepare(
            `INSERT INTO secret_neks (nek_id, namespace, state, mek_kid, wrapped, encryptions, created_ms, wrapped_ms)
             VALUES (?, ?, 'active', ?, ?, 0, ?, ?)`,
          ).run(n.nekId, n.namespace, n.mekKid, n.wrapped, n.createdMs, n.wrappedMs);
          return "inserted";
        })
        .immediate();
    },
    async neksNotUnder(kid, limit, skip) {
      const x = notIn("nek_id", skip);
      return (
        db
          .prepare(`SELECT * FROM secret_neks WHERE mek_kid != ?${x.sql} ORDER BY wrapped_ms LIMIT ?`)
          .all(kid, ...x.args, limit) as NekDbRow[]
      ).map(nek);
    },
    async rewrapNek(nekId, fromKid, toKid, wrapped, now) {
      return db
        .transaction(() => {
          const s = mekState.get(toKid) as { state: MekState } | undefined;
          if (!s || s.state === "retired") return false;
          const r = db
            .prepare(
              "UPDATE secret_neks SET mek_kid = ?, wrapped = ?, wrapped_ms = ? WHERE nek_id = ? AND mek_kid = ?",
            )
            .run(toKid, wrapped, now, nekId, fromKid);
          return r.changes === 1;
        })
        .immediate();
    },
    async neksByMek() {
      const rows = db
        .prepare("SELECT mek_kid, COUNT(*) AS n FROM secret_neks GROUP BY mek_kid")
        .all() as Array<{
        mek_kid: string;
        n: number;
      }>;
      return new Map(rows.map((r) => [r.mek_kid, r.n]));
    },
    async retiringNeks(limit) {
      return (
        db
          .prepare("SELECT * FROM secret_neks WHERE state = 'retiring' ORDER BY created_ms LIMIT ?")
          .all(limit) as NekDbRow[]
      ).map(nek);
    },
    async nekStats() {
      const r = db
        .prepare(
          "SELECT COUNT(*) AS total, COALESCE(SUM(state = 'retiring'), 0) AS retiring, COALESCE(MAX(encryptions), 0) AS max FROM secret_neks",
        )
        .get() as { total: number; retiring: number; max: number };
      return { total: r.total, retiring: r.retiring, maxEncryptions: r.max };
    },
    async deleteNekIfUnused(nekId) {
      return db
        .transaction(() => {
          if ((countUnderNek.get(nekId) as { n: number }).n > 0) return false;
          return db.prepare("DELETE FROM secret_neks WHERE nek_id = ?").run(nekId).changes === 1;
        })
        .immediate();
    },
    async namespaces() {
      return (
        db.prepare("SELECT DISTINCT namespace FROM secret_neks ORDER BY namespace").all() as Array<{
          namespace: string;
        }>
      ).map((r) => r.namespace);
    },

    async putSecrets(rows) {
      if (rows.length === 0) return "stored";
      const upsert = upsertSecret;
      const count = countEncryptions;
      return db
        .transaction((): "stored" | "nek-gone" => {
          const perNek = new Map<string, number>();
          for (const r of rows) perNek.set(r.nekId, (perNek.get(r.nekId) ?? 0) + 1);
          for (const [id, n] of perNek) if (count.run(n, id).changes !== 1) return "nek-gone";
          for (const r of rows) upsert.run(r);
          for (const v of new Set(rows.map((r) => r.versionId))) bumpRevision.run(v);
          return "stored";
        })
        .immediate();
    },
    async reencrypt(versionId, name, fromNek, toNek, ciphertext, now) {
      return db
        .transaction(() => {
          const r = db
            .prepare(
              "UPDATE secret_values SET nek_id = ?, ciphertext = ?, updated_ms = ? WHERE version_id = ? AND name = ? AND nek_id = ?",
            )
            .run(toNek, ciphertext, now, versionId, name, fromNek);
          if (r.changes !== 1) return false;
          db.prepare("UPDATE secret_neks SET encryptions = encryptions + 1 WHERE nek_id = ?").run(toNek);
          return true;
        })
        .immediate();
    },
    async secrets(versionId) {
      return (
        db
          .prepare("SELECT * FROM secret_values WHERE version_id = ? ORDER BY name")
          .all(versionId) as SecretDbRow[]
      ).map(secret);
    },
    async secret(versionId, name) {
      const r = getSecret.get(versionId, name) as SecretDbRow | undefined;
      return r && secret(r);
    },
    async secretsUnderNek(nekId, limit, skip) {
      const x = notIn("version_id || '/' || name", skip);
      return (
        db
          .prepare(`SELECT * FROM secret_values WHERE nek_id = ?${x.sql} ORDER BY updated_ms LIMIT ?`)
          .all(nekId, ...x.args, limit) as SecretDbRow[]
      ).map(secret);
    },
    async countSecretsUnderNek(nekId) {
      return (countUnderNek.get(nekId) as { n: number }).n;
    },
    async deleteSecret(versionId, name) {
      return db
        .transaction(() => {
          const r = db
            .prepare("DELETE FROM secret_values WHERE version_id = ? AND name = ?")
            .run(versionId, name);
          if (r.changes === 1) bumpRevision.run(versionId);
          return r.changes === 1;
        })
        .immediate();
    },
    async deleteVersion(versionId) {
      return db
        .transaction(() => {
          const r = db.prepare("DELETE FROM secret_values WHERE version_id = ?").run(versionId);
          db.prepare("DELETE FROM secret_revisions WHERE version_id = ?").run(versionId);
          return r.changes;
        })
        .immediate();
    },
    async deleteNamespace(namespace, functionId) {
      db.transaction(() => {
        const versions = db
          .prepare("SELECT DISTINCT version_id FROM secret_values WHERE function_id = ?")
          .all(functionId) as Array<{ version_id: string }>;
        db.prepare("DELETE FROM secret_values WHERE function_id = ?").run(functionId);
        for (const v of versions)
          db.prepare("DELETE FROM secret_revisions WHERE version_id = ?").run(v.version_id);
        db.prepare("DELETE FROM secret_neks WHERE namespace = ?").run(namespace);
      }).immediate();
    },
    async names(versionIds) {
      // a long list (every version, for a function listing) would pass SQLite's limit on bound
      // parameters: then read every name and keep the ones asked for
      const all = versionIds === undefined || versionIds.length > 500;
      const wanted = versionIds && all ? new Set(versionIds) : undefined;
      const rows = (
        all
          ? (
              db
                .prepare("SELECT version_id, name FROM secret_values ORDER BY version_id, name")
                .all() as Array<{
                version_id: string;
              }>
            ).filter((r) => !wanted || wanted.has(r.version_id))
          : versionIds.length === 0
            ? []
            : db
                .prepare(
                  `SELECT version_id, name FROM secret_values WHERE version_id IN (${versionIds.map(() => "?").join(", ")}) ORDER BY version_id, name`,
                )
                .all(...versionIds)
      ) as Array<{ version_id: string; name: string }>;
      const out = new Map<string, string[]>();
      for (const r of rows) {
        const list = out.get(r.version_id) ?? [];
        list.push(r.name);
        out.set(r.version_id, list);
      }
      return out;
    },
    async revisions() {
      const rows = db.prepare("SELECT version_id, revision FROM secret_revisions").all() as Array<{
        version_id: string;
        revision: number;
      }>;
      return new Map(rows.map((r) => [r.version_id, r.revision]));
    },

    async heartbeat(r) {
      db.prepare(
        `INSERT INTO secret_replicas (replica_id, provider, key_ids, primary_kid, seen_ms) VALUES (?, ?, ?, ?, ?)
         ON CONFLICT(replica_id) DO UPDATE SET provider = excluded.provider, key_ids = excluded.key_ids, primary_kid = excluded.primary_kid, seen_ms = excluded.seen_ms`,
      ).run(r.replicaId, r.provider, JSON.stringify(r.keyIds), r.primaryKid, r.seenMs);
    },
    async replicas() {
      const rows = db.prepare("SELECT * FROM secret_replicas ORDER BY seen_ms DESC").all() as Array<{
        replica_id: string;
        provider: string;
        key_ids: string;
        primary_kid: string | null;
        seen_ms: number;
      }>;
      return rows.map((r) => ({
        replicaId: r.replica_id,
        provider: r.provider,
        keyIds: JSON.parse(r.key_ids) as string[],
        primaryKid: r.primary_kid,
        seenMs: r.seen_ms,
      }));
    },
    async pruneReplicas(olderThanMs) {
      db.prepare("DELETE FROM secret_replicas WHERE seen_ms < ?").run(olderThanMs);
    },
    async removeReplica(replicaId) {
      db.prepare("DELETE FROM secret_replicas WHERE replica_id = ?").run(replicaId);
    },
  };
}
