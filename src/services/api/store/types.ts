// The control plane's storage, behind one interface so that a replicated backend (PostgreSQL) can
// stand in for the embedded SQLite one. Every method that writes more than one row is atomic: it
// either changes everything it says or nothing.
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
  createdAt: string;
  updatedAt: string;
}

export interface ApiKeyRecord {
  keyId: string;
  hash: string;
  description: string;
  ownerId: string;
  scopes: string[];
  expiresAt: string;
  createdAt: string;
  revokedAt?: string | undefined;
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

  /** Replaces what one reporter (a compute agent) says about the instances of its deployments. */
  reportInstances(reporter: string, instances: InstanceRecord[]): Promise<void>;
  listInstances(versionId?: string): Promise<InstanceRecord[]>;

  createApiKey(k: ApiKeyRecord): Promise<void>;
  getApiKeyByHash(hash: string): Promise<ApiKeyRecord | undefined>;
  getApiKey(keyId: string): Promise<ApiKeyRecord | undefined>;
  listApiKeys(): Promise<ApiKeyRecord[]>;
  revokeApiKey(keyId: string, at: string): Promise<boolean>;

  close(): Promise<void>;
}

/** createFunction: another function already has this name (a unique key of the store). */
export class NameTakenError extends Error {
  constructor(readonly functionName: string) {
    super(`a function named "${functionName}" exists`);
    this.name = "NameTakenError";
  }
}
