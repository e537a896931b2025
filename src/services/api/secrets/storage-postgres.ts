// The secret store's rows on PostgreSQL, for API replicas that share one database: the same tables
// and the same rules as the SQLite storage (storage.ts), in PostgreSQL's dialect (BYTEA, BIGINT
// milliseconds). Where SQLite serializes a write transaction by taking its single write lock
// (BEGIN IMMEDIATE), every multi-statement write here first takes one transaction-scoped advisory
// lock, so the checks that keep a rotation safe across replicas (never wrap under a retired MEK,
// never retire a MEK that still wraps a NEK, never delete a NEK a secret still uses) see what the
// others committed. Secret writes are operator actions, rare enough for one lock.
import type pg from "pg";
import type {
  MekRow,
  MekState,
  NekRow,
  ReplicaRow,
  RotationPhase,
  RotationRow,
  SecretRow,
  SecretStorage,
} from "./storage.js";

const SECRETS_LOCK = 0x63707363; // "cpsc"
const MIGRATIONS_LOCK = 0x6370736d; // "cpsm"

export const SECRET_MIGRATIONS_POSTGRES: ReadonlyArray<{ version: number; name: string; sql: string }> = [
  {
    version: 1,
    name: "MEK states and rotations, wrapped NEKs, encrypted secret values, replica heartbeats",
    sql: `
      CREATE TABLE secret_meks (
        kid         TEXT PRIMARY KEY,
        state       TEXT NOT NULL CHECK (state IN ('primary', 'decrypt-only', 'retired')),
        added_ms    BIGINT NOT NULL,
        promoted_ms BIGINT,
        retired_ms  BIGINT
      );
      CREATE UNIQUE INDEX secret_meks_one_primary ON secret_meks(state) WHERE state = 'primary';
      CREATE TABLE secret_mek_rotations (
        rotation_id      TEXT PRIMARY KEY,
        from_kid         TEXT NOT NULL,
        to_kid           TEXT NOT NULL,
        phase            TEXT NOT NULL CHECK (phase IN ('distributing', 'rewrapping', 'done', 'aborted')),
        open             INTEGER UNIQUE,
        rolled_back      INTEGER NOT NULL DEFAULT 0,
        started_ms       BIGINT NOT NULL,
        promote_after_ms BIGINT NOT NULL,
        promoted_ms      BIGINT,
        finished_ms      BIGINT,
        neks_at_start    INTEGER NOT NULL,
        key_destroyed    INTEGER NOT NULL DEFAULT 0,
        seq              BIGSERIAL
      );
      CREATE TABLE secret_neks (
        nek_id      TEXT PRIMARY KEY,
        namespace   TEXT NOT NULL,
        state       TEXT NOT NULL CHECK (state IN ('active', 'retiring')),
        mek_kid     TEXT NOT NULL,
        wrapped     BYTEA NOT NULL,
        encryptions BIGINT NOT NULL DEFAULT 0,
        created_ms  BIGINT NOT NULL,
        wrapped_ms  BIGINT NOT NULL
      );
      CREATE UNIQUE INDEX secret_neks_one_active ON secret_neks(namespace) WHERE state = 'active';
      CREATE INDEX secret_neks_by_mek ON secret_neks(mek_kid);
      CREATE TABLE secret_values (
        version_id  TEXT NOT NULL,
        name        TEXT NOT NULL,
        function_id TEXT NOT NULL,
        nek_id      TEXT NOT NULL REFERENCES secret_neks(nek_id),
        ciphertext  BYTEA NOT NULL,
        created_ms  BIGINT NOT NULL,
        updated_ms  BIGINT NOT NULL,
        PRIMARY KEY (version_id, name)
      );
      CREATE INDEX secret_values_by_nek ON secret_values(nek_id);
      CREATE INDEX secret_values_by_function ON secret_values(function_id);
      CREATE TABLE secret_revisions (
        version_id TEXT PRIMARY KEY,
        revision   BIGINT NOT NULL
      );
      CREATE TABLE secret_replicas (
        replica_id  TEXT PRIMARY KEY,
        provider    TEXT NOT NULL,
        key_ids     TEXT NOT NULL,
        primary_kid TEXT,
        seen_ms     BIGINT NOT NULL
      );
    `,
  },
];

// BIGINT columns and COUNT(*) arrive as strings from node-postgres; every such value here is a
// millisecond time or a count, far below 2^53
const num = (v: unknown): number => Number(v);
const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v));

type Row = Record<string, unknown>;

