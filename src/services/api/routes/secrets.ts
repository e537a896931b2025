// The API's secret endpoints: NVCF's `PUT /v2/nvcf/secrets/functions/{fid}/versions/{vid}`
// (contract §5.3), callplane's listing and delete beside it, the admin endpoints that drive key
// rotation, and the internal endpoint the compute agent reads values from when it starts an
// instance. Values go in, and out only to the compute agent's service token; every other answer
// names secrets, never their values. Served only when the API runs with a secret store.
import { CallplaneError } from "../../../lib/errors.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { parseBody, rotateMekSchema, rotateNekSchema, updateSecretsSchema } from "../schemas.js";
import type { SecretStore } from "../secrets/store.js";
import { readJsonBody, readSensitiveJsonBody, secretStore, type ApiDeps } from "./deps.js";

export const MAX_SECRETS_PER_VERSION = 256;

const BASE = "/v2/nvcf/secrets/functions/:fid/versions/:vid";

export function addSecretRoutes(router: Router, deps: ApiDeps): void {
  router.add("PUT", BASE, (ctx) => putSecrets(deps, ctx));
  router.add("GET", BASE, (ctx) => listSecrets(deps, ctx));
  router.add("DELETE", `${BASE}/:name`, (ctx) => deleteSecret(deps, ctx));

  // ---- key management (admin tokens only)
  router.add("GET", "/v1/admin/secrets/keys", (ctx) => keyStatus(deps, ctx));
  router.add("POST", "/v1/admin/secrets/mek/rotate", (ctx) => rotateMek(deps, ctx));
  router.add("POST", "/v1/admin/secrets/mek/rotate/abort", (ctx) => abortMekRotation(deps, ctx));
  router.add("POST", "/v1/admin/secrets/nek/rotate", (ctx) => rotateNeks(deps, ctx));

  // ---- internal: the compute agent, when it starts (or refreshes) an instance
  router.add("GET", "/v1/internal/secrets/functions/:fid/versions/:vid", (ctx) => secretValues(deps, ctx));
}

/** Refuses a write that would leave a version with more secrets than it may hold. */
export async function checkVersionLimit(
  store: SecretStore,
  versionId: string,
  incoming: ReadonlyArray<{ name: string }>,
): Promise<void> {
  const existing = (await store.names([versionId])).get(versionId) ?? [];
  const total = new Set([...existing, ...incoming.map((s) => s.name)]).size;
  if (total > MAX_SECRETS_PER_VERSION)
    throw new CallplaneError(
      "VALIDATION_FAILED",
      `secrets: a function version holds at most ${MAX_SECRETS_PER_VERSION} secrets; this would make ${total}. Delete some first`,
      {
        extra: { errors: [{ field: "secrets", message: `at most ${MAX_SECRETS_PER_VERSION} per version` }] },
      },
    );
}

async function putSecrets(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "update_secrets");
  const store = secretStore(deps);
  const v = await reach.version("update_secrets", params.fid, params.vid);
  const body = parseBody(updateSecretsSchema, await readSensitiveJsonBody(deps, req));
  await checkVersionLimit(store, v.versionId, body.secrets);
  await store.put(v, body.secrets);
  deps.logger.info(
    { functionId: v.functionId, versionId: v.versionId, names: body.secrets.map((s) => s.name) },
    "secrets stored",
  );
  res.writeHead(204).end();
}

async function listSecrets(deps: ApiDeps, { req, res, params, query }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "update_secrets");
  const v = await reach.version("update_secrets", params.fid, params.vid);
  const check = query.get("check");
  if (check !== null && check !== "true" && check !== "false")
    throw new CallplaneError("VALIDATION_FAILED", "check: must be true or false", {
      extra: { errors: [{ field: "check", message: "must be true or false" }] },
    });
  sendJson(res, 200, {
    functionId: v.functionId,
    functionVersionId: v.versionId,
    secrets: await secretStore(deps).list(v, check === "true"),
  });
}

async function deleteSecret(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "update_secrets");
  const v = await reach.version("update_secrets", params.fid, params.vid);
  // deleting never decrypts, so it also removes a secret that can no longer be read
  if (!(await secretStore(deps).remove(v, params.name)))
    throw new CallplaneError(
      "SECRET_NOT_FOUND",
      `version ${v.versionId} of function ${v.functionId} has no secret named "${params.name.slice(0, 64)}"; GET ${`/v2/nvcf/secrets/functions/${v.functionId}/versions/${v.versionId}`} lists them`,
    );
  deps.logger.info({ functionId: v.functionId, versionId: v.versionId, name: params.name }, "secret deleted");
  res.writeHead(204).end();
}

async function keyStatus(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  await deps.auth.requirePlaneAdmin(req, "reading the secret store's key status");
  sendJson(res, 200, await secretStore(deps).status());
}

async function rotateMek(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  await deps.auth.requirePlaneAdmin(req, "rotating the MEK");
  const body = parseBody(rotateMekSchema, (await readJsonBody(deps, req)) ?? {});
  sendJson(res, 202, await secretStore(deps).startMekRotation(body.keyId));
}

async function abortMekRotation(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  await deps.auth.requirePlaneAdmin(req, "aborting a MEK rotation");
  sendJson(res, 200, await secretStore(deps).abortMekRotation());
}

async function rotateNeks(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  await deps.auth.requirePlaneAdmin(req, "rotating NEKs");
  const body = parseBody(rotateNekSchema, (await readJsonBody(deps, req)) ?? {});
  if (body.functionId !== undefined) {
    const fid = body.functionId.toLowerCase();
    const r = await secretStore(deps).rotateNeks(fid);
    sendJson(res, 202, r);
    return;
  }
  sendJson(res, 202, await secretStore(deps).rotateNeks());
}

async function secretValues(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const reach = await deps.auth.caller(req, "internal:secrets");
  const v = await reach.version("internal:secrets", params.fid, params.vid);
  const out = await secretStore(deps).values(v);
  res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" });
  res.end(JSON.stringify({ functionId: v.functionId, functionVersionId: v.versionId, ...out }));
}
