// A database made by the code before the one migration runner (SQLite file or PostgreSQL) is
// recognised and migrated forward without losing a row: the store's version 1 is read from
// schema_migrations, the secret storage's and the identity store's tables are found in place and
// recorded, nothing is re-created, and the result has the schema of a new database. Each part then
// reads the old rows and writes new ones through its own interface.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, test } from "node:test";
import Database from "better-sqlite3";
import pg from "pg";
import { migratePostgres, migrateSqlite } from "../../../src/services/api/db/migrate.js";
import { MIGRATIONS } from "../../../src/services/api/db/migrations.js";
import { numbered } from "../../../src/services/api/db/postgres.js";
import {
  openIdentityStore,
  openPostgresIdentityStore,
  type IdentityStore,
} from "../../../src/services/api/identity-store.js";
import { openSqliteSecretStorage, type SecretStorage } from "../../../src/services/api/secrets/storage.js";
import { openPostgresSecretStorage } from "../../../src/services/api/secrets/storage-postgres.js";
import { openPostgresStore } from "../../../src/services/api/store/postgres.js";
import { openSqliteStore } from "../../../src/services/api/store/sqlite.js";
import type { Store } from "../../../src/services/api/store/types.js";
import {
  MIGRATION_TABLE,
  SECRETS_V1_POSTGRES,
  SECRETS_V1_SQLITE,
  STORE_V1,
  STORE_V1_NAME,
  oldSchema,
} from "../../fixtures/schema-before-runner.js";
import { tmpDir } from "../../testkit/index.js";
import { startPostgres, type Postgres } from "../../testkit/postgres.js";

const AT = "2026-01-02T03:04:05.000Z";
const MS = 1_767_323_045_000;
const SPEC = { inferenceUrl: "/echo", inferencePort: 8000, containerImage: "local/echo" };
const WRAPPED = Buffer.from("wrapped-nek-bytes\u0000\u00ff");
const CIPHERTEXT = Buffer.from("ciphertext\u0000\u0001\u00fe");

/** One row in each table the parts read, as the old code wrote them. */
const OLD_ROWS: Array<[string, unknown[]]> = [
  [
    "INSERT INTO functions (function_id, name, nca_id, created_at) VALUES (?, ?, ?, ?)",
    ["f-1", "echo", "nca", AT],
  ],
  [
    "INSERT INTO function_versions (version_id, function_id, spec, created_at) VALUES (?, ?, ?, ?)",
    ["v-1", "f-1", JSON.stringify(SPEC), AT],
  ],
  [
    "INSERT INTO api_keys (key_id, hash, description, owner_id, scopes, expires_at, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
    ["k-1", "hash-1", "old key", "me", JSON.stringify(["invoke_function"]), AT, AT],
  ],
  [
    "INSERT INTO secret_meks (kid, state, added_ms, promoted_ms) VALUES (?, 'primary', ?, ?)",
    ["mek-1", MS, MS],
  ],
  [
    "INSERT INTO secret_mek_rotations (rotation_id, from_kid, to_kid, phase, open, rolled_back, started_ms, promote_after_ms, neks_at_start) VALUES (?, ?, ?, 'done', NULL, 0, ?, ?, ?)",
    ["r-1", "mek-0", "mek-1", MS, MS, 1],
  ],
  [
    "INSERT INTO secret_neks (nek_id, namespace, state, mek_kid, wrapped, encryptions, created_ms, wrapped_ms) VALUES (?, ?, 'active', ?, ?, 1, ?, ?)",
    ["n-1", "f-1", "mek-1", WRAPPED, MS, MS],
  ],
  [
    "INSERT INTO secret_values (version_id, name, function_id, nek_id, ciphertext, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
    ["v-1", "TOKEN", "f-1", "n-1", CIPHERTEXT, MS, MS],
  ],
  ["INSERT INTO secret_revisions (version_id, revision) VALUES (?, ?)", ["v-1", 1]],
  [
    "INSERT INTO worker_identities (instance_id, function_id, version_id, deployment_id, status, issued_at, expires_at, revoked_at, revoked_why) VALUES (?, ?, ?, ?, 'REVOKED', ?, ?, ?, ?)",
    ["i-1", "f-1", "v-1", "d-1", AT, AT, AT, "terminated"],
  ],
];

const ALL_VERSIONS = MIGRATIONS.map((m) => [m.version, m.name]);

