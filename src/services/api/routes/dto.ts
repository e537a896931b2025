// The shapes the API answers with (NVCF's FunctionDto, DeploymentDto, API key and instance
// objects), built from the store's records; a function's status is derived from its deployment
// and instances here, never stored.
import type {
  ApiKeyRecord,
  DeploymentRecord,
  FunctionVersionRecord,
  InstanceRecord,
  WorkerAuth,
} from "../store/types.js";
import type { ApiDeps } from "./deps.js";

export function functionStatus(
  deployment: DeploymentRecord | undefined,
  instances: InstanceRecord[],
): string {
  if (!deployment) return "INACTIVE";
  const live = instances.filter((i) => i.status !== "TERMINATED");
  if (live.some((i) => i.status === "ACTIVE")) return "ACTIVE";
  if (live.length > 0 && live.every((i) => i.status === "ERRORED")) return "ERROR";
  return "DEPLOYING";
}

/** Who an instance's worker is, as the API shows it: ids and names, never a token. */
function workerAuthDto(w: WorkerAuth) {
  if ("workerIdentifier" in w) return { workerIdentifier: w.workerIdentifier };
  return {
    sub: w.sub,
    serviceAccountUid: w.saUid,
    pods: w.workerIdentifiers.map((p) => ({ name: p.name, uid: p.uid })),
  };
}

export function instanceDto(i: InstanceRecord) {
  return {
    instanceId: i.instanceId,
    functionId: i.functionId,
    functionVersionId: i.versionId,
    instanceType: i.instanceType,
    instanceStatus: i.status,
    gpu: i.gpu,
    backend: i.backend,
    location: i.location,
    ...(i.message ? { message: i.message } : {}),
    ...(i.workerAuth ? { workerAuth: workerAuthDto(i.workerAuth) } : {}),
    instanceCreatedAt: i.createdAt,
    instanceUpdatedAt: i.updatedAt,
  };
}

export function functionDto(
  v: FunctionVersionRecord,
  deployment: DeploymentRecord | undefined,
  instances: InstanceRecord[],
  secretNames: string[] = [],
  viewer?: string,
) {
  const s = v.spec;
  const shared = viewer !== undefined && viewer !== v.ncaId;
  const dto = {
    id: v.functionId,
    versionId: v.versionId,
    ncaId: v.ncaId,
    ...(shared ? { ownedByDifferentAccount: true } : {}),
    name: v.name,
    status: functionStatus(deployment, instances),
    inferenceUrl: s.inferenceUrl,
    inferencePort: s.inferencePort,
    health: s.health,
    healthUri: s.health.uri,
    containerImage: s.containerImage,
    ...(s.containerArgs !== undefined ? { containerArgs: s.containerArgs } : {}),
    containerEnvironment: s.containerEnvironment,
    apiBodyFormat: s.apiBodyFormat,
    functionType: s.functionType,
    tags: s.tags,
    ...(s.description !== undefined ? { description: s.description } : {}),
    createdAt: v.createdAt,
    activeInstances: instances.filter((i) => i.status !== "TERMINATED").map(instanceDto),
    // names only, as NVCF's FunctionDto: values never leave the secret store here
    secrets: secretNames,
  };
  if (!shared) return dto;
  // an account the function is shared with invokes it; how the owner runs it (arguments,
  // environment values, instances, secret names) stays the owner's
  const {
    containerArgs: _args,
    containerEnvironment: _env,
    activeInstances: _instances,
    secrets: _secrets,
    ...seen
  } = dto;
  return seen;
}

/** The names of the secrets each version holds (none without a secret store). */
async function secretNames(deps: ApiDeps, versionIds?: string[]): Promise<Map<string, string[]>> {
  return deps.secrets ? await deps.secrets.names(versionIds) : new Map<string, string[]>();
}

/** Many versions' DTOs, with one read of the deployments, instances and secret names for all. */
export async function versionDtos(deps: ApiDeps, versions: FunctionVersionRecord[], viewer?: string) {
  const ids = versions.map((v) => v.versionId);
  const [deployments, instances, names] = await Promise.all([
    deps.store.listDeployments(),
    deps.store.listInstances(),
    secretNames(deps, ids),
  ]);
  const byVersion = new Map(deployments.map((d) => [d.versionId, d]));
  return versions.map((v) =>
    functionDto(
      v,
      byVersion.get(v.versionId),
      instances.filter((i) => i.versionId === v.versionId),
      names.get(v.versionId),
      viewer,
    ),
  );
}

/** One version's DTO. */
export async function versionDto(deps: ApiDeps, v: FunctionVersionRecord, viewer?: string) {
  const [d, instances, names] = await Promise.all([
    deps.store.getDeployment(v.functionId, v.versionId),
    deps.store.listInstances(v.versionId),
    secretNames(deps, [v.versionId]),
  ]);
  return functionDto(v, d, instances, names.get(v.versionId), viewer);
}

export async function deploymentDto(deps: ApiDeps, d: DeploymentRecord) {
  const [v, instances] = await Promise.all([
    deps.store.getVersion(d.functionId, d.versionId),
    deps.store.listInstances(d.versionId),
  ]);
  return {
    deploymentId: d.deploymentId,
    functionId: d.functionId,
    functionVersionId: d.versionId,
    functionName: v?.name ?? "",
    ncaId: v?.ncaId ?? deps.ncaId,
    functionStatus: functionStatus(d, instances),
    healthInfo: instances
      .filter((i) => i.status === "ERRORED")
      .map((i) => ({
        gpu: i.gpu,
        backend: i.backend,
        instanceType: i.instanceType,
        error: i.message ?? "instance errored",
      })),
    deploymentSpecifications: d.specs,
    instances: instances.map(instanceDto),
    createdAt: d.createdAt,
    lastUpdatedAt: d.updatedAt,
  };
}

export function keyDto(k: ApiKeyRecord, now = Date.now()) {
  const status = k.revokedAt ? "REVOKED" : Date.parse(k.expiresAt) <= now ? "EXPIRED" : "ACTIVE";
  return {
    id: k.keyId,
    status,
    owner_type: "USER",
    owner_id: k.ownerId,
    issuer_service_id: "callplane-api",
    audience_service_ids: ["callplane-api"],
    description: k.description,
    created_at: k.createdAt,
    expires_at: k.expiresAt,
    ...(k.revokedAt ? { revoked_at: k.revokedAt } : {}),
    ncaId: k.ncaId,
    authorizations: {
      policies: k.policies.map((p) => ({
        product: "nv-cloud-functions",
        resources: p.resources,
        scopes: p.scopes,
      })),
    },
  };
}
