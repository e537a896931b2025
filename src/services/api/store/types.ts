// The control plane's storage, behind one interface so that a replicated backend (PostgreSQL) can
// stand in for the embedded SQLite one. Every method that writes more than one row is atomic: it
// either changes everything it says or nothing.
import type { Jwks } from "../../../lib/identity/pod-token.js";
import type { InstanceStatus } from "../../../lib/instance-status.js";

export type { InstanceStatus };

export interface HealthCheck {
  protocol: "HTTP" | "gRPC";
  uri: string;
  port: number;
  timeout: string;
  expectedStatusCode: number;
}

export interface FunctionSpec {
  inferenceUrl: string;
  inferencePort: number;
  health: HealthCheck;
  containerImage: string;
  containerArgs?: string | undefined;
  containerEnvironment: Array<{ key: string; value: string }>;
  tags: string[];
  description?: string | undefined;
  functionType: "DEFAULT" | "STREAMING" | "LLM";
  apiBodyFormat: "CUSTOM" | "PREDICT_V2";
}

export interface FunctionVersionRecord {
  functionId: string;
  versionId: string;
  name: string;
  ncaId: string;
  spec: FunctionSpec;
  createdAt: string;
}

export interface DeploymentSpecification {
  gpuSpecificationId?: string | undefined;
  gpu: string;
  backend?: string | undefined;
  instanceType: string;
  minInstances: number;
  maxInstances: number;
  maxRequestConcurrency: number;
  availabilityZones?: string[] | undefined;
  regions?: string[] | undefined;
  clusters?: string[] | undefined;
  attributes?: string[] | undefined;
  configuration?: unknown;
}

export interface DeploymentRecord {
  deploymentId: string;
  functionId: string;
  versionId: string;
  specs: DeploymentSpecification[];
  createdAt: string;
  updatedAt: string;
}

export interface InstanceRecord {
  instanceId: string;
  deploymentId: string;
  functionId: string;
  versionId: string;
  status: InstanceStatus;
  instanceType: string;
  gpu: string;
  backend: string;
  location: string;
  message?: string | undefined;
  /** Who the instance's worker is, as its compute agent reported it while the instance lives. */
  workerAuth?: WorkerAuth | undefined;
  createdAt: string;
  updatedAt: string;
}

/**
 * A worker's identity as a status report gives it: the local backend's identity id, or (NVCA's
 * WorkerAuth, the Kubernetes backend) the pod's service account and the pod itself, against which a
 * pod's projected token is checked. Never a token.
 */
export type WorkerAuth =
  | { workerIdentifier: string }
  | { sub: string; saUid: string; workerIdentifiers: Array<{ name: string; uid: string }> };

/** What one instance's worker is, for checking a token it presents (workerAuthOf). */
export interface InstanceWorkerAuth {
  instanceId: string;
  /** The compute agent that reported it. */
  reporter: string;
  status: InstanceStatus;
  functionId: string;
  versionId: string;
  deploymentId: string;
  workerAuth: WorkerAuth;
}

/** The keys a cluster signs its service-account tokens with, as registered (PUT .../clusters/{id}/keys). */
export interface ClusterKeysRecord {
  clusterId: string;
  /** The cluster's service-account issuer: a pod token's iss must equal it. */
  issuer: string;
  jwks: Jwks;
  /** Canonical hash of jwks: tells a push that changed nothing from one that did. */
  jwksHash: string;
  /**
   * The service account of the cluster's compute agent: pinned by the first proof that verified; from
   * then on only a token of this subject proves the cluster (key pushes, instance reports).
   */
  agentSubject?: string | undefined;
  /** Who registered them: `admin:<subject>` (an enrollment) or `agent:<subject of its proof>`. */
  updatedBy: string;
  updatedAt: string;
}

/** One instance type a cluster offers: NVCF's (gpu, instanceType) pair, and how many GPUs it has. */
export interface InstanceType {
  name: string;
  gpu: string;
  gpuCount: number;
}

/** A cluster as its compute agent registered it, with the instance types it offers. */
export interface ClusterRecord {
  clusterId: string;
  backend: "local" | "kubernetes";
  instanceTypes: InstanceType[];
  updatedAt: string;
}

/** What a policy of a key reaches: the functions of its account, or those shared with it; `*` or one function id. */
export interface KeyResource {
  id: string;
  type: "account-functions" | "authorized-functions";
}

/** One policy of a key (NVCF's authorizations.policies[]): these scopes, on these functions. */
export interface KeyPolicy {
  scopes: string[];
  resources: KeyResource[];
}

export interface AccountRecord {
  ncaId: string;
  name: string;
  createdAt: string;
}

export interface ApiKeyRecord {
  keyId: string;
  hash: string;
  description: string;
  ownerId: string;
  /** The account the key belongs to. */
  ncaId: string;
  /** Every scope of every policy. */
  scopes: string[];
  policies: KeyPolicy[];
  expiresAt: string;
  createdAt: string;
  revokedAt?: string | undefined;
}

/** The console's actions that the audit log records. */
export const AUDIT_ACTIONS = ["deploy", "scale", "undeploy", "revoke-identity"] as const;
export type AuditAction = (typeof AUDIT_ACTIONS)[number];