/** The old rows read, and new rows written, through each part's own interface. */
async function checkParts(store: Store, secrets: SecretStorage, identities: IdentityStore) {
  const v = await store.getVersion("f-1", "v-1");
  assert.deepEqual(v, {
    functionId: "f-1",
    versionId: "v-1",
    name: "echo",
    ncaId: "nca",
    spec: SPEC,
    createdAt: AT,
  });
  assert.deepEqual((await store.getApiKeyByHash("hash-1"))?.scopes, ["invoke_function"]);
  await store.createFunction({ ...v, functionId: "f-2", versionId: "v-2", name: "echo-2" });
  assert.deepEqual(
    (await store.listVersions()).map((x) => x.name),
    ["echo", "echo-2"],
  );

  assert.deepEqual(await secrets.meks(), [
    { kid: "mek-1", state: "primary", addedMs: MS, promotedMs: MS, retiredMs: null },
  ]);
  assert.equal((await secrets.latestRotation())?.rotationId, "r-1");
  assert.deepEqual((await secrets.activeNek("f-1"))?.wrapped, WRAPPED);
  assert.deepEqual(await secrets.secret("v-1", "TOKEN"), {
    functionId: "f-1",
    versionId: "v-1",
    name: "TOKEN",
    nekId: "n-1",
    ciphertext: CIPHERTEXT,
    createdMs: MS,
    updatedMs: MS,
  });
  const row = {
    functionId: "f-1",
    versionId: "v-1",
    name: "OTHER",
    nekId: "n-1",
    ciphertext: CIPHERTEXT,
    createdMs: MS,
    updatedMs: MS,
  };
  assert.equal(await secrets.putSecrets([row]), "stored");
  assert.deepEqual(await secrets.names(["v-1"]), new Map([["v-1", ["OTHER", "TOKEN"]]]));
  assert.deepEqual(await secrets.revisions(), new Map([["v-1", 2]]));
  assert.deepEqual(await secrets.nekStats(), { total: 1, retiring: 0, maxEncryptions: 2 });

  assert.equal((await identities.get("i-1"))?.revokedWhy, "terminated");
  const issue = {
    instanceId: "i-1",
    functionId: "f-1",
    versionId: "v-1",
    deploymentId: "d-1",
    issuedAt: AT,
    expiresAt: AT,
  };
  assert.equal(await identities.issued(issue), false, "a revoked identity stays revoked");
  assert.equal(await identities.issued({ ...issue, instanceId: "i-2" }), true);
  assert.equal((await identities.get("i-2"))?.status, "ACTIVE");
}

/** Tables (columns, types, constraints) and indexes of a SQLite database, but the old secret migration table. */
function sqliteSchema(db: Database.Database) {
  const tables = (
    db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").all() as Array<{
      name: string;
    }>
  )
    .map((r) => r.name)
    .filter((n) => n !== "secret_schema_migrations");
  return {
    tables: tables.map((n) => [
      n,
      db.prepare(`PRAGMA table_info(${n})`).all(),
      db.prepare(`PRAGMA foreign_key_list(${n})`).all(),
    ]),
    indexes: (
      db
        .prepare("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' ORDER BY name")
        .all() as Array<{
        name: string;
        tbl_name: string;
        sql: string | null;
      }>
    ).map((r) => [r.name, r.tbl_name, r.sql?.replace(/\s+/g, " ")]),
  };
}

test("a SQLite file made before the runner is migrated forward: nothing re-created, nothing lost", async (t) => {
  const file = join(tmpDir(t), "callplane.db");
  const old = new Database(file);
  for (const sql of oldSchema(SECRETS_V1_SQLITE)) old.exec(sql);
  for (const [sql, params] of OLD_ROWS) old.prepare(sql).run(...params);
  old.close();

  const db = new Database(file);
  assert.deepEqual(
    migrateSqlite(db),
    { ran: [4, 5, 6, 7, 8], adopted: [2, 3] },
    "the store's version 1 was recorded already",
  );
  assert.deepEqual(
    db.prepare("SELECT version, name FROM schema_migrations ORDER BY version").raw().all(),
    ALL_VERSIONS,
  );
  assert.deepEqual(migrateSqlite(db), { ran: [], adopted: [] });
  const fresh = new Database(":memory:");
  assert.deepEqual(migrateSqlite(fresh), { ran: [1, 2, 3, 4, 5, 6, 7, 8], adopted: [] });
  assert.deepEqual(sqliteSchema(db), sqliteSchema(fresh), "the same schema as a new database");
  fresh.close();
  db.close();

  const store = openSqliteStore(file);
  t.after(() => store.close());
  const identities = openIdentityStore(file);
  t.after(() => identities.close());
  await checkParts(store, openSqliteSecretStorage(store.db), identities);
});

