/* eslint-disable @typescript-eslint/require-await -- better-sqlite3 is synchronous; the Store interface is async so that a networked backend (PostgreSQL) can implement it. */
import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import Database from "better-sqlite3";
import {
  VERSION_SELECT,
  deploymentFromRow,
  instanceFromRow,
  keyFromRow,
  versionFromRow,
  type DeploymentRow,
  type InstanceRow,
  type KeyRow,
  type VersionRow,
} from "./rows.js";
import { NameTakenError, type Store } from "./types.js";

/**
 * Versioned migrations; each runs once, in order, inside a transaction. Never edit a shipped one.
 * Both stores run them (postgres.ts too), so they are written in SQL that SQLite and PostgreSQL
 * both accept: TEXT columns, plain constraints and indexes, no SQLite- or PostgreSQL-only syntax.
 */
export const MIGRATIONS: ReadonlyArray<{ version: number; name: string; sql: string }> = [
  {
    version: 1,
    name: "functions, deployments, instances, api keys",
    sql: `
      CREATE TABLE functions (
        function_id TEXT PRIMARY KEY,
        name        TEXT NOT NULL UNIQUE,
        nca_id      TEXT NOT NULL,
        created_at  TEXT NOT NULL
      );
      CREATE TABLE function_versions (
        version_id  TEXT PRIMARY KEY,
        function_id TEXT NOT NULL REFERENCES functions(function_id),
        spec        TEXT NOT NULL,
        created_at  TEXT NOT NULL
      );
      CREATE INDEX function_versions_by_function ON function_versions(function_id);
      CREATE TABLE deployments (
        deployment_id TEXT PRIMARY KEY,
        function_id   TEXT NOT NULL,
        version_id    TEXT NOT NULL UNIQUE REFERENCES function_versions(version_id),
        specs         TEXT NOT NULL,
        created_at    TEXT NOT NULL,
        updated_at    TEXT NOT NULL
      );
      CREATE TABLE instances (
        instance_id   TEXT PRIMARY KEY,
        reporter      TEXT NOT NULL,
        deployment_id TEXT NOT NULL,
        function_id   TEXT NOT NULL,
        version_id    TEXT NOT NULL,
        status        TEXT NOT NULL,
        instance_type TEXT NOT NULL,
        gpu           TEXT NOT NULL,
        backend       TEXT NOT NULL,
        location      TEXT NOT NULL,
        message       TEXT,
        created_at    TEXT NOT NULL,
        updated_at    TEXT NOT NULL
      );
      CREATE INDEX instances_by_version ON instances(version_id);
      CREATE TABLE api_keys (
        key_id      TEXT PRIMARY KEY,
        hash        TEXT NOT NULL UNIQUE,
        description TEXT NOT NULL,
        owner_id    TEXT NOT NULL,
        scopes      TEXT NOT NULL,
        expires_at  TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        revoked_at  TEXT
      );
    `,
  },
];

export function migrate(db: Database.Database): number {
  db.exec(
    "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)",
  );
  const applied = new Set(
    (db.prepare("SELECT version FROM schema_migrations").all() as Array<{ version: number }>).map(
      (r) => r.version,
    ),
  );
  let n = 0;
  for (const m of MIGRATIONS) {
    if (applied.has(m.version)) continue;
    db.transaction(() => {
      db.exec(m.sql);
      db.prepare("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)").run(
        m.version,
        m.name,
        new Date().toISOString(),
      );
    })();
    n++;
  }
  return n;
}

