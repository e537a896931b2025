// The one migration runner of the data layer: brings an API database (SQLite file or PostgreSQL)
// up to MIGRATIONS, whichever part opens it first. The whole run is one transaction under the
// runner's write lock, so API processes starting together on one database apply each migration
// once, and a failed migration leaves the database as it was.
//
// Versions are recorded in schema_migrations (version, name, applied_at), the table the store
// always used: a store database made before this runner has version 1 there already. The secret
// storage (secret_schema_migrations) and the identity store (no record) kept their schemas apart
// then; their migrations name a table that shows they are in place (adoptIfTableExists), and are
// recorded as applied without running. The old secret_schema_migrations table is left as it was.
import type Database from "better-sqlite3";
import type pg from "pg";
import type { Dialect } from "./dialect.js";
import { MIGRATIONS } from "./migrations.js";
import { PostgresRunner } from "./postgres.js";
import { SqliteRunner } from "./sqlite.js";
import { exec, first, query, script, type Steps } from "./steps.js";

/** One advisory lock key for migrations, so that replicas starting together apply each once. */
const MIGRATION_LOCK = 0x63706c6e; // "cpln"

export interface MigrationReport {
  /** Versions whose SQL ran. */
  ran: number[];
  /** Versions found in place (a database from before the runner) and recorded as applied. */
  adopted: number[];
}

/** The run itself, the same on both databases (a runner of db/sqlite.ts or db/postgres.ts executes it). */
export function* migrationSteps(d: Dialect): Steps<MigrationReport> {
  yield* script(
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)",
  );
  const applied = new Set(
    (yield* query("SELECT version FROM schema_migrations")).map((r) => Number(r.version)),
  );
  const report: MigrationReport = { ran: [], adopted: [] };
  for (const m of MIGRATIONS) {
    if (applied.has(m.version)) continue;
    const inPlace =
      m.adoptIfTableExists !== undefined &&
      (yield* first(d.tableExistsSql, [m.adoptIfTableExists])) !== undefined;
    if (!inPlace) yield* script(m.sql(d.types));
    yield* exec("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)", [
      m.version,
      m.name,
      new Date().toISOString(),
    ]);
    (inPlace ? report.adopted : report.ran).push(m.version);
  }
  return report;
}

export function migrateSqlite(db: Database.Database): MigrationReport {
  const runner = new SqliteRunner(db);
  return runner.transaction(migrationSteps(runner.dialect));
}

export function migratePostgres(pool: pg.Pool): Promise<MigrationReport> {
  const runner = new PostgresRunner(pool, MIGRATION_LOCK);
  return runner.transaction(migrationSteps(runner.dialect));
}
