// The worker-trust endpoints (the logic behind them is WorkerTrust, in ../worker-trust.ts):
// - PUT /v1/internal/work-queues/{fvid}: an invocation replica asks for a deployed version's queue
//   again (it found it missing);
// - /v1/internal/instances/{iid}/identity: the compute agent has an instance's identity token
//   issued (and refreshed), reads its record, or revokes it when it undoes a provisioning;
// - POST /v1/workers/tokens/introspect: RFC 7662 introspection of a worker token;
// - POST /v2/nvcf/webhook/nats-auth: the auth callout's webhook, a worker token in, the user and
//   permissions of one function version out.
import { z } from "zod";
import { CallplaneError } from "../../../lib/errors.js";
import { parseJsonBody, sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { NATS_ACCOUNTS, tokenWorkerPermissions, type Permissions } from "../../../lib/nats/index.js";
import { workerIdentifier } from "../../../lib/identity/index.js";
import { parseBody } from "../schemas.js";
import type { Introspection } from "../worker-trust.js";
import { readRawBody, type ApiDeps } from "./deps.js";

/** A JSON body (through the shared checks: UTF-8, depth), or null when there is none. */
function jsonOrNull(bytes: Buffer, sensitive = false): unknown {
  return bytes.length ? parseJsonBody(bytes, { sensitive }) : null;
}

const identityRequestSchema = z.strictObject({
  functionId: z.string(),
  versionId: z.string(),
  deploymentId: z.string(),
});

const webhookSchema = z.object({
  account: z.string(),
  pluginName: z.string(),
  // larger than a pod token may be (16 KiB), so that the verifier refuses it with its reason, logged
  payload: z.string().max(65_536),
});

export function addWorkerTrustRoutes(router: Router, deps: ApiDeps): void {
  router.add("PUT", "/v1/internal/work-queues/:fvid", (ctx) => recreateWorkQueue(deps, ctx));
  router.add("POST", "/v1/internal/instances/:iid/identity", (ctx) => issueIdentity(deps, ctx));
  router.add("GET", "/v1/internal/instances/:iid/identity", (ctx) => getIdentity(deps, ctx));
  router.add("DELETE", "/v1/internal/instances/:iid/identity", (ctx) => revokeIdentity(deps, ctx));
  router.add("POST", "/v1/workers/tokens/introspect", (ctx) => introspectToken(deps, ctx));
  router.add("POST", "/v2/nvcf/webhook/nats-auth", (ctx) => natsAuthWebhook(deps, ctx));
}

/** The NATS user of a worker with its own identity: named after its version, plus the instance. */
const workerUser = (fvid: string, instanceId: string) => `worker-${fvid}.${instanceId}`;

function permissionsDto(p: Permissions) {
  return {
    publish: { allow: p.publish.allow, deny: p.publish.deny ?? [] },
    subscribe: { allow: p.subscribe.allow, deny: p.subscribe.deny ?? [] },
    ...(p.allowResponses ? { response: { maxMsgs: 1 } } : {}),
  };
}

async function recreateWorkQueue(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  await deps.auth.authorize(req, "internal:invocation-auth");
  const deployed = (await deps.store.listDeployments()).some((d) => d.versionId === params.fvid);
  if (!deployed) throw new CallplaneError("FUNCTION_NOT_DEPLOYED", `version ${params.fvid} is not deployed`);
  await deps.trust.recreateQueue(params.fvid).catch((err: unknown) => {
    throw new CallplaneError("UNAVAILABLE", "NATS JetStream did not create the work queue; retry shortly", {
      cause: err,
    });
  });
  res.writeHead(204).end();
}

async function issueIdentity(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const { signer, identities } = deps.trust;
  await deps.auth.authorize(req, "internal:identities");
  const body = parseBody(identityRequestSchema, jsonOrNull(await readRawBody(deps, req)));
  const d = await deps.store.getDeploymentById(body.deploymentId).catch(() => undefined);
  if (!d || d.versionId !== body.versionId || d.functionId !== body.functionId)
    throw new CallplaneError(
      "DEPLOYMENT_NOT_FOUND",
      `no deployment ${body.deploymentId} of version ${body.versionId}: an identity is issued only for an instance of a deployed version`,
    );
  const claims = {
    instanceId: params.iid,
    functionId: body.functionId,
    functionVersionId: body.versionId,
    deploymentId: body.deploymentId,
  };
  const signed = await signer.sign(claims);
  const ok = await identities.issued({
    instanceId: params.iid,
    functionId: body.functionId,
    versionId: body.versionId,
    deploymentId: body.deploymentId,
    issuedAt: new Date().toISOString(),
    expiresAt: new Date(signed.expiresAt * 1000).toISOString(),
  });
  if (!ok)
    throw new CallplaneError(
      "WORKER_TOKEN_REVOKED",
      `the identity of instance ${params.iid} was revoked; a terminated instance gets no new token (start a new instance)`,
    );
  deps.logger.debug({ instanceId: params.iid, expiresAt: signed.expiresAt }, "worker identity issued");
  sendJson(res, 200, {
    token: signed.token,
    expiresAt: new Date(signed.expiresAt * 1000).toISOString(),
    expiresIn: signer.ttlSeconds,
    audience: signer.audience,
    workerIdentifier: workerIdentifier(params.iid),
    tokenSource: "api",
  });
}

async function getIdentity(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  await deps.auth.authorize(req, "internal:identities");
  const r = await deps.trust.identities.get(params.iid);
  if (!r) throw new CallplaneError("IDENTITY_NOT_FOUND", `no identity was issued for instance ${params.iid}`);
  sendJson(res, 200, r);
}

async function revokeIdentity(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  await deps.auth.authorize(req, "internal:identities");
  const r = await deps.trust.identities.get(params.iid);
  if (!r) throw new CallplaneError("IDENTITY_NOT_FOUND", `no identity was issued for instance ${params.iid}`);
  const revoked = await deps.trust.revoke(params.iid, "provisioning undone by the compute agent");
  sendJson(res, 200, { instanceId: params.iid, revoked, status: "REVOKED" });
}

/** Logs a refused worker token with its reason (the answer to the caller stays generic, as RFC 7662's). */
function logRefusal(deps: ApiDeps, via: string, r: Introspection & { active: false }): void {
  deps.logger.warn(
    {
      via,
      tokenKind: r.kind,
      failure: r.failure,
      ...(r.check ? { check: r.check } : {}),
      ...(r.kind === "pod" && r.clusterId ? { clusterId: r.clusterId } : {}),
      ...(r.kind === "pod" && r.subject ? { sub: r.subject } : {}),
      reason: r.reason,
    },
    "worker token refused",
  );
}

// RFC 7662: the token as a form field (or JSON); the caller authenticates (a service token). A caller
// that acts for a worker may name the version it claims (function_version_id, and function_id): a
// token of another version's instance is then inactive (upstream's NVCF API took the claim on trust).
async function introspectToken(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  await deps.auth.authorize(req, "internal:introspect");
  const bytes = await readRawBody(deps, req);
  const raw = bytes.toString("utf8");
  const fields: Record<string, unknown> = /^\s*\{/.test(raw)
    ? ((parseJsonBody(bytes, { sensitive: true }) as Record<string, unknown> | null) ?? {})
    : Object.fromEntries(new URLSearchParams(raw));
  const { token } = fields;
  if (typeof token !== "string" || !token)
    throw new CallplaneError("VALIDATION_FAILED", "token: send the token to introspect (form field token)");
  const r = await deps.trust.introspect(token);
  if (!r.active) {
    logRefusal(deps, "introspection", r);
    sendJson(res, 200, { active: false });
    return;
  }
  for (const [field, value] of [
    ["function_version_id", r.functionVersionId],
    ["function_id", r.functionId],
  ] as const)
    if (fields[field] !== undefined && fields[field] !== value) {
      logRefusal(deps, "introspection", {
        kind: "api",
        active: false,
        failure: "invalid",
        reason: `the caller claims ${field} ${JSON.stringify(fields[field])}, but the token's instance ${r.instanceId} runs ${value}`,
      });
      sendJson(res, 200, { active: false });
      return;
    }
  sendJson(res, 200, {
    active: true,
    sub: r.subject,
    aud: r.audience,
    iss: r.issuer,
    exp: r.expiresAt,
    iat: r.issuedAt,
    jti: r.tokenId,
    token_type: r.kind === "pod" ? "pod_service_account" : "worker_identity",
    instance_id: r.instanceId,
    worker_id: r.kind === "pod" ? r.subject.split(":").at(-1) : workerIdentifier(r.instanceId),
    function_id: r.functionId,
    function_version_id: r.functionVersionId,
    deployment_id: r.deploymentId,
    ...(r.kind === "pod" ? { cluster_id: r.clusterId, pod_name: r.pod.name, pod_uid: r.pod.uid } : {}),
  });
}

async function natsAuthWebhook(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const { trust } = deps;
  await deps.auth.authorize(req, "internal:nats-auth");
  const body = parseBody(webhookSchema, jsonOrNull(await readRawBody(deps, req), true));
  if (trust.opts.workerAuth !== "token")
    throw new CallplaneError(
      "WORKER_AUTH_MODE_OFF",
      "nats.workerAuth is nkey: workers authenticate with the shared worker nkey, not with tokens; set nats.workerAuth: token to accept worker tokens",
    );
  if (body.account !== NATS_ACCOUNTS.app || body.pluginName !== "webhook")
    throw new CallplaneError(
      "NATS_ACCOUNT_REFUSED",
      `workers log in to account ${NATS_ACCOUNTS.app} with plugin webhook, not account ${body.account} with plugin ${body.pluginName}; the worker must read NVCF_NATS_ACCOUNT`,
    );
  const r = await trust.introspect(body.payload);
  if (!r.active) {
    logRefusal(deps, "nats-auth", r);
    const code =
      r.failure === "expired"
        ? "WORKER_TOKEN_EXPIRED"
        : r.failure === "revoked"
          ? "WORKER_TOKEN_REVOKED"
          : "WORKER_TOKEN_INVALID";
    throw new CallplaneError(code, `the worker token was refused: ${r.reason}`);
  }
  sendJson(res, 200, {
    userId: workerUser(r.functionVersionId, r.instanceId),
    account: NATS_ACCOUNTS.app,
    functionVersionId: r.functionVersionId,
    instanceId: r.instanceId,
    // the user JWT ends with the token: an instance revoked while its kick failed is out by then
    expiresAt: r.expiresAt,
    permissions: permissionsDto(tokenWorkerPermissions(trust.opts.region, r.functionVersionId, r.instanceId)),
  });
}
