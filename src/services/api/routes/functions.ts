// Functions and their versions (contract §5.1): create a function or a new version of one (with
// the secrets the request carries), list, read, update and delete versions.
import { randomUUID } from "node:crypto";
import { CallplaneError } from "../../../lib/errors.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import {
  createFunctionSchema,
  parseBody,
  updateFunctionSchema,
  type CreateFunctionBody,
} from "../schemas.js";
import type { SecretValue } from "../secrets/store.js";
import { NameTakenError, type FunctionSpec, type FunctionVersionRecord } from "../store/types.js";
import { readJsonBody, readSensitiveJsonBody, secretStore, type ApiDeps } from "./deps.js";
import { versionDto, versionDtos } from "./dto.js";
import { checkImageAllowed } from "./images.js";
import { checkVersionLimit } from "./secrets.js";

export function addFunctionRoutes(router: Router, deps: ApiDeps): void {
  router.add("POST", "/v2/nvcf/functions", (ctx) => createFunction(deps, ctx));
  router.add("POST", "/v2/nvcf/functions/:fid/versions", (ctx) => createVersion(deps, ctx));
  router.add("GET", "/v2/nvcf/functions", (ctx) => listFunctions(deps, ctx));
  router.add("GET", "/v2/nvcf/functions/ids", (ctx) => listFunctionIds(deps, ctx));
  router.add("GET", "/v2/nvcf/functions/:fid/versions", (ctx) => listVersions(deps, ctx));
  router.add("GET", "/v2/nvcf/functions/:fid/versions/:vid", (ctx) => getVersion(deps, ctx));
  router.add("PUT", "/v2/nvcf/functions/:fid/versions/:vid", (ctx) => updateVersion(deps, ctx));
  router.add("DELETE", "/v2/nvcf/functions/:fid/versions/:vid", (ctx) => deleteVersion(deps, ctx));
}

function specFromBody(b: Omit<CreateFunctionBody, "name">): FunctionSpec {
  const health = b.health ?? {
    protocol: "HTTP" as const,
    uri: b.healthUri ?? "/v2/health/ready",
    timeout: "PT10S",
    expectedStatusCode: 200,
  };
  return {
    inferenceUrl: b.inferenceUrl,
    inferencePort: b.inferencePort,
    health: { ...health, port: health.port ?? b.inferencePort },
    containerImage: b.containerImage,
    containerArgs: b.containerArgs,
    containerEnvironment: b.containerEnvironment,
    tags: b.tags,
    description: b.description,
    functionType: b.functionType,
    apiBodyFormat: b.apiBodyFormat,
  };
}

/** Stores the secrets a create request carried; on failure, removes what the request created. */
async function storeInitialSecrets(
  deps: ApiDeps,
  v: FunctionVersionRecord,
  list: Array<{ name: string; value: SecretValue }> | undefined,
  undo: () => Promise<unknown>,
): Promise<void> {
  if (!list?.length) return;
  try {
    const s = secretStore(deps);
    await checkVersionLimit(s, v.versionId, list);
    await s.put(v, list);
  } catch (err) {
    await undo().catch((e: unknown) =>
      deps.logger.error(
        { err: e, versionId: v.versionId },
        "could not remove a version whose secrets failed",
      ),
    );
    throw err;
  }
}

async function createFunction(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const { store } = deps;
  const reach = await deps.auth.caller(req, "register_function");
  const body = parseBody(createFunctionSchema, await readSensitiveJsonBody(deps, req));
  if (body.secrets?.length) secretStore(deps);
  checkImageAllowed(deps, body);
  // (names are unique across the whole plane, not per account: docs/operations.md)
  if (await store.getFunctionByName(body.name)) {
    throw new CallplaneError(
      "FUNCTION_NAME_TAKEN",
      `a function named "${body.name}" exists; add a version to it with POST /v2/nvcf/functions/{functionId}/versions, or pick another name`,
    );
  }
  const now = new Date().toISOString();
  const v: FunctionVersionRecord = {
    functionId: randomUUID(),
    versionId: randomUUID(),
    name: body.name,
    ncaId: reach.caller.account,
    spec: specFromBody(body),
    createdAt: now,
  };
  try {
    await store.createFunction(v);
  } catch (err) {
    // (another replica created the name between the check above and this write)
    if (err instanceof NameTakenError) {
      throw new CallplaneError("FUNCTION_NAME_TAKEN", `a function named "${body.name}" exists`);
    }
    throw err;
  }
  await storeInitialSecrets(deps, v, body.secrets, () => store.deleteVersion(v.functionId, v.versionId));
  deps.logger.info({ functionId: v.functionId, versionId: v.versionId, name: v.name }, "function created");
  sendJson(res, 200, { function: await versionDto(deps, v) });
}

