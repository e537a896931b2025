// Deployments (contract §5.2): deploy a function version, read, change and undeploy it; and the
// internal list of desired deployments the compute agent syncs from. Deploying, and every sync,
// also make sure the version's work queue exists. A deployment (created or changed) names only
// instance types some cluster offers (instance-types.ts).
import { randomUUID } from "node:crypto";
import { CallplaneError } from "../../../lib/errors.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { checkInstanceTypes } from "../instance-types.js";
import { deploymentSchema, parseBody } from "../schemas.js";
import type { DeploymentRecord, DeploymentSpecification } from "../store/types.js";
import { readJsonBody, type ApiDeps } from "./deps.js";
import { deploymentDto } from "./dto.js";
import type { Reach } from "./access.js";
import { checkUuid } from "./load.js";

const BY_VERSION = "/v2/nvcf/deployments/functions/:fid/versions/:vid";

export function addDeploymentRoutes(router: Router, deps: ApiDeps): void {
  router.add("POST", BY_VERSION, (ctx) => createDeployment(deps, ctx));
  router.add("GET", BY_VERSION, (ctx) => getDeployment(deps, ctx));
  router.add("GET", "/v2/nvcf/deployments/:did", (ctx) => getDeploymentById(deps, ctx));
  router.add("PUT", BY_VERSION, (ctx) => updateDeployment(deps, ctx));
  router.add("DELETE", BY_VERSION, (ctx) => deleteDeployment(deps, ctx));
  // ---- internal: the compute agent
  router.add("GET", "/v1/internal/deployments", (ctx) => listDesiredDeployments(deps, ctx));
}

/** The deployment of a version the caller reaches (to deploy it), or DEPLOYMENT_NOT_FOUND. */
async function loadDeployment(
  deps: ApiDeps,
  reach: Reach,
  fid: string,
  vid: string,
): Promise<DeploymentRecord> {
  await reach.version("deploy_function", fid, vid);
  const d = await deps.store.getDeployment(fid, vid);
  if (!d)
    throw new CallplaneError(
      "DEPLOYMENT_NOT_FOUND",
      `version ${vid} of function ${fid} is not deployed; deploy it with POST on the same path`,
    );
  return d;
}

async function createDeployment(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "deploy_function");
  const v = await reach.version("deploy_function", params.fid, params.vid);
  const body = parseBody(deploymentSchema, await readJsonBody(deps, req));
  const d = await deployVersion(deps, v, body.deploymentSpecifications);
  sendJson(res, 200, { deployment: await deploymentDto(deps, d) });
}

/**
 * Deploys a version (its specifications already checked against deploymentSchema): refuses
 * instance types no cluster offers and a version deployed already, then makes sure its work queue
 * exists. The deploy route and the operator console's deploy action (console/actions.ts) both
 * deploy through here.
 */
export async function deployVersion(
  deps: Pick<ApiDeps, "store" | "compute" | "logger" | "trust">,
  v: { functionId: string; versionId: string },
  specs: DeploymentSpecification[],
): Promise<DeploymentRecord> {
  await checkInstanceTypes(deps.store, deps.compute, specs);
  const now = new Date().toISOString();
  const d: DeploymentRecord = {
    deploymentId: randomUUID(),
    functionId: v.functionId,
    versionId: v.versionId,
    specs,
    createdAt: now,
    updatedAt: now,
  };
  if ((await deps.store.createDeployment(d)) === "exists") {
    throw new CallplaneError(
      "DEPLOYMENT_EXISTS",
      `version ${v.versionId} is already deployed; change it with PUT on the same path`,
    );
  }
  deps.logger.info(
    { functionId: v.functionId, versionId: v.versionId, deploymentId: d.deploymentId },
    "deployment created",
  );
  // the queue exists before any worker or invocation needs it (workers may not create it)
  await deps.trust.ensureQueueSoft(v.versionId);
  return d;
}

async function getDeployment(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "deploy_function");
  sendJson(res, 200, {
    deployment: await deploymentDto(deps, await loadDeployment(deps, reach, params.fid, params.vid)),
  });
}

async function getDeploymentById(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "deploy_function");
  checkUuid(params.did, "DEPLOYMENT_NOT_FOUND", "deployment id");
  const d = await deps.store.getDeploymentById(params.did);
  const v = d && (await deps.store.getVersion(d.functionId, d.versionId));
  if (!d || !v || !(await reach.reaches("deploy_function", v)))
    throw new CallplaneError("DEPLOYMENT_NOT_FOUND", `no deployment with id ${params.did}`);
  sendJson(res, 200, { deployment: await deploymentDto(deps, d) });
}

async function updateDeployment(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "deploy_function");
  const d = await loadDeployment(deps, reach, params.fid, params.vid);
  const body = parseBody(deploymentSchema, await readJsonBody(deps, req));
  await checkInstanceTypes(deps.store, deps.compute, body.deploymentSpecifications);
  const now = new Date().toISOString();
  await deps.store.updateDeployment(d.functionId, d.versionId, body.deploymentSpecifications, now);
  deps.logger.info({ deploymentId: d.deploymentId }, "deployment updated");
  sendJson(res, 200, {
    deployment: await deploymentDto(deps, { ...d, specs: body.deploymentSpecifications, updatedAt: now }),
  });
}

async function deleteDeployment(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "deploy_function");
  const d = await loadDeployment(deps, reach, params.fid, params.vid);
  await deps.store.deleteDeployment(d.functionId, d.versionId);
  deps.logger.info({ deploymentId: d.deploymentId }, "deployment deleted");
  sendJson(res, 200, { deployment: { ...(await deploymentDto(deps, d)), functionStatus: "INACTIVE" } });
}

/** What the compute agent should run: every deployment with its version's spec, and how workers reach NATS. */
async function listDesiredDeployments(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const { store, secrets, trust } = deps;
  await deps.auth.authorize(req, "internal:deployments");
  const deployments = await store.listDeployments();
  const revisions = secrets ? await secrets.revisions() : new Map<string, number>();
  const out = [];
  for (const d of deployments) {
    const v = await store.getVersion(d.functionId, d.versionId);
    // the revision changes whenever a secret of the version is written or deleted, so the
    // compute agent knows when to refresh the secrets of running instances
    if (v)
      out.push({
        ...d,
        name: v.name,
        ncaId: v.ncaId,
        spec: v.spec,
        secretsRevision: revisions.get(d.versionId) ?? 0,
      });
  }
  await Promise.all(out.map((d) => trust.ensureQueueSoft(d.versionId)));
  const nats = trust.workerNatsEnv();
  sendJson(res, 200, { deployments: out, workerAuth: nats.workerAuth, workerNatsEnv: nats.env });
}
