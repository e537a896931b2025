// Rows as both stores read them, and the records they become: the SQL schema is the same on
// SQLite and PostgreSQL (MIGRATIONS in ../db/migrations.ts), so the mapping is too.
import type {
  AccountRecord,
  AuditRecord,
  ApiKeyRecord,
  ClusterKeysRecord,
  ClusterRecord,
  InstanceType,
  InstanceWorkerAuth,
  WorkerAuth,
  KeyPolicy,
  KeyResource,
  DeploymentRecord,
  DeploymentSpecification,
  FunctionSpec,
  FunctionVersionRecord,
  InstanceRecord,
} from "./types.js";

export interface VersionRow {
  version_id: string;
  function_id: string;
  name: string;
  nca_id: string;
  spec: string;
  created_at: string;
}
export interface DeploymentRow {
  deployment_id: string;
  function_id: string;
  version_id: string;
  specs: string;
  created_at: string;
  updated_at: string;
}
export interface InstanceRow {
  instance_id: string;
  deployment_id: string;
  function_id: string;
  version_id: string;
  status: InstanceRecord["status"];
  instance_type: string;
  gpu: string;
  backend: string;
  location: string;
  message: string | null;
  worker_auth: string | null;
  created_at: string;
  updated_at: string;
}
export interface InstanceWorkerAuthRow {
  instance_id: string;
  reporter: string;
  status: InstanceRecord["status"];
  function_id: string;
  version_id: string;
  deployment_id: string;
  worker_auth: string;
}
export interface ClusterRow {
  cluster_id: string;
  backend: ClusterRecord["backend"];
  instance_types: string;
  updated_at: string;
}
export interface ClusterKeysRow {
  cluster_id: string;
  issuer: string;
  jwks: string;
  jwks_hash: string;
  agent_subject: string | null;
  updated_by: string;
  updated_at: string;
}
export interface KeyRow {
  key_id: string;
  hash: string;
  description: string;
  owner_id: string;
  scopes: string;
  nca_id: string;
  policies: string | null;
  expires_at: string;
  created_at: string;
  revoked_at: string | null;
}
export interface AccountRow {
  nca_id: string;
  name: string;
  created_at: string;
}

export const versionFromRow = (r: VersionRow): FunctionVersionRecord => ({
  functionId: r.function_id,
  versionId: r.version_id,
  name: r.name,
  ncaId: r.nca_id,
  spec: JSON.parse(r.spec) as FunctionSpec,
  createdAt: r.created_at,
});
export const deploymentFromRow = (r: DeploymentRow): DeploymentRecord => ({
  deploymentId: r.deployment_id,
  functionId: r.function_id,
  versionId: r.version_id,
  specs: JSON.parse(r.specs) as DeploymentSpecification[],
  createdAt: r.created_at,
  updatedAt: r.updated_at,
});
export const instanceFromRow = (r: InstanceRow): InstanceRecord => ({
  instanceId: r.instance_id,
  deploymentId: r.deployment_id,
  functionId: r.function_id,
  versionId: r.version_id,
  status: r.status,
  instanceType: r.instance_type,
  gpu: r.gpu,
  backend: r.backend,
  location: r.location,
  message: r.message ?? undefined,
  workerAuth: r.worker_auth ? (JSON.parse(r.worker_auth) as WorkerAuth) : undefined,
  createdAt: r.created_at,
  updatedAt: r.updated_at,
});
export const instanceWorkerAuthFromRow = (r: InstanceWorkerAuthRow): InstanceWorkerAuth => ({
  instanceId: r.instance_id,
  reporter: r.reporter,
  status: r.status,
  functionId: r.function_id,
  versionId: r.version_id,
  deploymentId: r.deployment_id,
  workerAuth: JSON.parse(r.worker_auth) as WorkerAuth,
});
export const clusterFromRow = (r: ClusterRow): ClusterRecord => ({
  clusterId: r.cluster_id,
  backend: r.backend,
  instanceTypes: JSON.parse(r.instance_types) as InstanceType[],
  updatedAt: r.updated_at,
});
export const clusterKeysFromRow = (r: ClusterKeysRow): ClusterKeysRecord => ({
  clusterId: r.cluster_id,
  issuer: r.issuer,
  jwks: JSON.parse(r.jwks) as ClusterKeysRecord["jwks"],
  jwksHash: r.jwks_hash,
  agentSubject: r.agent_subject ?? undefined,
  updatedBy: r.updated_by,
  updatedAt: r.updated_at,
});
/** The one query workerAuthOf makes: a live instance that has a worker identity. */
export const WORKER_AUTH_SELECT = `SELECT instance_id, reporter, status, function_id, version_id, deployment_id, worker_auth
  FROM instances WHERE instance_id = ? AND status <> 'TERMINATED' AND worker_auth IS NOT NULL`;