async function createVersion(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const { store } = deps;
  const reach = await deps.auth.caller(req, "register_function");
  const existing = await reach.functionVersions("register_function", params.fid);
  const body = parseBody(createFunctionSchema, await readSensitiveJsonBody(deps, req));
  if (body.secrets?.length) secretStore(deps);
  checkImageAllowed(deps, body);
  if (existing[0].name !== body.name) {
    throw new CallplaneError(
      "VALIDATION_FAILED",
      `name: a new version keeps its function's name "${existing[0].name}"`,
      {
        extra: { errors: [{ field: "name", message: `must be "${existing[0].name}"` }] },
      },
    );
  }
  const v: FunctionVersionRecord = {
    functionId: params.fid,
    versionId: randomUUID(),
    name: body.name,
    ncaId: existing[0].ncaId,
    spec: specFromBody(body),
    createdAt: new Date().toISOString(),
  };
  await store.createVersion(v);
  await storeInitialSecrets(deps, v, body.secrets, () => store.deleteVersion(v.functionId, v.versionId));
  deps.logger.info({ functionId: v.functionId, versionId: v.versionId }, "function version created");
  sendJson(res, 200, { function: await versionDto(deps, v) });
}

async function listFunctions(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "list_functions");
  const versions = await reach.filter("list_functions", await deps.store.listVersions());
  sendJson(res, 200, { functions: await versionDtos(deps, versions, reach.caller.account) });
}

async function listFunctionIds(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "list_functions");
  const versions = await reach.filter("list_functions", await deps.store.listVersions());
  sendJson(res, 200, { functionIds: [...new Set(versions.map((v) => v.functionId))] });
}

async function listVersions(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "list_functions");
  const versions = await reach.functionVersions("list_functions", params.fid);
  sendJson(res, 200, { functions: await versionDtos(deps, versions, reach.caller.account) });
}

async function getVersion(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "list_functions");
  const v = await reach.version("list_functions", params.fid, params.vid);
  sendJson(res, 200, { function: await versionDto(deps, v, reach.caller.account) });
}

async function updateVersion(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "update_function");
  const v = await reach.version("update_function", params.fid, params.vid);
  const body = parseBody(updateFunctionSchema, await readJsonBody(deps, req));
  if (body.name !== undefined && body.name !== v.name) {
    throw new CallplaneError(
      "VALIDATION_FAILED",
      `name: a function's name cannot change (it is "${v.name}")`,
      { extra: { errors: [{ field: "name", message: "cannot change" }] } },
    );
  }
  const { name: _name, health, ...rest } = body;
  const spec: FunctionSpec = {
    ...v.spec,
    ...Object.fromEntries(Object.entries(rest).filter(([, x]) => x !== undefined)),
  };
  if (health) spec.health = { ...health, port: health.port ?? spec.inferencePort };
  // a health check that followed the inference port keeps following it
  else if (rest.inferencePort !== undefined && v.spec.health.port === v.spec.inferencePort)
    spec.health = { ...spec.health, port: rest.inferencePort };
  checkImageAllowed(deps, spec);
  await deps.store.updateVersion(v.functionId, v.versionId, spec);
  sendJson(res, 200, { function: await versionDto(deps, { ...v, spec }) });
}

async function deleteVersion(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const { store, secrets } = deps;
  const reach = await deps.auth.caller(req, "delete_function");
  await reach.version("delete_function", params.fid, params.vid);
  const r = await store.deleteVersion(params.fid, params.vid);
  if (r === "deployed") {
    throw new CallplaneError(
      "VERSION_DEPLOYED",
      `version ${params.vid} is deployed; undeploy it first with DELETE /v2/nvcf/deployments/functions/${params.fid}/versions/${params.vid}`,
    );
  }
  if (r === "not-found")
    throw new CallplaneError("VERSION_NOT_FOUND", `function ${params.fid} has no version ${params.vid}`);
  if (secrets) {
    // the function's last version takes the function, and with it the function's NEK
    if (await store.functionExists(params.fid))
      await secrets.removeVersion({ functionId: params.fid, versionId: params.vid });
    else await secrets.removeFunction(params.fid);
  }
  deps.logger.info({ functionId: params.fid, versionId: params.vid }, "function version deleted");
  res.writeHead(204).end();
}
