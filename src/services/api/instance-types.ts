// Which (gpu, instanceType) pairs a deployment may name: those the clusters' compute agents
// registered (PUT /v1/internal/clusters/{clusterId}/instance-types), and, while the plane runs the
// local backend, its one built-in type, so that a plane deploys before (or without) any agent
// registering. A deployment naming a pair no cluster offers would never get an instance: it is
// refused when created or changed (INSTANCE_TYPE_UNAVAILABLE), with what is offered.
import { CallplaneError } from "../../lib/errors.js";
import type { ClusterRecord, DeploymentSpecification, InstanceType, Store } from "./store/types.js";

/** compute.backend and compute.workerIdentity.clusterId, as the API reads them. */
export interface ComputeSettings {
  backend: "local" | "kubernetes";
  clusterId: string;
}

/** The local backend's one instance type: a process on the agent's machine, no GPU. */
export const LOCAL_INSTANCE_TYPE: Readonly<InstanceType> = { name: "local.cpu", gpu: "local", gpuCount: 0 };

export type OfferedCluster = Pick<ClusterRecord, "clusterId" | "backend" | "instanceTypes">;

/** The clusters a deployment may be placed on, by id: the registered ones, plus the built-in local one. */
export async function offeredClusters(store: Store, compute: ComputeSettings): Promise<OfferedCluster[]> {
  const registered: OfferedCluster[] = await store.listClusters();
  if (compute.backend === "local") {
    const own = registered.find((c) => c.clusterId === compute.clusterId);
    const has = (c: OfferedCluster) =>
      c.instanceTypes.some((t) => t.name === LOCAL_INSTANCE_TYPE.name && t.gpu === LOCAL_INSTANCE_TYPE.gpu);
    if (!own)
      registered.push({
        clusterId: compute.clusterId,
        backend: "local",
        instanceTypes: [{ ...LOCAL_INSTANCE_TYPE }],
      });
    else if (!has(own)) own.instanceTypes = [{ ...LOCAL_INSTANCE_TYPE }, ...own.instanceTypes];
  }
  return registered.sort((a, b) => (a.clusterId < b.clusterId ? -1 : a.clusterId > b.clusterId ? 1 : 0));
}

/** How many offered pairs a refusal lists before it says how many more there are. */
const LISTED = 20;
/** Each (gpu, instance type) the clusters offer, keyed by JSON [gpu, name], with the clusters offering it. */
export function offeredByType(
  clusters: OfferedCluster[],
): Map<string, { gpu: string; name: string; clusters: string[] }> {
  const byType = new Map<string, { gpu: string; name: string; clusters: string[] }>();
  for (const c of clusters)
    for (const t of c.instanceTypes) {
      const key = JSON.stringify([t.gpu, t.name]);
      const e = byType.get(key) ?? { gpu: t.gpu, name: t.name, clusters: [] };
      e.clusters.push(c.clusterId);
      byType.set(key, e);
    }
  return byType;
}

const quote = (s: string) => JSON.stringify(s.slice(0, 128));

/** What `clusters` offer, as `gpu "L40S" instance type "l40s.x1" (clusters a, b)`, at most LISTED of them. */
function describeOffered(clusters: OfferedCluster[]): string {
  const all = [...offeredByType(clusters).values()];
  const shown = all
    .slice(0, LISTED)
    .map(
      (e) =>
        `gpu ${quote(e.gpu)} instance type ${quote(e.name)} (cluster${e.clusters.length > 1 ? "s" : ""} ${e.clusters.join(", ")})`,
    );
  const more =
    all.length > LISTED
      ? `, and ${all.length - LISTED} more (GET /v2/nvcf/clusterGroups lists them all)`
      : "";
  return shown.join(", ") + more;
}

/** Why one specification cannot be placed, or undefined when a cluster offers its type. */
function unavailable(
  spec: DeploymentSpecification,
  at: string,
  clusters: OfferedCluster[],
): { field: string; message: string } | undefined {
  const named = spec.clusters && spec.clusters.length > 0 ? spec.clusters : undefined;
  const candidates = named ? clusters.filter((c) => named.includes(c.clusterId)) : clusters;
  const offers = (c: OfferedCluster) =>
    c.instanceTypes.some((t) => t.gpu === spec.gpu && t.name === spec.instanceType);
  if (candidates.some(offers)) return undefined;
  const asked = `gpu ${quote(spec.gpu)} with instance type ${quote(spec.instanceType)}`;
  const gpuKnown = candidates.some((c) => c.instanceTypes.some((t) => t.gpu === spec.gpu));
  const field = `${at}.${gpuKnown ? "instanceType" : "gpu"}`;
  if (clusters.length === 0)
    return {
      field,
      message: `no cluster offers ${asked}; none registered yet: is the compute agent running?`,
    };
  const missing = named ? named.filter((id) => !clusters.some((c) => c.clusterId === id)) : [];
  const where = named ? `no cluster of ${named.map((n) => n.slice(0, 128)).join(", ")}` : "no cluster";
  const unknown = missing.length
    ? ` (not registered: ${missing.map((n) => n.slice(0, 128)).join(", ")})`
    : "";
  const hasTypes = (list: OfferedCluster[]) => list.some((c) => c.instanceTypes.length > 0);
  const others = named ? clusters.filter((c) => !named.includes(c.clusterId)) : [];
  const offered = hasTypes(candidates)
    ? `; offered${named ? " there" : ""}: ${describeOffered(candidates)}`
    : hasTypes(others)
      ? `; offered elsewhere: ${describeOffered(others)}`
      : "; the registered clusters offer no instance types";
  return { field, message: `${where} offers ${asked}${unknown}${offered}` };
}

/** Refuses (INSTANCE_TYPE_UNAVAILABLE) specifications whose (gpu, instanceType) no cluster offers. */
export async function checkInstanceTypes(
  store: Store,
  compute: ComputeSettings,
  specs: DeploymentSpecification[],
): Promise<void> {
  const clusters = await offeredClusters(store, compute);
  const errors = specs
    .map((s, i) => unavailable(s, `deploymentSpecifications.${i}`, clusters))
    .filter((e) => e !== undefined);
  if (errors.length)
    throw new CallplaneError(
      "INSTANCE_TYPE_UNAVAILABLE",
      errors.map((e) => `${e.field}: ${e.message}`).join("; "),
      { extra: { errors } },
    );
}