test("a SQLite file from before the secret storage and the identities gets their tables", async (t) => {
  const file = join(tmpDir(t), "callplane.db");
  const old = new Database(file);
  old.exec(MIGRATION_TABLE);
  old.exec(STORE_V1);
  old
    .prepare("INSERT INTO schema_migrations (version, name, applied_at) VALUES (1, ?, ?)")
    .run(STORE_V1_NAME, AT);
  for (const [sql, params] of OLD_ROWS.slice(0, 3)) old.prepare(sql).run(...params);
  assert.deepEqual(migrateSqlite(old), { ran: [2, 3, 4, 5, 6, 7, 8], adopted: [] });
  for (const [sql, params] of OLD_ROWS.slice(3)) old.prepare(sql).run(...params);
  old.close();

  const store = openSqliteStore(file);
  t.after(() => store.close());
  const identities = openIdentityStore(file);
  t.after(() => identities.close());
  await checkParts(store, openSqliteSecretStorage(store.db), identities);
});

let server: Promise<Postgres> | undefined;
const serverCleanup: Array<() => unknown> = [];
after(async () => {
  for (const f of serverCleanup) await f();
});
async function database(name: string): Promise<string> {
  server ??= startPostgres({ after: (fn) => void serverCleanup.push(fn as () => unknown) });
  return (await server).createDatabase(`${name}_${process.pid}_${Date.now()}`);
}

async function postgresSchema(pool: pg.Pool) {
  const columns = await pool.query(
    `SELECT table_name, column_name, ordinal_position, data_type, is_nullable, column_default
     FROM information_schema.columns WHERE table_schema = current_schema() AND table_name <> 'secret_schema_migrations'
     ORDER BY table_name, ordinal_position`,
  );
  const constraints = await pool.query(
    `SELECT c.conrelid::regclass::text AS tbl, c.conname, pg_get_constraintdef(c.oid) AS def
     FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
     WHERE n.nspname = current_schema() AND c.conrelid::regclass::text <> 'secret_schema_migrations'
     ORDER BY 1, 2`,
  );
  const indexes = await pool.query(
    "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename <> 'secret_schema_migrations' ORDER BY indexname",
  );
  return { columns: columns.rows, constraints: constraints.rows, indexes: indexes.rows };
}

test("a PostgreSQL database made before the runner is migrated forward: nothing re-created, nothing lost", async (t) => {
  const url = await database("old");
  const old = new pg.Client({ connectionString: url });
  await old.connect();
  for (const sql of oldSchema(SECRETS_V1_POSTGRES)) await old.query(sql);
  for (const [sql, params] of OLD_ROWS) await old.query(numbered(sql), params);
  await old.end();

  const pool = new pg.Pool({ connectionString: url, max: 2 });
  // as the store's own pool does: an idle connection the server ends at teardown is no test failure
  pool.on("error", () => undefined);
  t.after(() => pool.end());
  assert.deepEqual(await migratePostgres(pool), { ran: [4, 5, 6, 7, 8], adopted: [2, 3] });
  assert.deepEqual(
    (
      await pool.query({
        text: "SELECT version, name FROM schema_migrations ORDER BY version",
        rowMode: "array",
      })
    ).rows,
    ALL_VERSIONS,
  );
  assert.deepEqual(await migratePostgres(pool), { ran: [], adopted: [] });
  const freshPool = new pg.Pool({ connectionString: await database("fresh"), max: 2 });
  freshPool.on("error", () => undefined);
  t.after(() => freshPool.end());
  assert.deepEqual(await migratePostgres(freshPool), { ran: [1, 2, 3, 4, 5, 6, 7, 8], adopted: [] });
  assert.deepEqual(
    await postgresSchema(pool),
    await postgresSchema(freshPool),
    "the same schema as a new database",
  );

  const store = await openPostgresStore({ url });
  t.after(() => store.close());
  await checkParts(
    store,
    await openPostgresSecretStorage(store.pool),
    await openPostgresIdentityStore(store.pool),
  );
});