/** A reporter's live instances, read before its report replaces them (what ended is the difference). */
export const LIVE_OF_REPORTER_SELECT =
  "SELECT instance_id FROM instances WHERE reporter = ? AND status <> 'TERMINATED'";
/** The instances that were live and are not live in the new report. */
export const endedInstances = (before: Array<{ instance_id: string }>, after: InstanceRecord[]): string[] => {
  const live = new Set(after.filter((i) => i.status !== "TERMINATED").map((i) => i.instanceId));
  return before.map((r) => r.instance_id).filter((id) => !live.has(id));
};
/**
 * The one query workerAuthBySubject makes: the live instance whose pod service account is the
 * subject, the given reporter's first (another agent may report the same subject: it must not hide
 * this one's). Parameters: sub, reporter.
 */
export const WORKER_BY_SUBJECT_SELECT = `SELECT instance_id, reporter, status, function_id, version_id, deployment_id, worker_auth
  FROM instances WHERE worker_sub = ? AND status <> 'TERMINATED' AND worker_auth IS NOT NULL
  ORDER BY CASE WHEN reporter = ? THEN 0 ELSE 1 END, instance_id LIMIT 1`;
/** The pod service account of an instance's worker identity (worker_sub), or NULL. */
export const workerSubColumn = (i: InstanceRecord): string | null =>
  i.workerAuth && "sub" in i.workerAuth ? i.workerAuth.sub : null;
/** The instance's worker identity as stored: JSON text, or NULL when none was reported. */
export const workerAuthColumn = (i: InstanceRecord): string | null =>
  i.workerAuth ? JSON.stringify(i.workerAuth) : null;
/** What keys made before policies were stored reach: every function of their account and shared with it. */
export const ALL_FUNCTIONS: KeyResource[] = [
  { id: "*", type: "account-functions" },
  { id: "*", type: "authorized-functions" },
];

export const keyFromRow = (r: KeyRow): ApiKeyRecord => {
  const scopes = JSON.parse(r.scopes) as string[];
  return {
    keyId: r.key_id,
    hash: r.hash,
    description: r.description,
    ownerId: r.owner_id,
    ncaId: r.nca_id,
    scopes,
    policies: r.policies ? (JSON.parse(r.policies) as KeyPolicy[]) : [{ scopes, resources: ALL_FUNCTIONS }],
    expiresAt: r.expires_at,
    createdAt: r.created_at,
    revokedAt: r.revoked_at ?? undefined,
  };
};
export const accountFromRow = (r: AccountRow): AccountRecord => ({
  ncaId: r.nca_id,
  name: r.name,
  createdAt: r.created_at,
});

export interface AuditRow {
  id: string;
  at: string;
  subject: string;
  token_id: string | null;
  action: string;
  target: string;
  detail: string;
}
export const auditFromRow = (r: AuditRow): AuditRecord => ({
  id: r.id,
  at: r.at,
  subject: r.subject,
  tokenId: r.token_id ?? undefined,
  action: r.action as AuditRecord["action"],
  target: r.target,
  detail: JSON.parse(r.detail) as Record<string, unknown>,
});
export const AUDIT_INSERT =
  "INSERT INTO audit_log (id, at, subject, token_id, action, target, detail) VALUES (?, ?, ?, ?, ?, ?, ?)";
export const auditParams = (e: AuditRecord): unknown[] => [
  e.id,
  e.at,
  e.subject,
  e.tokenId ?? null,
  e.action,
  e.target,
  JSON.stringify(e.detail),
];

export const VERSION_SELECT = `SELECT v.version_id, v.function_id, f.name, f.nca_id, v.spec, v.created_at
  FROM function_versions v JOIN functions f ON f.function_id = v.function_id`;