export function openSqliteStore(path: string): Store & { db: Database.Database } {
  if (path !== ":memory:") mkdirSync(dirname(path), { recursive: true });
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.pragma("foreign_keys = ON");
  db.pragma("busy_timeout = 5000");
  migrate(db);

  const insertFunction = db.prepare(
    "INSERT INTO functions (function_id, name, nca_id, created_at) VALUES (?, ?, ?, ?)",
  );
  const insertVersion = db.prepare(
    "INSERT INTO function_versions (version_id, function_id, spec, created_at) VALUES (?, ?, ?, ?)",
  );

  const store: Store & { db: Database.Database } = {
    db,
    async createFunction(v) {
      try {
        db.transaction(() => {
          insertFunction.run(v.functionId, v.name, v.ncaId, v.createdAt);
          insertVersion.run(v.versionId, v.functionId, JSON.stringify(v.spec), v.createdAt);
        })();
      } catch (err) {
        if (/UNIQUE constraint failed: functions\.name/.test(String(err))) throw new NameTakenError(v.name);
        throw err;
      }
    },
    async createVersion(v) {
      insertVersion.run(v.versionId, v.functionId, JSON.stringify(v.spec), v.createdAt);
    },
    async updateVersion(functionId, versionId, spec) {
      const r = db
        .prepare("UPDATE function_versions SET spec = ? WHERE function_id = ? AND version_id = ?")
        .run(JSON.stringify(spec), functionId, versionId);
      return r.changes === 1;
    },
    async deleteVersion(functionId, versionId) {
      return db.transaction((): "deleted" | "not-found" | "deployed" => {
        const exists = db
          .prepare("SELECT 1 FROM function_versions WHERE function_id = ? AND version_id = ?")
          .get(functionId, versionId);
        if (!exists) return "not-found";
        if (db.prepare("SELECT 1 FROM deployments WHERE version_id = ?").get(versionId)) return "deployed";
        db.prepare("DELETE FROM instances WHERE version_id = ?").run(versionId);
        db.prepare("DELETE FROM function_versions WHERE version_id = ?").run(versionId);
        const left = db
          .prepare("SELECT COUNT(*) AS n FROM function_versions WHERE function_id = ?")
          .get(functionId) as { n: number };
        if (left.n === 0) db.prepare("DELETE FROM functions WHERE function_id = ?").run(functionId);
        return "deleted";
      })();
    },
    async getFunctionByName(name) {
      const r = db.prepare("SELECT function_id FROM functions WHERE name = ?").get(name) as
        { function_id: string } | undefined;
      return r && { functionId: r.function_id };
    },
    async functionExists(functionId) {
      return db.prepare("SELECT 1 FROM functions WHERE function_id = ?").get(functionId) !== undefined;
    },
    async getVersion(functionId, versionId) {
      const r = db
        .prepare(`${VERSION_SELECT} WHERE v.function_id = ? AND v.version_id = ?`)
        .get(functionId, versionId) as VersionRow | undefined;
      return r && versionFromRow(r);
    },
    async listVersions(functionId) {
      const rows = (
        functionId === undefined
          ? db.prepare(`${VERSION_SELECT} ORDER BY f.name, v.created_at`).all()
          : db.prepare(`${VERSION_SELECT} WHERE v.function_id = ? ORDER BY v.created_at`).all(functionId)
      ) as VersionRow[];
      return rows.map(versionFromRow);
    },
    async createDeployment(d) {
      return db.transaction((): "created" | "exists" => {
        if (db.prepare("SELECT 1 FROM deployments WHERE version_id = ?").get(d.versionId)) return "exists";
        db.prepare(
          "INSERT INTO deployments (deployment_id, function_id, version_id, specs, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
        ).run(d.deploymentId, d.functionId, d.versionId, JSON.stringify(d.specs), d.createdAt, d.updatedAt);
        return "created";
      })();
    },
    async updateDeployment(functionId, versionId, specs, updatedAt) {
      const r = db
        .prepare("UPDATE deployments SET specs = ?, updated_at = ? WHERE function_id = ? AND version_id = ?")
        .run(JSON.stringify(specs), updatedAt, functionId, versionId);
      return r.changes === 1;
    },
    async deleteDeployment(functionId, versionId) {
      return db.transaction(() => {
        const r = db
          .prepare("DELETE FROM deployments WHERE function_id = ? AND version_id = ?")
          .run(functionId, versionId);
        // instances of an undeployed version would otherwise count towards its next deployment
        if (r.changes === 1) db.prepare("DELETE FROM instances WHERE version_id = ?").run(versionId);
        return r.changes === 1;
      })();
    },
    async getDeployment(functionId, versionId) {
      const r = db
        .prepare("SELECT * FROM deployments WHERE function_id = ? AND version_id = ?")
        .get(functionId, versionId) as DeploymentRow | undefined;
      return r && deploymentFromRow(r);
    },
    async getDeploymentById(deploymentId) {
      const r = db.prepare("SELECT * FROM deployments WHERE deployment_id = ?").get(deploymentId) as
        DeploymentRow | undefined;
      return r && deploymentFromRow(r);
    },
    async listDeployments() {
      return (db.prepare("SELECT * FROM deployments ORDER BY created_at").all() as DeploymentRow[]).map(
        deploymentFromRow,
      );
    },
    async reportInstances(reporter, instances) {
      const upsert =
        db.prepare(`INSERT INTO instances (instance_id, reporter, deployment_id, function_id, version_id, status, instance_type, gpu, backend, location, message, created_at, updated_at)
        VALUES (@instanceId, @reporter, @deploymentId, @functionId, @versionId, @status, @instanceType, @gpu, @backend, @location, @message, @createdAt, @updatedAt)
        ON CONFLICT(instance_id) DO UPDATE SET status = excluded.status, message = excluded.message, updated_at = excluded.updated_at`);
      db.transaction(() => {
        db.prepare("DELETE FROM instances WHERE reporter = ?").run(reporter);
        for (const i of instances) upsert.run({ ...i, reporter, message: i.message ?? null });
      })();
    },
    async listInstances(versionId) {
      const rows = (
        versionId === undefined
          ? db.prepare("SELECT * FROM instances ORDER BY created_at").all()
          : db.prepare("SELECT * FROM instances WHERE version_id = ? ORDER BY created_at").all(versionId)
      ) as InstanceRow[];
      return rows.map(instanceFromRow);
    },
    async createApiKey(k) {
      db.prepare(
        "INSERT INTO api_keys (key_id, hash, description, owner_id, scopes, expires_at, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
      ).run(k.keyId, k.hash, k.description, k.ownerId, JSON.stringify(k.scopes), k.expiresAt, k.createdAt);
    },
    async getApiKeyByHash(hash) {
      const r = db.prepare("SELECT * FROM api_keys WHERE hash = ?").get(hash) as KeyRow | undefined;
      return r && keyFromRow(r);
    },
    async getApiKey(keyId) {
      const r = db.prepare("SELECT * FROM api_keys WHERE key_id = ?").get(keyId) as KeyRow | undefined;
      return r && keyFromRow(r);
    },
    async listApiKeys() {
      return (db.prepare("SELECT * FROM api_keys ORDER BY created_at").all() as KeyRow[]).map(keyFromRow);
    },
    async revokeApiKey(keyId, at) {
      const r = db
        .prepare("UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL")
        .run(at, keyId);
      return r.changes === 1;
    },
    async close() {
      db.close();
    },
  };
  return store;
}
