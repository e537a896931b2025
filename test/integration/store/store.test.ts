// Nothing is lost: every multi-row write of the SQLite store is one transaction, a failed write
// leaves no trace (directly and through the HTTP API), and migrations run once per database file.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { test } from "node:test";
import type Database from "better-sqlite3";
import { migrateSqlite } from "../../../src/services/api/db/migrate.js";
import { MIGRATIONS } from "../../../src/services/api/db/migrations.js";
import { openSqliteStore } from "../../../src/services/api/store/sqlite.js";
import type { FunctionVersionRecord, InstanceRecord } from "../../../src/services/api/store/types.js";
import { call, sampleFunction, startApi, tmpDir, type JsonResponse } from "../../testkit/index.js";

const FAIL_VERSION_INSERT = `CREATE TRIGGER fail_version_insert BEFORE INSERT ON function_versions
  BEGIN SELECT RAISE(ABORT, 'injected'); END`;

function record(name: string, functionId = randomUUID()): FunctionVersionRecord {
  return {
    functionId,
    versionId: randomUUID(),
    name,
    ncaId: "callplane",
    createdAt: new Date().toISOString(),
    spec: {
      inferenceUrl: "/echo",
      inferencePort: 8000,
      health: { protocol: "HTTP", uri: "/health", port: 8000, timeout: "PT10S", expectedStatusCode: 200 },
      containerImage: "local/echo",
      containerEnvironment: [],
      tags: [],
      functionType: "DEFAULT",
      apiBodyFormat: "CUSTOM",
    },
  };
}

function instance(v: FunctionVersionRecord, instanceId: string): InstanceRecord {
  const now = new Date().toISOString();
  return {
    instanceId,
    deploymentId: randomUUID(),
    functionId: v.functionId,
    versionId: v.versionId,
    status: "ACTIVE",
    instanceType: "local.cpu",
    gpu: "local",
    backend: "local",
    location: "here",
    createdAt: now,
    updatedAt: now,
  };
}

const count = (db: Database.Database, table: string) =>
  (db.prepare(`SELECT COUNT(*) AS n FROM ${table}`).get() as { n: number }).n;

test("a failed createFunction rolls back: no function row without its version", async (t) => {
  const store = openSqliteStore(join(tmpDir(t), "callplane.db"));
  t.after(() => store.close());
  store.db.exec(FAIL_VERSION_INSERT);

  await assert.rejects(store.createFunction(record("echo")), /injected/);
  assert.equal(count(store.db, "functions"), 0);
  assert.equal(count(store.db, "function_versions"), 0);
  assert.equal(await store.getFunctionByName("echo"), undefined);
  assert.deepEqual(await store.listVersions(), []);

  store.db.exec("DROP TRIGGER fail_version_insert");
  const v = record("echo");
  await store.createFunction(v);
  assert.equal(count(store.db, "functions"), 1);
  assert.deepEqual(await store.getVersion(v.functionId, v.versionId), v);
});

test("a failed delete of the last version keeps the version and its function", async (t) => {
  const store = openSqliteStore(join(tmpDir(t), "callplane.db"));
  t.after(() => store.close());
  const v = record("echo");
  await store.createFunction(v);
  store.db.exec(
    "CREATE TRIGGER fail_function_delete BEFORE DELETE ON functions BEGIN SELECT RAISE(ABORT, 'injected'); END",
  );
  await assert.rejects(store.deleteVersion(v.functionId, v.versionId), /injected/);
  assert.deepEqual(await store.getVersion(v.functionId, v.versionId), v);
  assert.equal(await store.functionExists(v.functionId), true);

  store.db.exec("DROP TRIGGER fail_function_delete");
  assert.equal(await store.deleteVersion(v.functionId, v.versionId), "deleted");
  assert.equal(await store.functionExists(v.functionId), false);
  assert.equal(count(store.db, "function_versions"), 0);
});

