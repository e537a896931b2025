// Clusters: the instance types they offer (a compute agent registers its cluster's list, internal,
// its service token), read by clients as NVCF's cluster groups (contract §5.3), one group per
// cluster, to learn which (gpu, instanceType) a deployment may name; and the keys each cluster signs
// its pods' tokens with (PUT .../keys), against which workers' pod tokens are verified.
//
// Who may set a cluster's keys: whoever holds them can mint a token for any worker of that cluster.
// The first keys of a cluster come from an admin (scope cluster-management): NVCA's registration is
// an operator's act too, and the compute service token is shared by every cluster's agent, so it
// must not be able to enroll a cluster on its own. After that the agent pushes changes itself (a key
// rotation needs no operator), proving it is that cluster's agent with its own projected token,
// verified by the keys already on record.
import { z } from "zod";
import { CallplaneError } from "../../../lib/errors.js";
import { checkJwks, jwksHash, POD_TOKEN_MAX_BYTES, requireScope } from "../../../lib/identity/index.js";
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
  router.add("PUT", "/v1/internal/clusters/:clusterId/keys", (ctx) => registerClusterKeys(deps, ctx));
}

function checkClusterId(clusterId: string): void {
  if (!CLUSTER_ID.test(clusterId)) {
    const message =
      "must be 1 to 128 letters, digits, dots, dashes and underscores, beginning with a letter or digit (compute.workerIdentity.clusterId)";
    throw new CallplaneError("VALIDATION_FAILED", `clusterId: ${message}`, {
      extra: { errors: [{ field: "clusterId", message }] },
    });
  }
}

const clusterKeysSchema = z.strictObject({
  issuer: z
    .string()
    .max(2048)
    .refine((u) => URL.canParse(u) && new URL(u).protocol === "https:", {
      message:
        "must be the cluster's service-account issuer, an https URL (the iss of its tokens, --service-account-issuer)",
    }),
  jwks: z.unknown(),
  proofs: z.array(z.string().max(POD_TOKEN_MAX_BYTES)).max(2).default([]),
});

async function registerClusterKeys(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const p = await deps.auth.authenticate(req);
  const clusterId = params.clusterId;
  checkClusterId(clusterId);
  if (p.kind !== "service") await deps.auth.requirePlaneAdmin(req, "enrolling a cluster (setting its keys)");
  const body = parseBody(clusterKeysSchema, await readJsonBody(deps, req));
  const checked = checkJwks(body.jwks);
  if (!checked.ok)
    throw new CallplaneError(
      "CLUSTER_KEYS_INVALID",
      `jwks: ${checked.problems.join("; ")}. Send the key set the cluster publishes (its issuer's jwks_uri, or the API server's /openid/v1/jwks)`,
      { extra: { errors: checked.problems.map((message) => ({ field: "jwks", message })) } },
    );
  const current = await deps.store.clusterKeys(clusterId);
  let updatedBy: string;
  let agentSubject: string | undefined;
  if (p.kind === "service") {
    requireScope(p, "internal:clusters");
    if (!current)
      throw new CallplaneError(
        "CLUSTER_NOT_ENROLLED",
        `cluster ${clusterId} has no keys on record: its first keys come from an admin (scope cluster-management). Enroll it with \`callplane cluster enroll ${clusterId}\`, or give the compute agent an admin token once (compute.kubernetes.enrollmentTokenFile)`,
      );
    const proof = await deps.trust.podTokens.proveCluster(current, body.proofs);
    if (!proof.ok)
      throw new CallplaneError(
        "CLUSTER_PROOF_REFUSED",
        `no proof verifies against the keys on record for cluster ${clusterId}: ${proof.reasons.join("; ")}. If the cluster's signing key changed while its agent could not push, enroll it again with an admin credential (\`callplane cluster enroll ${clusterId}\`)`,
      );
    updatedBy = `agent:${proof.subject}`;
    // the first agent to prove the cluster after its enrollment is its agent from then on
    agentSubject = current.agentSubject ?? proof.subject;
  } else {
    // clusters belong to the plane: a plane-wide admin token (checked above; an API key or an
    // account's token is refused before the body is read). An enrollment resets the agent: the one
    // whose proof comes with it (an agent enrolling with enrollmentTokenFile), else the next to prove.
    requireScope(p, "cluster-management");
    updatedBy = `admin:${p.subject}`;
    const proof = await deps.trust.podTokens.proveCluster(
      { clusterId, issuer: body.issuer, jwks: checked.jwks },
      body.proofs,
    );
    agentSubject = proof.ok ? proof.subject : undefined;
  }
  const hash = jwksHash(checked.jwks);
  const changed = !current || current.jwksHash !== hash || current.issuer !== body.issuer;
  const updatedAt = changed ? new Date().toISOString() : current.updatedAt;
  const keyIds = checked.jwks.keys.map((k) => String(k.kid));
  if (changed || current.agentSubject !== agentSubject) {
    await deps.store.setClusterKeys({
      clusterId,
      issuer: body.issuer,
      jwks: checked.jwks,
      jwksHash: hash,
      agentSubject,
      updatedBy: changed ? updatedBy : current.updatedBy,
      updatedAt,
    });
    deps.trust.podTokens.forget(clusterId);
  }
  if (changed)
    deps.logger.info(
      {
        clusterId,
        issuer: body.issuer,
        keyIds,
        by: updatedBy,
        agentSubject: agentSubject ?? null,
        before: current
          ? { issuer: current.issuer, keyIds: current.jwks.keys.map((k) => String(k.kid)) }
          : null,
      },
      current ? "cluster keys replaced" : "cluster enrolled",
    );
  else if (current.agentSubject !== agentSubject)
    deps.logger.info({ clusterId, agentSubject: agentSubject ?? null }, "cluster agent pinned");
  sendJson(res, 200, {
    clusterId,
    issuer: body.issuer,
    keyIds,
    changed,
    updatedAt,
    updatedBy: changed || !current ? updatedBy : current.updatedBy,
    agentSubject: agentSubject ?? null,
  });
}

async function registerInstanceTypes(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  // the compute agent's scope: an admin token never holds an internal one (routes/auth.ts)
  await deps.auth.authorize(req, "internal:instances");
  const clusterId = params.clusterId;
  checkClusterId(clusterId);
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
