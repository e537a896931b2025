// The control plane's store on PostgreSQL, for API replicas that share one database. Same schema
// and migrations as the SQLite store (the data layer's one list: ../db/migrations.ts); every multi-row
// write is one transaction, and writes that several replicas may race on are single statements
// that the database decides (INSERT ... ON CONFLICT), never a read followed by a write.
import pg from "pg";
import { migratePostgres } from "../db/migrate.js";
import { inTransaction, numbered, type Query } from "../db/postgres.js";
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
import { postgresAuditLog } from "./postgres-audit.js";
import { NameTakenError, type Store } from "./types.js";

const UNIQUE_VIOLATION = "23505";

export interface PostgresStoreOptions {
  /** postgres://user:password@host:port/database */
  url: string;
  /** Connections this replica keeps at most. */
  maxConnections?: number;
}

export async function openPostgresStore(opts: PostgresStoreOptions): Promise<Store & { pool: pg.Pool }> {
  const pool = new pg.Pool({
    connectionString: opts.url,
    max: opts.maxConnections ?? 10,
    // a database that does not answer fails the request instead of holding it
    connectionTimeoutMillis: 5000,
    idleTimeoutMillis: 30_000,
  });
  // an idle client that loses its connection emits on the pool; without a listener it would crash
  pool.on("error", () => undefined);
  try {
    await migratePostgres(pool);
  } catch (err) {
    await pool.end().catch(() => undefined);
    const u = new URL(opts.url);
    throw new Error(
      `cannot open the PostgreSQL database ${u.pathname.slice(1) || "(default)"} at ${u.host} (api.database.url): ${(err as Error).message}; check that the server is up and the URL, user and password are right`,
      { cause: err },
    );
  }
  const q: Query = (sql, params = []) => pool.query(numbered(sql), params);
  /** Runs `fn` in one transaction on one connection; any error rolls it back. */
  function tx<T>(fn: (q: Query) => Promise<T>): Promise<T> {
    return inTransaction(pool, (c) => fn((sql, params = []) => c.query(numbered(sql), params)));
  }
  const rows = async <R>(sql: string, params: unknown[] = []) => (await q(sql, params)).rows as R[];
  const one = async <R>(sql: string, params: unknown[] = []) => (await rows<R>(sql, params))[0];
  const insertVersion =
    "INSERT INTO function_versions (version_id, function_id, spec, created_at) VALUES (?, ?, ?, ?)";

  return {
    pool,
    async createFunction(v) {
      try {
        await tx(async (t) => {
          await t("INSERT INTO functions (function_id, name, nca_id, created_at) VALUES (?, ?, ?, ?)", [
            v.functionId,
            v.name,
            v.ncaId,
            v.createdAt,
          ]);
          await t(insertVersion, [v.versionId, v.functionId, JSON.stringify(v.spec), v.createdAt]);
        });
      } catch (err) {
        const e = err as { code?: string; constraint?: string };
        if (e.code === UNIQUE_VIOLATION && e.constraint === "functions_name_key")
          throw new NameTakenError(v.name);
        throw err;
      }
    },
    async createVersion(v) {
      await q(insertVersion, [v.versionId, v.functionId, JSON.stringify(v.spec), v.createdAt]);
    },
    async updateVersion(functionId, versionId, spec) {
      const r = await q("UPDATE function_versions SET spec = ? WHERE function_id = ? AND version_id = ?", [
        JSON.stringify(spec),
        functionId,
        versionId,
      ]);
      return r.rowCount === 1;
    },
    async deleteVersion(functionId, versionId) {
      return tx(async (t): Promise<"deleted" | "not-found" | "deployed"> => {
        // the function's row is locked first, so two replicas deleting its last two versions at
        // once cannot both leave it without versions and both keep it
        await t("SELECT 1 FROM functions WHERE function_id = ? FOR UPDATE", [functionId]);
        const exists = await t(
          "SELECT 1 FROM function_versions WHERE function_id = ? AND version_id = ? FOR UPDATE",
          [functionId, versionId],
        );
        if (exists.rowCount === 0) return "not-found";
        if ((await t("SELECT 1 FROM deployments WHERE version_id = ?", [versionId])).rowCount)
          return "deployed";
        await t("DELETE FROM instances WHERE version_id = ?", [versionId]);
        await t("DELETE FROM function_versions WHERE version_id = ?", [versionId]);
        const left = await t("SELECT COUNT(*)::int AS n FROM function_versions WHERE function_id = ?", [
          functionId,
        ]);
        if ((left.rows[0] as { n: number }).n === 0)
          await t("DELETE FROM functions WHERE function_id = ?", [functionId]);
        await t("DELETE FROM function_authorizations WHERE function_id = ?", [functionId]);
        return "deleted";
      });
    },
    async getFunctionByName(name) {
      const r = await one<{ function_id: string }>("SELECT function_id FROM functions WHERE name = ?", [
        name,
      ]);
      return r && { functionId: r.function_id };
    },
    async functionExists(functionId) {
      return (await q("SELECT 1 FROM functions WHERE function_id = ?", [functionId])).rowCount === 1;
    },
    async getVersion(functionId, versionId) {
      const r = await one<VersionRow>(`${VERSION_SELECT} WHERE v.function_id = ? AND v.version_id = ?`, [
        functionId,
        versionId,
      ]);
      return r && versionFromRow(r);
    },
    async listVersions(functionId) {
      const list =
        functionId === undefined
          ? await rows<VersionRow>(`${VERSION_SELECT} ORDER BY f.name, v.created_at`)
          : await rows<VersionRow>(`${VERSION_SELECT} WHERE v.function_id = ? ORDER BY v.created_at`, [
              functionId,
            ]);
      return list.map(versionFromRow);
    },
    async createDeployment(d) {
      const r = await q(
        "INSERT INTO deployments (deployment_id, function_id, version_id, specs, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (version_id) DO NOTHING",
        [d.deploymentId, d.functionId, d.versionId, JSON.stringify(d.specs), d.createdAt, d.updatedAt],
      );
      return r.rowCount === 1 ? "created" : "exists";
    },
    async updateDeployment(functionId, versionId, specs, updatedAt) {
      const r = await q(
        "UPDATE deployments SET specs = ?, updated_at = ? WHERE function_id = ? AND version_id = ?",
        [JSON.stringify(specs), updatedAt, functionId, versionId],
      );
      return r.rowCount === 1;
    },
    async deleteDeployment(functionId, versionId) {
      return tx(async (t) => {
        const r = await t("DELETE FROM deployments WHERE function_id = ? AND version_id = ?", [
          functionId,
          versionId,
        ]);
        // instances of an undeployed version would otherwise count towards its next deployment
        if (r.rowCount === 1) await t("DELETE FROM instances WHERE version_id = ?", [versionId]);
        return r.rowCount === 1;
      });
    },
    async getDeployment(functionId, versionId) {
      const r = await one<DeploymentRow>(
        "SELECT * FROM deployments WHERE function_id = ? AND version_id = ?",
        [functionId, versionId],
      );
      return r && deploymentFromRow(r);
    },
    async getDeploymentById(deploymentId) {
      const r = await one<DeploymentRow>("SELECT * FROM deployments WHERE deployment_id = ?", [deploymentId]);
      return r && deploymentFromRow(r);
    },
    async listDeployments() {
      return (await rows<DeploymentRow>("SELECT * FROM deployments ORDER BY created_at")).map(
        deploymentFromRow,
      );
    },
    async reportInstances(reporter, instances) {
      const refused: string[] = [];
      let ended: string[] = [];
      await tx(async (t) => {
        // FOR UPDATE: two reports of one reporter at once see each other's result, not the same "before"
        const before = await t(`${LIVE_OF_REPORTER_SELECT} FOR UPDATE`, [reporter]);
        ended = endedInstances(before.rows as Array<{ instance_id: string }>, instances);
        await t("DELETE FROM instances WHERE reporter = ?", [reporter]);
        for (const i of instances) {
          const r = await t(
            `INSERT INTO instances (instance_id, reporter, deployment_id, function_id, version_id, status, instance_type, gpu, backend, location, message, worker_auth, worker_sub, created_at, updated_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (instance_id) DO UPDATE SET status = excluded.status, message = excluded.message, worker_auth = excluded.worker_auth, worker_sub = excluded.worker_sub, updated_at = excluded.updated_at
             WHERE instances.reporter = excluded.reporter`,
            [
              i.instanceId,
              reporter,
              i.deploymentId,
              i.functionId,
              i.versionId,
              i.status,
              i.instanceType,
              i.gpu,
              i.backend,
              i.location,
              i.message ?? null,
              workerAuthColumn(i),
              workerSubColumn(i),
              i.createdAt,
              i.updatedAt,
            ],
          );
          if (r.rowCount === 0) refused.push(i.instanceId);
        }
      });
      return { refused, ended };
    },
    async listInstances(versionId) {
      const list =
        versionId === undefined
          ? await rows<InstanceRow>("SELECT * FROM instances ORDER BY created_at")
          : await rows<InstanceRow>("SELECT * FROM instances WHERE version_id = ? ORDER BY created_at", [
              versionId,
            ]);
      return list.map(instanceFromRow);
    },
    async workerAuthOf(instanceId) {
      const r = await one<InstanceWorkerAuthRow>(WORKER_AUTH_SELECT, [instanceId]);
      return r && instanceWorkerAuthFromRow(r);
    },
    async workerAuthBySubject(sub, reporter) {
      const r = await one<InstanceWorkerAuthRow>(WORKER_BY_SUBJECT_SELECT, [sub, reporter]);
      return r && instanceWorkerAuthFromRow(r);
    },
    async clusterKeys(clusterId) {
      const r = await one<ClusterKeysRow>("SELECT * FROM cluster_keys WHERE cluster_id = ?", [clusterId]);
      return r && clusterKeysFromRow(r);
    },
    async setClusterKeys(k) {
      await q(
        `INSERT INTO cluster_keys (cluster_id, issuer, jwks, jwks_hash, agent_subject, updated_by, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (cluster_id) DO UPDATE SET issuer = excluded.issuer, jwks = excluded.jwks, jwks_hash = excluded.jwks_hash, agent_subject = excluded.agent_subject, updated_by = excluded.updated_by, updated_at = excluded.updated_at`,
        [
          k.clusterId,
          k.issuer,
          JSON.stringify(k.jwks),
          k.jwksHash,
          k.agentSubject ?? null,
          k.updatedBy,
          k.updatedAt,
        ],
      );
    },
    async registerCluster(c) {
      await q(
        `INSERT INTO clusters (cluster_id, backend, instance_types, updated_at) VALUES (?, ?, ?, ?)
         ON CONFLICT (cluster_id) DO UPDATE SET backend = excluded.backend, instance_types = excluded.instance_types, updated_at = excluded.updated_at`,
        [c.clusterId, c.backend, JSON.stringify(c.instanceTypes), c.updatedAt],
      );
    },
    async listClusters() {
      return (await rows<ClusterRow>("SELECT * FROM clusters ORDER BY cluster_id")).map(clusterFromRow);
    },
    async createApiKey(k) {
      await q(
        "INSERT INTO api_keys (key_id, hash, description, owner_id, nca_id, scopes, policies, expires_at, created_at, revoked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
        [
          k.keyId,
          k.hash,
          k.description,
          k.ownerId,
          k.ncaId,
          JSON.stringify(k.scopes),
          JSON.stringify(k.policies),
          k.expiresAt,
          k.createdAt,
        ],
      );
    },
    async getApiKeyByHash(hash) {
      const r = await one<KeyRow>("SELECT * FROM api_keys WHERE hash = ?", [hash]);
      return r && keyFromRow(r);
    },
    async getApiKey(keyId) {
      const r = await one<KeyRow>("SELECT * FROM api_keys WHERE key_id = ?", [keyId]);
      return r && keyFromRow(r);
    },
    async listApiKeys() {
      return (await rows<KeyRow>("SELECT * FROM api_keys ORDER BY created_at")).map(keyFromRow);
    },
    async revokeApiKey(keyId, at) {
      const r = await q("UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL", [
        at,
        keyId,
      ]);
      return r.rowCount === 1;
    },
    async createAccount(a) {
      const r = await q(
        "INSERT INTO accounts (nca_id, name, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        [a.ncaId, a.name, a.createdAt],
      );
      return r.rowCount === 1 ? "created" : "name-taken";
    },
    async adoptIntoAccount(a) {
      await tx(async (t) => {
        await t("INSERT INTO accounts (nca_id, name, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING", [
          a.ncaId,
          a.name,
          a.createdAt,
        ]);
        await t("UPDATE api_keys SET nca_id = ? WHERE nca_id = ''", [a.ncaId]);
      });
    },
    async getAccount(ncaId) {
      const r = await one<AccountRow>("SELECT * FROM accounts WHERE nca_id = ?", [ncaId]);
      return r && accountFromRow(r);
    },
    async listAccounts() {
      return (await rows<AccountRow>("SELECT * FROM accounts ORDER BY created_at")).map(accountFromRow);
    },
    async authorize(functionId, ncaId, at) {
      const r = await q(
        "INSERT INTO function_authorizations (function_id, nca_id, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
        [functionId, ncaId, at],
      );
      return r.rowCount === 1;
    },
    async unauthorize(functionId, ncaId) {
      const r = await q("DELETE FROM function_authorizations WHERE function_id = ? AND nca_id = ?", [
        functionId,
        ncaId,
      ]);
      return r.rowCount === 1;
    },
    async listAuthorizedAccounts(functionId) {
      return (
        await rows<{ nca_id: string }>(
          "SELECT nca_id FROM function_authorizations WHERE function_id = ? ORDER BY created_at",
          [functionId],
        )
      ).map((r) => r.nca_id);
    },
    async listAuthorizedFunctions(ncaId) {
      return (
        await rows<{ function_id: string }>(
          "SELECT function_id FROM function_authorizations WHERE nca_id = ? ORDER BY created_at",
          [ncaId],
        )
      ).map((r) => r.function_id);
    },
    async revokeAdminToken(tokenId, at) {
      const r = await q(
        "INSERT INTO revoked_admin_tokens (token_id, revoked_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
        [tokenId, at],
      );
      return r.rowCount === 1;
    },
    async adminTokenRevokedAt(tokenId) {
      const r = await one<{ revoked_at: string }>(
        "SELECT revoked_at FROM revoked_admin_tokens WHERE token_id = ?",
        [tokenId],
      );
      return r?.revoked_at;
    },
    ...postgresAuditLog(q),
    async close() {
      await pool.end();
    },
  };
}