test("a failed instance report keeps what the reporter said before", async (t) => {
  const store = openSqliteStore(join(tmpDir(t), "callplane.db"));
  t.after(() => store.close());
  const v = record("echo");
  await store.createFunction(v);
  await store.reportInstances("agent-1", [instance(v, "i-1")]);
  store.db.exec(
    "CREATE TRIGGER fail_instance_insert BEFORE INSERT ON instances WHEN NEW.instance_id = 'i-bad' BEGIN SELECT RAISE(ABORT, 'injected'); END",
  );
  await assert.rejects(
    store.reportInstances("agent-1", [instance(v, "i-2"), instance(v, "i-bad")]),
    /injected/,
  );
  assert.deepEqual(
    (await store.listInstances()).map((i) => i.instanceId),
    ["i-1"],
  );
});

test("through the API, a failed write is 500 INTERNAL without its cause, and nothing is stored", async (t) => {
  const api = await startApi(t);
  const admin = await api.adminToken();
  const { db } = api.store as typeof api.store & { db: Database.Database };
  db.exec(FAIL_VERSION_INSERT);

  const r: JsonResponse<Record<string, unknown>> = await call(`${api.url}/v2/nvcf/functions`, {
    token: admin,
    body: sampleFunction("echo"),
  });
  assert.equal(r.status, 500, r.text);
  assert.match(r.headers.get("content-type") ?? "", /^application\/problem\+json/);
  assert.equal(r.body.code, "INTERNAL");
  assert.equal(r.body.status, 500);
  assert.equal(r.body.title, "Internal error");
  assert.equal(typeof r.body.detail, "string");
  assert.match(r.body.detail as string, /log/);
  assert.deepEqual(Object.keys(r.body).sort(), ["code", "detail", "status", "title", "type"]);
  assert.doesNotMatch(r.text, /injected|sqlite|SQLITE|stack|function_versions/i);

  const list = await call(`${api.url}/v2/nvcf/functions`, { token: admin });
  assert.equal(list.status, 200);
  assert.deepEqual(list.body, { functions: [] });
  const ids = await call(`${api.url}/v2/nvcf/functions/ids`, { token: admin });
  assert.deepEqual(ids.body, { functionIds: [] });
  assert.equal(count(db, "functions"), 0);

  // the name was not taken by the failed attempt
  db.exec("DROP TRIGGER fail_version_insert");
  const again = await call(`${api.url}/v2/nvcf/functions`, { token: admin, body: sampleFunction("echo") });
  assert.equal(again.status, 200, again.text);
});

test("migrations run once: reopening the same file does not re-run them", async (t) => {
  const file = join(tmpDir(t), "nested", "dir", "callplane.db");
  const first = openSqliteStore(file);
  const rows = () =>
    first.db
      .prepare("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
      .all() as Array<{
      version: number;
      name: string;
      applied_at: string;
    }>;
  const applied = rows();
  assert.deepEqual(
    applied.map((r) => r.version),
    MIGRATIONS.map((m) => m.version),
  );
  assert.deepEqual(
    applied.map((r) => r.name),
    MIGRATIONS.map((m) => m.name),
  );
  const v = record("echo");
  await first.createFunction(v);
  await first.close();

  const second = openSqliteStore(file);
  t.after(() => second.close());
  const after = second.db
    .prepare("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
    .all();
  assert.deepEqual(after, applied, "one row per migration, unchanged");
  assert.deepEqual(migrateSqlite(second.db), { ran: [], adopted: [] }, "nothing left to apply");
  assert.equal(count(second.db, "schema_migrations"), MIGRATIONS.length);
  assert.deepEqual(await second.listVersions(), [v], "data written before reopening is still there");
});

test("a fresh in-memory store applies every migration", (t) => {
  const store = openSqliteStore(":memory:");
  t.after(() => store.close());
  assert.equal(count(store.db, "schema_migrations"), MIGRATIONS.length);
  assert.deepEqual(migrateSqlite(store.db), { ran: [], adopted: [] });
});
