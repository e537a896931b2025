// The worker identities the API issued: one row per instance, ACTIVE until the instance is
// terminated (or provisioning is undone), then REVOKED for good. Kept in the API's database (a
// table of its own, made by the data layer's migrations: db/migrations.ts), beside the Store's
// tables. The SQL is written once for SQLite and PostgreSQL (db/steps.ts runs it on either).
import type Database from "better-sqlite3";
import type pg from "pg";
import { migratePostgres, migrateSqlite } from "./db/migrate.js";
import { PostgresRunner } from "./db/postgres.js";
import { SqliteRunner, openSqliteFile } from "./db/sqlite.js";
import { exec, first, type Row, type SqlRunner, type Steps } from "./db/steps.js";

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

export interface IdentityStore {
  get(instanceId: string): Promise<IdentityRecord | undefined>;
  /** Records an issue or a refresh; refuses (returns false) for a revoked instance. */
  issued(r: Omit<IdentityRecord, "status">): Promise<boolean>;
  /** Revokes; true when it was active. */
  revoke(instanceId: string, why: string, at: string): Promise<boolean>;
  close(): Promise<void>;
}

const fromRow = (r: Row): IdentityRecord => ({
  instanceId: r.instance_id as string,
  functionId: r.function_id as string,
  versionId: r.version_id as string,
  deploymentId: r.deployment_id as string,
  status: r.status as IdentityStatus,
  issuedAt: r.issued_at as string,
  expiresAt: r.expires_at as string,
  ...(r.revoked_at ? { revokedAt: r.revoked_at as string } : {}),
  ...(r.revoked_why ? { revokedWhy: r.revoked_why as string } : {}),
});

function* getIdentity(instanceId: string): Steps<IdentityRecord | undefined> {
  const r = yield* first("SELECT * FROM worker_identities WHERE instance_id = ?", [instanceId]);
  return r && fromRow(r);
}

/**
 * An issue or refresh is one statement that never brings a revoked identity back, whatever another
 * process or replica does meanwhile.
 */
function* recordIssued(r: Omit<IdentityRecord, "status">): Steps<boolean> {
  const changed = yield* exec(
    `INSERT INTO worker_identities (instance_id, function_id, version_id, deployment_id, status, issued_at, expires_at)
     VALUES (?, ?, ?, ?, 'ACTIVE', ?, ?)
     ON CONFLICT (instance_id) DO UPDATE SET issued_at = excluded.issued_at, expires_at = excluded.expires_at
     WHERE worker_identities.status = 'ACTIVE'`,
    [r.instanceId, r.functionId, r.versionId, r.deploymentId, r.issuedAt, r.expiresAt],
  );
  return changed === 1;
}

function* revokeIdentity(instanceId: string, why: string, at: string): Steps<boolean> {
  const changed = yield* exec(
    "UPDATE worker_identities SET status = 'REVOKED', revoked_at = ?, revoked_why = ? WHERE instance_id = ? AND status = 'ACTIVE'",
    [at, why, instanceId],
  );
  return changed === 1;
}

class SqlIdentityStore implements IdentityStore {
  constructor(
    private readonly db: SqlRunner,
    private readonly onClose: () => void,
  ) {}

  async get(instanceId: string) {
    return await this.db.run(getIdentity(instanceId));
  }
  async issued(r: Omit<IdentityRecord, "status">) {
    return await this.db.run(recordIssued(r));
  }
  async revoke(instanceId: string, why: string, at: string) {
    return await this.db.run(revokeIdentity(instanceId, why, at));
  }
  async close() {
    await Promise.resolve(this.onClose());
  }
}

/** The identities in the API's SQLite file, on a connection of their own. */
export function openIdentityStore(path: string): IdentityStore {
  const db: Database.Database = openSqliteFile(path);
  try {
    migrateSqlite(db);
  } catch (err) {
    db.close();
    throw err;
  }
  return new SqlIdentityStore(new SqliteRunner(db), () => db.close());
}

/** The same table on PostgreSQL, for API replicas sharing one database. */
export async function openPostgresIdentityStore(pool: pg.Pool): Promise<IdentityStore> {
  await migratePostgres(pool);
  // the pool belongs to the Store, which closes it
  return new SqlIdentityStore(new PostgresRunner(pool), () => undefined);
}