/** One action an operator took in the console (the table audit_log). */
export interface AuditRecord {
  id: string;
  at: string;
  /** Who: the admin token's subject (`sub`). */
  subject: string;
  /** The admin token's id (`jti`), when it has one: revoke it by this id. */
  tokenId: string | undefined;
  action: AuditAction;
  /** What it acted on: a deployment (functionId/versionId) or an instance id. */
  target: string;
  /** The action's fields (before and after, for a scale), as JSON. */
  detail: Record<string, unknown>;
}

export interface Store {
  createFunction(v: FunctionVersionRecord): Promise<void>;
  createVersion(v: FunctionVersionRecord): Promise<void>;
  updateVersion(functionId: string, versionId: string, spec: FunctionSpec): Promise<boolean>;
  /** Deletes a version, and its function when it was the last version. Refuses (false) when deployed. */
  deleteVersion(functionId: string, versionId: string): Promise<"deleted" | "not-found" | "deployed">;
  getFunctionByName(name: string): Promise<{ functionId: string } | undefined>;
  functionExists(functionId: string): Promise<boolean>;
  getVersion(functionId: string, versionId: string): Promise<FunctionVersionRecord | undefined>;
  listVersions(functionId?: string): Promise<FunctionVersionRecord[]>;

  createDeployment(d: DeploymentRecord): Promise<"created" | "exists">;
  updateDeployment(
    functionId: string,
    versionId: string,
    specs: DeploymentSpecification[],
    updatedAt: string,
  ): Promise<boolean>;
  deleteDeployment(functionId: string, versionId: string): Promise<boolean>;
  getDeployment(functionId: string, versionId: string): Promise<DeploymentRecord | undefined>;
  getDeploymentById(deploymentId: string): Promise<DeploymentRecord | undefined>;
  listDeployments(): Promise<DeploymentRecord[]>;

  /**
   * Replaces what one reporter (a compute agent) says about the instances of its deployments. An
   * instance another reporter reported is left as it is: no agent rewrites another's instances (or
   * their worker identities): the ids of those are returned, refused. `ended`: the instances this
   * reporter had live (not TERMINATED) before and has not now, read in the same transaction, so
   * every API replica (and one just restarted) tells the same instances ended.
   */
  reportInstances(
    reporter: string,
    instances: InstanceRecord[],
  ): Promise<{ refused: string[]; ended: string[] }>;
  listInstances(versionId?: string): Promise<InstanceRecord[]>;
  /**
   * The worker identity last reported for a live instance; undefined when the instance is not
   * reported, is TERMINATED, or was reported without one.
   */
  workerAuthOf(instanceId: string): Promise<InstanceWorkerAuth | undefined>;
  /**
   * The live instance whose pod service account is `sub` (what a pod token names), if any; of several
   * (two agents reporting the same subject), `reporter`'s.
   */
  workerAuthBySubject(sub: string, reporter: string): Promise<InstanceWorkerAuth | undefined>;

  /** Registers a cluster's instance types, replacing what it registered before. */
  registerCluster(c: ClusterRecord): Promise<void>;
  /** Every registered cluster, by id. */
  listClusters(): Promise<ClusterRecord[]>;
  /** A cluster's registered service-account keys; undefined until it is enrolled. */
  clusterKeys(clusterId: string): Promise<ClusterKeysRecord | undefined>;
  /** Registers (replaces) a cluster's keys. */
  setClusterKeys(r: ClusterKeysRecord): Promise<void>;

  createApiKey(k: ApiKeyRecord): Promise<void>;
  getApiKeyByHash(hash: string): Promise<ApiKeyRecord | undefined>;
  getApiKey(keyId: string): Promise<ApiKeyRecord | undefined>;
  listApiKeys(): Promise<ApiKeyRecord[]>;
  revokeApiKey(keyId: string, at: string): Promise<boolean>;

  /** Creates an account; "name-taken" when another has the name. */
  createAccount(a: AccountRecord): Promise<"created" | "name-taken">;
  /** The default account: created when missing; keys made before accounts are given to it. */
  adoptIntoAccount(a: AccountRecord): Promise<void>;
  getAccount(ncaId: string): Promise<AccountRecord | undefined>;
  listAccounts(): Promise<AccountRecord[]>;

  /** Shares a function with an account (NVCF's function authorizations); false when it already was. */
  authorize(functionId: string, ncaId: string, at: string): Promise<boolean>;
  /** Stops sharing; false when it was not shared. */
  unauthorize(functionId: string, ncaId: string): Promise<boolean>;
  /** The accounts a function is shared with. */
  listAuthorizedAccounts(functionId: string): Promise<string[]>;
  /** The functions shared with an account. */
  listAuthorizedFunctions(ncaId: string): Promise<string[]>;

  /** Revokes an admin token by its id (its `jti`); false when it already was. */
  revokeAdminToken(tokenId: string, at: string): Promise<boolean>;
  adminTokenRevokedAt(tokenId: string): Promise<string | undefined>;

  /** Records one console action. */
  appendAudit(e: AuditRecord): Promise<void>;
  /** The audit log, newest first: `limit` entries after skipping `offset`. */
  listAudit(opts: { limit: number; offset: number }): Promise<AuditRecord[]>;
  /**
   * Bounds the audit log: removes the rows older than `before` (an ISO time), then all but the
   * newest `keepRows`. Returns how many went.
   */
  pruneAudit(opts: { keepRows: number; before: string }): Promise<number>;

  close(): Promise<void>;
}

/** createFunction: another function already has this name (a unique key of the store). */
export class NameTakenError extends Error {
  constructor(readonly functionName: string) {
    super(`a function named "${functionName}" exists`);
    this.name = "NameTakenError";
  }
}
