// The secret store's rows on PostgreSQL, for API replicas that share one database: the same tables,
// SQL and rules as on SQLite (storage.ts, storage-steps.ts). Where SQLite serializes a write
// transaction by taking its single write lock (BEGIN IMMEDIATE), every multi-statement write here
// first takes one transaction-scoped advisory lock, so the checks that keep a rotation safe across
// replicas (never wrap under a retired MEK, never retire a MEK that still wraps a NEK, never delete
// a NEK a secret still uses) see what the others committed. Secret writes are operator actions,
// rare enough for one lock.
import type pg from "pg";
import { migratePostgres } from "../db/migrate.js";
import { PostgresRunner } from "../db/postgres.js";
import { SqlSecretStorage, type SecretStorage } from "./storage.js";

const SECRETS_LOCK = 0x63707363; // "cpsc"

export async function openPostgresSecretStorage(pool: pg.Pool): Promise<SecretStorage> {
  await migratePostgres(pool);
  return new SqlSecretStorage(new PostgresRunner(pool, SECRETS_LOCK));
}
