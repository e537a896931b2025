/* eslint-disable @typescript-eslint/require-await -- better-sqlite3 is synchronous; the Store interface is async so that a networked backend (PostgreSQL) can implement it. */
// The control plane's store in the API's SQLite file. Its schema is the data layer's one list of
// migrations (../db/migrations.ts), shared with the PostgreSQL store, the secret storage and the
// worker identities.
import type Database from "better-sqlite3";
import { migrateSqlite } from "../db/migrate.js";
import { openSqliteFile } from "../db/sqlite.js";
import {
  VERSION_SELECT,
  WORKER_AUTH_SELECT,
  WORKER_BY_SUBJECT_SELECT,
  LIVE_OF_REPORTER_SELECT,
  endedInstances,
  clusterKeysFromRow,
  type ClusterKeysRow,
  workerSubColumn,
  accountFromRow,
  AUDIT_INSERT,
  auditFromRow,
  auditParams,
  type AuditRow,
  clusterFromRow,
  type ClusterRow,
  instanceWorkerAuthFromRow,
  type InstanceWorkerAuthRow,
  workerAuthColumn,
  type AccountRow,
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

export function openSqliteStore(path: string): Store & { db: Database.Database } {
  const db = openSqliteFile(path);
  migrateSqlite(db);

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
        if (left.n === 0) {
          db.prepare("DELETE FROM functions WHERE function_id = ?").run(functionId);
          db.prepare("DELETE FROM function_authorizations WHERE function_id = ?").run(functionId);
        }
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
        db.prepare(`INSERT INTO instances (instance_id, reporter, deployment_id, function_id, version_id, status, instance_type, gpu, backend, location, message, worker_auth, worker_sub, created_at, updated_at)
        VALUES (@instanceId, @reporter, @deploymentId, @functionId, @versionId, @status, @instanceType, @gpu, @backend, @location, @message, @workerAuth, @workerSub, @createdAt, @updatedAt)
        ON CONFLICT(instance_id) DO UPDATE SET status = excluded.status, message = excluded.message, worker_auth = excluded.worker_auth, worker_sub = excluded.worker_sub, updated_at = excluded.updated_at
        WHERE instances.reporter = excluded.reporter`);
      const refused: string[] = [];
      let ended: string[] = [];
      db.transaction(() => {
        const before = db.prepare(LIVE_OF_REPORTER_SELECT).all(reporter) as Array<{ instance_id: string }>;
        ended = endedInstances(before, instances);
        db.prepare("DELETE FROM instances WHERE reporter = ?").run(reporter);
        for (const i of instances) {
          const r = upsert.run({
            ...i,
            reporter,
            message: i.message ?? null,
            workerAuth: workerAuthColumn(i),
            workerSub: workerSubColumn(i),
          });
          if (r.changes === 0) refused.push(i.instanceId);
        }
      })();
      return { refused, ended };
    },
    async listInstances(versionId) {
      const rows = (
        versionId === undefined
          ? db.prepare("SELECT * FROM instances ORDER BY created_at").all()
          : db.prepare("SELECT * FROM instances WHERE version_id = ? ORDER BY created_at").all(versionId)
      ) as InstanceRow[];
      return rows.map(instanceFromRow);
    },
    async workerAuthOf(instanceId) {
      const r = db.prepare(WORKER_AUTH_SELECT).get(instanceId) as InstanceWorkerAuthRow | undefined;
      return r && instanceWorkerAuthFromRow(r);
    },
    async workerAuthBySubject(sub, reporter) {
      const r = db.prepare(WORKER_BY_SUBJECT_SELECT).get(sub, reporter) as InstanceWorkerAuthRow | undefined;
      return r && instanceWorkerAuthFromRow(r);
    },
    async clusterKeys(clusterId) {
      const r = db.prepare("SELECT * FROM cluster_keys WHERE cluster_id = ?").get(clusterId) as
        ClusterKeysRow | undefined;
      return r && clusterKeysFromRow(r);
    },
    async setClusterKeys(k) {
      db.prepare(
        `INSERT INTO cluster_keys (cluster_id, issuer, jwks, jwks_hash, agent_subject, updated_by, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT(cluster_id) DO UPDATE SET issuer = excluded.issuer, jwks = excluded.jwks, jwks_hash = excluded.jwks_hash, agent_subject = excluded.agent_subject, updated_by = excluded.updated_by, updated_at = excluded.updated_at`,
      ).run(
        k.clusterId,
        k.issuer,
        JSON.stringify(k.jwks),
        k.jwksHash,
        k.agentSubject ?? null,
        k.updatedBy,
        k.updatedAt,
      );
    },
    async registerCluster(c) {
      db.prepare(
        `INSERT INTO clusters (cluster_id, backend, instance_types, updated_at) VALUES (?, ?, ?, ?)
         ON CONFLICT(cluster_id) DO UPDATE SET backend = excluded.backend, instance_types = excluded.instance_types, updated_at = excluded.updated_at`,
      ).run(c.clusterId, c.backend, JSON.stringify(c.instanceTypes), c.updatedAt);
    },
    async listClusters() {
      return (db.prepare("SELECT * FROM clusters ORDER BY cluster_id").all() as ClusterRow[]).map(
        clusterFromRow,
      );
    },
    async createApiKey(k) {
      db.prepare(
        "INSERT INTO api_keys (key_id, hash, description, owner_id, nca_id, scopes, policies, expires_at, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
      ).run(
        k.keyId,
        k.hash,
        k.description,
        k.ownerId,
        k.ncaId,
        JSON.stringify(k.scopes),
        JSON.stringify(k.policies),
        k.expiresAt,
        k.createdAt,
      );
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
    async createAccount(a) {
      const r = db
        .prepare("INSERT INTO accounts (nca_id, name, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")
        .run(a.ncaId, a.name, a.createdAt);
      return r.changes === 1 ? "created" : "name-taken";
    },
    async adoptIntoAccount(a) {
      db.transaction(() => {
        db.prepare(
          "INSERT INTO accounts (nca_id, name, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        ).run(a.ncaId, a.name, a.createdAt);
        db.prepare("UPDATE api_keys SET nca_id = ? WHERE nca_id = ''").run(a.ncaId);
      })();
    },
    async getAccount(ncaId) {
      const r = db.prepare("SELECT * FROM accounts WHERE nca_id = ?").get(ncaId) as AccountRow | undefined;
      return r && accountFromRow(r);
    },
    async listAccounts() {
      return (db.prepare("SELECT * FROM accounts ORDER BY created_at").all() as AccountRow[]).map(
        accountFromRow,
      );
    },
    async authorize(functionId, ncaId, at) {
      const r = db
        .prepare(
          "INSERT INTO function_authorizations (function_id, nca_id, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .run(functionId, ncaId, at);
      return r.changes === 1;
    },
    async unauthorize(functionId, ncaId) {
      const r = db
        .prepare("DELETE FROM function_authorizations WHERE function_id = ? AND nca_id = ?")
        .run(functionId, ncaId);
      return r.changes === 1;
    },
    async listAuthorizedAccounts(functionId) {
      return (
        db
          .prepare("SELECT nca_id FROM function_authorizations WHERE function_id = ? ORDER BY created_at")
          .all(functionId) as Array<{ nca_id: string }>
      ).map((r) => r.nca_id);
    },
    async listAuthorizedFunctions(ncaId) {
      return (
        db
          .prepare("SELECT function_id FROM function_authorizations WHERE nca_id = ? ORDER BY created_at")
          .all(ncaId) as Array<{ function_id: string }>
      ).map((r) => r.function_id);
    },
    async revokeAdminToken(tokenId, at) {
      const r = db
        .prepare(
          "INSERT INTO revoked_admin_tokens (token_id, revoked_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
        )
        .run(tokenId, at);
      return r.changes === 1;
    },
    async adminTokenRevokedAt(tokenId) {
      const r = db.prepare("SELECT revoked_at FROM revoked_admin_tokens WHERE token_id = ?").get(tokenId) as
        { revoked_at: string } | undefined;
      return r?.revoked_at;
    },
    async appendAudit(e) {
      db.prepare(AUDIT_INSERT).run(...auditParams(e));
    },
    async listAudit({ limit, offset }) {
      return (
        db
          .prepare("SELECT * FROM audit_log ORDER BY at DESC, rowid DESC LIMIT ? OFFSET ?")
          .all(limit, offset) as AuditRow[]
      ).map(auditFromRow);
    },
    async pruneAudit({ keepRows, before }) {
      const old = db.prepare("DELETE FROM audit_log WHERE at < ?").run(before).changes;
      const over = db
        .prepare(
          "DELETE FROM audit_log WHERE rowid IN (SELECT rowid FROM audit_log ORDER BY at DESC, rowid DESC LIMIT -1 OFFSET ?)",
        )
        .run(keepRows).changes;
      return Number(old) + Number(over);
    },
    async close() {
      db.close();
    },
  };
  return store;
}