const mek = (r: Row): MekRow => ({
  kid: r.kid as string,
  state: r.state as MekState,
  addedMs: num(r.added_ms),
  promotedMs: numOrNull(r.promoted_ms),
  retiredMs: numOrNull(r.retired_ms),
});
const rotation = (r: Row): RotationRow => ({
  rotationId: r.rotation_id as string,
  fromKid: r.from_kid as string,
  toKid: r.to_kid as string,
  phase: r.phase as RotationPhase,
  rolledBack: num(r.rolled_back) === 1,
  startedMs: num(r.started_ms),
  promoteAfterMs: num(r.promote_after_ms),
  promotedMs: numOrNull(r.promoted_ms),
  finishedMs: numOrNull(r.finished_ms),
  neksAtStart: num(r.neks_at_start),
  keyDestroyed: num(r.key_destroyed) === 1,
});
const nek = (r: Row): NekRow => ({
  nekId: r.nek_id as string,
  namespace: r.namespace as string,
  state: r.state as NekRow["state"],
  mekKid: r.mek_kid as string,
  wrapped: r.wrapped as Buffer,
  encryptions: num(r.encryptions),
  createdMs: num(r.created_ms),
  wrappedMs: num(r.wrapped_ms),
});
const secret = (r: Row): SecretRow => ({
  functionId: r.function_id as string,
  versionId: r.version_id as string,
  name: r.name as string,
  nekId: r.nek_id as string,
  ciphertext: r.ciphertext as Buffer,
  createdMs: num(r.created_ms),
  updatedMs: num(r.updated_ms),
});

async function migrate(pool: pg.Pool): Promise<void> {
  const c = await pool.connect();
  try {
    await c.query("BEGIN");
    await c.query("SELECT pg_advisory_xact_lock($1)", [MIGRATIONS_LOCK]);
    await c.query(
      "CREATE TABLE IF NOT EXISTS secret_schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)",
    );
    for (const m of SECRET_MIGRATIONS_POSTGRES) {
      const done = await c.query("SELECT 1 FROM secret_schema_migrations WHERE version = $1", [m.version]);
      if (done.rowCount) continue;
      await c.query(m.sql);
      await c.query("INSERT INTO secret_schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)", [
        m.version,
        m.name,
        new Date().toISOString(),
      ]);
    }
    await c.query("COMMIT");
  } catch (err) {
    await c.query("ROLLBACK").catch(() => undefined);
    throw err;
  } finally {
    c.release();
  }
}

type Q = (sql: string, params?: unknown[]) => Promise<pg.QueryResult<Row>>;

