/* eslint-disable @typescript-eslint/require-await -- better-sqlite3 is synchronous; the interface is async like Store. */
// The worker identities the API issued: one row per instance, ACTIVE until the instance is
// terminated (or provisioning is undone), then REVOKED for good. Kept in the API's database file
// in a table of its own (created if missing), beside the Store's tables.
import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import Database from "better-sqlite3";
import type pg from "pg";

export type IdentityStatus = "ACTIVE" | "REVOKED";

export interface IdentityRecord {
  instanceId: string;
  functionId: string;
  versionId: string;
  deploymentId: string;
  status: IdentityStatus;
  issuedAt: string;
  expiresAt: string;
  revokedAt?: string;
  revokedWhy?: string;
}

interface Row {
  instance_id: string;
  function_id: string;
  version_id: string;
  deployment_id: string;
  status: IdentityStatus;
  issued_at: string;
  expires_at: string;
  revoked_at: string | null;
  revoked_why: string | null;
}

export interface IdentityStore {
  get(instanceId: string): Promise<IdentityRecord | undefined>;
  /** Records an issue or a refresh; refuses (returns false) for a revoked instance. */
  issued(r: Omit<IdentityRecord, "status">): Promise<boolean>;
  /** Revokes; true when it was active. */
  revoke(instanceId: string, why: string, at: string): Promise<boolean>;
  close(): Promise<void>;
}

const fromRow = (r: Row): IdentityRecord => ({
  instanceId: r.instance_id,
  functionId: r.function_id,
  versionId: r.version_id,
  deploymentId: r.deployment_id,
  status: r.status,
  issuedAt: r.issued_at,
  expiresAt: r.expires_at,
  ...(r.revoked_at ? { revokedAt: r.revoked_at } : {}),
  ...(r.revoked_why ? { revokedWhy: r.revoked_why } : {}),
});

export function openIdentityStore(path: string): IdentityStore {
  if (path !== ":memory:") mkdirSync(dirname(path), { recursive: true });
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.pragma("busy_timeout = 5000");
  db.exec(`CREATE TABLE IF NOT EXISTS worker_identities (
    instance_id   TEXT PRIMARY KEY,
    function_id   TEXT NOT NULL,
    version_id    TEXT NOT NULL,
    deployment_id TEXT NOT NULL,
    status        TEXT NOT NULL,
    issued_at     TEXT NOT NULL,
    expires_at    TEXT NOT NULL,
    revoked_at    TEXT,
    revoked_why   TEXT
  )`);
  return {
    async get(id) {
      const r = db.prepare("SELECT * FROM worker_identities WHERE instance_id = ?").get(id) as
        Row | undefined;
      return r && fromRow(r);
    },
    async issued(r) {
      const cur = db
        .prepare("SELECT status FROM worker_identities WHERE instance_id = ?")
        .get(r.instanceId) as { status: IdentityStatus } | undefined;
      if (cur?.status === "REVOKED") return false;
      db.prepare(
        `INSERT INTO worker_identities (instance_id, function_id, version_id, deployment_id, status, issued_at, expires_at)
         VALUES (?, ?, ?, ?, 'ACTIVE', ?, ?)
         ON CONFLICT(instance_id) DO UPDATE SET issued_at = excluded.issued_at, expires_at = excluded.expires_at`,
      ).run(r.instanceId, r.functionId, r.versionId, r.deploymentId, r.issuedAt, r.expiresAt);
      return true;
    },
    async revoke(id, why, at) {
      const r = db
        .prepare(
          "UPDATE worker_identities SET status = 'REVOKED', revoked_at = ?, revoked_why = ? WHERE instance_id = ? AND status = 'ACTIVE'",
        )
        .run(at, why, id);
      return r.changes === 1;
    },
    async close() {
      db.close();
    },
  };
}

/**
 * The same table on PostgreSQL, for API replicas sharing one database. An issue or refresh is one
 * statement that never brings a revoked identity back, whatever another replica does meanwhile.
 */
export async function openPostgresIdentityStore(pool: pg.Pool): Promise<IdentityStore> {
  await pool.query(`CREATE TABLE IF NOT EXISTS worker_identities (
    instance_id   TEXT PRIMARY KEY,
    function_id   TEXT NOT NULL,
    version_id    TEXT NOT NULL,
    deployment_id TEXT NOT NULL,
    status        TEXT NOT NULL,
    issued_at     TEXT NOT NULL,
    expires_at    TEXT NOT NULL,
    revoked_at    TEXT,
    revoked_why   TEXT
  )`);
  return {
    async get(id) {
      const r = (await pool.query<Row>("SELECT * FROM worker_identities WHERE instance_id = $1", [id]))
        .rows[0];
      return r && fromRow(r);
    },
    async issued(r) {
      const res = await pool.query(
        `INSERT INTO worker_identities (instance_id, function_id, version_id, deployment_id, status, issued_at, expires_at)
         VALUES ($1, $2, $3, $4, 'ACTIVE', $5, $6)
         ON CONFLICT (instance_id) DO UPDATE SET issued_at = excluded.issued_at, expires_at = excluded.expires_at
         WHERE worker_identities.status = 'ACTIVE'`,
        [r.instanceId, r.functionId, r.versionId, r.deploymentId, r.issuedAt, r.expiresAt],
      );
      return res.rowCount === 1;
    },
    async revoke(id, why, at) {
      const res = await pool.query(
        "UPDATE worker_identities SET status = 'REVOKED', revoked_at = $1, revoked_why = $2 WHERE instance_id = $3 AND status = 'ACTIVE'",
        [at, why, id],
      );
      return res.rowCount === 1;
    },
    async close() {
      // the pool belongs to the Store, which closes it
    },
  };
}
