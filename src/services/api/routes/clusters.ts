// Clusters and the instance types they offer: a compute agent registers its cluster's list
// (internal, its service token), and clients read them as NVCF's cluster groups (contract §5.3),
// one group per cluster, to learn which (gpu, instanceType) a deployment may name.
import { CallplaneError } from "../../../lib/errors.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { offeredClusters, type OfferedCluster } from "../instance-types.js";
import { CLUSTER_ID, instanceTypesSchema, parseBody } from "../schemas.js";
import type { InstanceType } from "../store/types.js";
import { readJsonBody, type ApiDeps } from "./deps.js";

export function addClusterRoutes(router: Router, deps: ApiDeps): void {
  router.add("GET", "/v2/nvcf/clusterGroups", (ctx) => listClusterGroups(deps, ctx));
  // ---- internal: the compute agent
  router.add("PUT", "/v1/internal/clusters/:clusterId/instance-types", (ctx) =>
    registerInstanceTypes(deps, ctx),
  );
}

async function registerInstanceTypes(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  // the compute agent's scope: an admin token never holds an internal one (routes/auth.ts)
  await deps.auth.authorize(req, "internal:instances");
  const clusterId = params.clusterId;
  if (!CLUSTER_ID.test(clusterId)) {
    const message =
      "must be 1 to 128 letters, digits, dots, dashes and underscores, beginning with a letter or digit (compute.workerIdentity.clusterId)";
    throw new CallplaneError("VALIDATION_FAILED", `clusterId: ${message}`, {
      extra: { errors: [{ field: "clusterId", message }] },
    });
  }
  const body = parseBody(instanceTypesSchema, await readJsonBody(deps, req));
  await deps.store.registerCluster({
    clusterId,
    backend: body.backend,
    instanceTypes: body.instanceTypes,
    updatedAt: new Date().toISOString(),
  });
  deps.logger.info(
    { clusterId, backend: body.backend, instanceTypes: body.instanceTypes.map((t) => t.name) },
    "cluster instance types registered",
  );
  res.writeHead(204).end();
}

/** NVCF's InstanceType says what it is in words; callplane adds the GPU count it knows. */
function instanceTypeDto(t: InstanceType, isDefault: boolean) {
  return {
    name: t.name,
    description: t.gpuCount === 0 ? "no GPU" : `${t.gpuCount}x ${t.gpu}`,
    default: isDefault,
    gpuCount: t.gpuCount,
  };
}

/** One cluster as an NVCF cluster group: its GPUs, each with its instance types (the first the default). */
function clusterGroupDto(deps: ApiDeps, c: OfferedCluster) {
  const byGpu = new Map<string, InstanceType[]>();
  for (const t of c.instanceTypes) byGpu.set(t.gpu, [...(byGpu.get(t.gpu) ?? []), t]);
  return {
    id: c.clusterId,
    name: c.clusterId,
    // clusters belong to the plane, whose own account is the default one
    ncaId: deps.ncaId,
    backend: c.backend,
    gpus: [...byGpu].map(([gpu, types]) => ({
      name: gpu,
      instanceTypes: types.map((t, i) => instanceTypeDto(t, i === 0)),
    })),
    clusters: [{ id: c.clusterId, name: c.clusterId }],
  };
}

async function listClusterGroups(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  // caller(), not authorize(): a key of one account naming another is refused here as elsewhere
  await deps.auth.caller(req, "list_cluster_groups");
  const clusters = await offeredClusters(deps.store, deps.compute);
  sendJson(res, 200, { clusterGroups: clusters.map((c) => clusterGroupDto(deps, c)) });
}