export async function openPostgresSecretStorage(pool: pg.Pool): Promise<SecretStorage> {
  await migrate(pool);
  const q: Q = (sql, params = []) => pool.query<Row>(sql, params);
  /** One write transaction, serialized with every other one on the secret tables. */
  async function tx<T>(fn: (q: Q) => Promise<T>): Promise<T> {
    const c = await pool.connect();
    try {
      await c.query("BEGIN");
      await c.query("SELECT pg_advisory_xact_lock($1)", [SECRETS_LOCK]);
      const out = await fn((sql, params = []) => c.query<Row>(sql, params));
      await c.query("COMMIT");
      return out;
    } catch (err) {
      await c.query("ROLLBACK").catch(() => undefined);
      throw err;
    } finally {
      c.release();
    }
  }
  const first = async (sql: string, params: unknown[] = []) => (await q(sql, params)).rows[0];
  const getRotation = async (t: Q, id: string) =>
    (await t("SELECT * FROM secret_mek_rotations WHERE rotation_id = $1", [id])).rows[0];
  const mekStateOf = async (t: Q, kid: string) =>
    (await t("SELECT state FROM secret_meks WHERE kid = $1", [kid])).rows[0]?.state as MekState | undefined;
  const countUnderMek = async (t: Q, kid: string) =>
    num((await t("SELECT COUNT(*) AS n FROM secret_neks WHERE mek_kid = $1", [kid])).rows[0].n);
  const bumpRevision = (t: Q, versionId: string) =>
    t(
      "INSERT INTO secret_revisions (version_id, revision) VALUES ($1, 1) ON CONFLICT (version_id) DO UPDATE SET revision = secret_revisions.revision + 1",
      [versionId],
    );

  return {
    async meks() {
      return (await q("SELECT * FROM secret_meks ORDER BY added_ms, kid")).rows.map(mek);
    },
    async bootstrapMek(kid, now) {
      return tx(async (t) => {
        if ((await t("SELECT 1 FROM secret_meks LIMIT 1")).rowCount) return false;
        await t(
          "INSERT INTO secret_meks (kid, state, added_ms, promoted_ms) VALUES ($1, 'primary', $2, $3)",
          [kid, now, now],
        );
        return true;
      });
    },
    async latestRotation() {
      const r = await first("SELECT * FROM secret_mek_rotations ORDER BY started_ms DESC, seq DESC LIMIT 1");
      return r && rotation(r);
    },
    async startRotation(r) {
      return tx(async (t): Promise<"started" | "open"> => {
        if ((await t("SELECT 1 FROM secret_mek_rotations WHERE open = 1")).rowCount) return "open";
        const known = await mekStateOf(t, r.toKid);
        if (known) throw new Error(`the MEK ${r.toKid} is already known (${known})`);
        await t("INSERT INTO secret_meks (kid, state, added_ms) VALUES ($1, 'decrypt-only', $2)", [
          r.toKid,
          r.startedMs,
        ]);
        await t(
          `INSERT INTO secret_mek_rotations (rotation_id, from_kid, to_kid, phase, open, rolled_back, started_ms, promote_after_ms, neks_at_start)
           VALUES ($1, $2, $3, 'distributing', 1, 0, $4, $5, $6)`,
          [r.rotationId, r.fromKid, r.toKid, r.startedMs, r.promoteAfterMs, r.neksAtStart],
        );
        return "started";
      });
    },
    async promote(rotationId, now) {
      return tx(async (t) => {
        const r = await getRotation(t, rotationId);
        if (!r || r.phase !== "distributing") return false;
        await t("UPDATE secret_meks SET state = 'decrypt-only' WHERE kid = $1 AND state = 'primary'", [
          r.from_kid,
        ]);
        await t("UPDATE secret_meks SET state = 'primary', promoted_ms = $1 WHERE kid = $2", [now, r.to_kid]);
        await t(
          "UPDATE secret_mek_rotations SET phase = 'rewrapping', promoted_ms = $1 WHERE rotation_id = $2",
          [now, rotationId],
        );
        return true;
      });
    },
    async retire(rotationId, now) {
      return tx(async (t) => {
        const r = await getRotation(t, rotationId);
        if (!r || r.phase !== "rewrapping") return false;
        if ((await countUnderMek(t, r.from_kid as string)) > 0) return false;
        await t("UPDATE secret_meks SET state = 'retired', retired_ms = $1 WHERE kid = $2", [
          now,
          r.from_kid,
        ]);
        await t(
          "UPDATE secret_mek_rotations SET phase = 'done', open = NULL, finished_ms = $1 WHERE rotation_id = $2",
          [now, rotationId],
        );
        return true;
      });
    },
    async abortBeforePromotion(rotationId, now) {
      return tx(async (t) => {
        const r = await getRotation(t, rotationId);
        if (!r || r.phase !== "distributing") return false;
        // nothing can be wrapped with a key that was never primary, but be sure
        if ((await countUnderMek(t, r.to_kid as string)) > 0) return false;
        await t("UPDATE secret_meks SET state = 'retired', retired_ms = $1 WHERE kid = $2", [now, r.to_kid]);
        await t(
          "UPDATE secret_mek_rotations SET phase = 'aborted', open = NULL, finished_ms = $1 WHERE rotation_id = $2",
          [now, rotationId],
        );
        return true;
      });
    },
    async rollBack(rotationId, now) {
      return tx(async (t) => {
        const r = await getRotation(t, rotationId);
        if (!r || r.phase !== "rewrapping") return false;
        await t("UPDATE secret_meks SET state = 'decrypt-only' WHERE kid = $1", [r.to_kid]);
        await t("UPDATE secret_meks SET state = 'primary', promoted_ms = $1 WHERE kid = $2", [
          now,
          r.from_kid,
        ]);
        // the same rotation, backwards: re-wrap onto the old key, then retire the new one
        await t(
          "UPDATE secret_mek_rotations SET from_kid = $1, to_kid = $2, rolled_back = 1, promoted_ms = $3 WHERE rotation_id = $4",
          [r.to_kid, r.from_kid, now, rotationId],
        );
        return true;
      });
    },
    async markKeyDestroyed(rotationId) {
      await q("UPDATE secret_mek_rotations SET key_destroyed = 1 WHERE rotation_id = $1", [rotationId]);
    },

    async activeNek(namespace) {
      const r = await first("SELECT * FROM secret_neks WHERE namespace = $1 AND state = 'active'", [
        namespace,
      ]);
      return r && nek(r);
    },
    async nek(nekId) {
      const r = await first("SELECT * FROM secret_neks WHERE nek_id = $1", [nekId]);
      return r && nek(r);
    },
    async insertNek(n, retireActive) {
      return tx(async (t): Promise<"inserted" | "exists" | "retired-mek"> => {
        const s = await mekStateOf(t, n.mekKid);
        if (!s || s === "retired") return "retired-mek";
        const active = (
          await t("SELECT nek_id FROM secret_neks WHERE namespace = $1 AND state = 'active'", [n.namespace])
        ).rows[0];
        if (active) {
          if (!retireActive) return "exists";
          await t("UPDATE secret_neks SET state = 'retiring' WHERE nek_id = $1", [active.nek_id]);
        }
        await t(
          `INSERT INTO secret_neks (nek_id, namespace, state, mek_kid, wrapped, encryptions, created_ms, wrapped_ms)
           VALUES ($1, $2, 'active', $3, $4, 0, $5, $6)`,
          [n.nekId, n.namespace, n.mekKid, n.wrapped, n.createdMs, n.wrappedMs],
        );
        return "inserted";
      });
    },
    async neksNotUnder(kid, limit, skip) {
      return (
        await q(
          "SELECT * FROM secret_neks WHERE mek_kid <> $1 AND NOT (nek_id = ANY($2::text[])) ORDER BY wrapped_ms LIMIT $3",
          [kid, [...skip], limit],
        )
      ).rows.map(nek);
    },
    async rewrapNek(nekId, fromKid, toKid, wrapped, now) {
      return tx(async (t) => {
        const s = await mekStateOf(t, toKid);
        if (!s || s === "retired") return false;
        const r = await t(
          "UPDATE secret_neks SET mek_kid = $1, wrapped = $2, wrapped_ms = $3 WHERE nek_id = $4 AND mek_kid = $5",
          [toKid, wrapped, now, nekId, fromKid],
        );
        return r.rowCount === 1;
      });
    },
    async neksByMek() {
      const rows = (await q("SELECT mek_kid, COUNT(*) AS n FROM secret_neks GROUP BY mek_kid")).rows;
      return new Map(rows.map((r) => [r.mek_kid as string, num(r.n)]));
    },
    async retiringNeks(limit) {
      return (
        await q("SELECT * FROM secret_neks WHERE state = 'retiring' ORDER BY created_ms LIMIT $1", [limit])
      ).rows.map(nek);
    },
    async nekStats() {
      const r = await first(
        "SELECT COUNT(*) AS total, COUNT(*) FILTER (WHERE state = 'retiring') AS retiring, COALESCE(MAX(encryptions), 0) AS max FROM secret_neks",
      );
      return { total: num(r.total), retiring: num(r.retiring), maxEncryptions: num(r.max) };
    },
    async deleteNekIfUnused(nekId) {
      return tx(async (t) => {
        const used = num(
          (await t("SELECT COUNT(*) AS n FROM secret_values WHERE nek_id = $1", [nekId])).rows[0].n,
        );
        if (used > 0) return false;
        return (await t("DELETE FROM secret_neks WHERE nek_id = $1", [nekId])).rowCount === 1;
      });
    },
    async namespaces() {
      return (await q("SELECT DISTINCT namespace FROM secret_neks ORDER BY namespace")).rows.map(
        (r) => r.namespace as string,
      );
    },

    async putSecrets(rows) {
      if (rows.length === 0) return "stored";
      return tx(async (t): Promise<"stored" | "nek-gone"> => {
        const perNek = new Map<string, number>();
        for (const r of rows) perNek.set(r.nekId, (perNek.get(r.nekId) ?? 0) + 1);
        for (const [id, n] of perNek) {
          const u = await t("UPDATE secret_neks SET encryptions = encryptions + $1 WHERE nek_id = $2", [
            n,
            id,
          ]);
          if (u.rowCount !== 1) return "nek-gone";
        }
        for (const r of rows) {
          await t(
            `INSERT INTO secret_values (version_id, name, function_id, nek_id, ciphertext, created_ms, updated_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (version_id, name) DO UPDATE SET nek_id = excluded.nek_id, ciphertext = excluded.ciphertext, updated_ms = excluded.updated_ms`,
            [r.versionId, r.name, r.functionId, r.nekId, r.ciphertext, r.createdMs, r.updatedMs],
          );
        }
        for (const v of new Set(rows.map((r) => r.versionId))) await bumpRevision(t, v);
        return "stored";
      });
    },
    async reencrypt(versionId, name, fromNek, toNek, ciphertext, now) {
      return tx(async (t) => {
        const r = await t(
          "UPDATE secret_values SET nek_id = $1, ciphertext = $2, updated_ms = $3 WHERE version_id = $4 AND name = $5 AND nek_id = $6",
          [toNek, ciphertext, now, versionId, name, fromNek],
        );
        if (r.rowCount !== 1) return false;
        await t("UPDATE secret_neks SET encryptions = encryptions + 1 WHERE nek_id = $1", [toNek]);
        return true;
      });
    },
    async secrets(versionId) {
      return (
        await q("SELECT * FROM secret_values WHERE version_id = $1 ORDER BY name", [versionId])
      ).rows.map(secret);
    },
    async secret(versionId, name) {
      const r = await first("SELECT * FROM secret_values WHERE version_id = $1 AND name = $2", [
        versionId,
        name,
      ]);
      return r && secret(r);
    },
    async secretsUnderNek(nekId, limit, skip) {
      return (
        await q(
          "SELECT * FROM secret_values WHERE nek_id = $1 AND NOT ((version_id || '/' || name) = ANY($2::text[])) ORDER BY updated_ms LIMIT $3",
          [nekId, [...skip], limit],
        )
      ).rows.map(secret);
    },
    async countSecretsUnderNek(nekId) {
      return num((await first("SELECT COUNT(*) AS n FROM secret_values WHERE nek_id = $1", [nekId])).n);
    },
    async deleteSecret(versionId, name) {
      return tx(async (t) => {
        const r = await t("DELETE FROM secret_values WHERE version_id = $1 AND name = $2", [versionId, name]);
        if (r.rowCount === 1) await bumpRevision(t, versionId);
        return r.rowCount === 1;
      });
    },
    async deleteVersion(versionId) {
      return tx(async (t) => {
        const r = await t("DELETE FROM secret_values WHERE version_id = $1", [versionId]);
        await t("DELETE FROM secret_revisions WHERE version_id = $1", [versionId]);
        return r.rowCount ?? 0;
      });
    },
    async deleteNamespace(namespace, functionId) {
      await tx(async (t) => {
        await t(
          "DELETE FROM secret_revisions WHERE version_id IN (SELECT DISTINCT version_id FROM secret_values WHERE function_id = $1)",
          [functionId],
        );
        await t("DELETE FROM secret_values WHERE function_id = $1", [functionId]);
        await t("DELETE FROM secret_neks WHERE namespace = $1", [namespace]);
      });
    },
    async names(versionIds) {
      const rows =
        versionIds === undefined
          ? (await q("SELECT version_id, name FROM secret_values ORDER BY version_id, name")).rows
          : versionIds.length === 0
            ? []
            : (
                await q(
                  "SELECT version_id, name FROM secret_values WHERE version_id = ANY($1::text[]) ORDER BY version_id, name",
                  [[...versionIds]],
                )
              ).rows;
      const out = new Map<string, string[]>();
      for (const r of rows) {
        const list = out.get(r.version_id as string) ?? [];
        list.push(r.name as string);
        out.set(r.version_id as string, list);
      }
      return out;
    },
    async revisions() {
      const rows = (await q("SELECT version_id, revision FROM secret_revisions")).rows;
      return new Map(rows.map((r) => [r.version_id as string, num(r.revision)]));
    },

    async heartbeat(r) {
      await q(
        `INSERT INTO secret_replicas (replica_id, provider, key_ids, primary_kid, seen_ms) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (replica_id) DO UPDATE SET provider = excluded.provider, key_ids = excluded.key_ids, primary_kid = excluded.primary_kid, seen_ms = excluded.seen_ms`,
        [r.replicaId, r.provider, JSON.stringify(r.keyIds), r.primaryKid, r.seenMs],
      );
    },
    async replicas() {
      return (await q("SELECT * FROM secret_replicas ORDER BY seen_ms DESC")).rows.map((r): ReplicaRow => ({
        replicaId: r.replica_id as string,
        provider: r.provider as string,
        keyIds: JSON.parse(r.key_ids as string) as string[],
        primaryKid: (r.primary_kid as string | null) ?? null,
        seenMs: num(r.seen_ms),
      }));
    },
    async pruneReplicas(olderThanMs) {
      await q("DELETE FROM secret_replicas WHERE seen_ms < $1", [olderThanMs]);
    },
    async removeReplica(replicaId) {
      await q("DELETE FROM secret_replicas WHERE replica_id = $1", [replicaId]);
    },
  };
}
