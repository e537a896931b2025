// API keys (contract §5.4): issued, listed, read and revoked with an admin token only. A key
// carries only scopes the admin token that issued it has; its value is shown once, at creation,
// and only its hash is stored.
import { randomUUID } from "node:crypto";
import { API_KEY_DEFAULT_SCOPES, newApiKey, sha256Hex } from "../../../lib/identity/index.js";
import { CallplaneError } from "../../../lib/errors.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { createKeySchema, parseBody } from "../schemas.js";
import type { ApiKeyRecord } from "../store/types.js";
import { readJsonBody, type ApiDeps } from "./deps.js";
import { keyDto } from "./dto.js";
import { checkUuid } from "./load.js";

export function addKeyRoutes(router: Router, deps: ApiDeps): void {
  router.add("POST", "/v1/keys", (ctx) => createKey(deps, ctx));
  router.add("GET", "/v1/keys", (ctx) => listKeys(deps, ctx));
  router.add("GET", "/v1/keys/:id", (ctx) => getKey(deps, ctx));
  router.add("DELETE", "/v1/keys/:id", (ctx) => revokeKey(deps, ctx));
}

async function createKey(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const admin = await deps.auth.requireAdmin(req);
  const body = parseBody(createKeySchema, (await readJsonBody(deps, req)) ?? {});
  const scopes = body.authorizations
    ? [...new Set(body.authorizations.policies.flatMap((p) => p.scopes))]
    : [...API_KEY_DEFAULT_SCOPES];
  const missing = scopes.filter((s) => !admin.scopes.has(s));
  if (missing.length) {
    throw new CallplaneError(
      "FORBIDDEN_SCOPE",
      `a key can carry only scopes the admin token has; this token lacks ${missing.join(", ")}`,
      { extra: { requiredScope: missing[0] } },
    );
  }
  const now = new Date();
  const expiresAt = body.expires_at ? new Date(body.expires_at) : new Date(now.getTime() + 30 * 86_400_000);
  if (expiresAt.getTime() <= now.getTime()) {
    throw new CallplaneError("VALIDATION_FAILED", "expires_at: must be in the future", {
      extra: { errors: [{ field: "expires_at", message: "must be in the future" }] },
    });
  }
  const value = newApiKey();
  const k: ApiKeyRecord = {
    keyId: randomUUID(),
    hash: sha256Hex(value),
    description: body.description,
    ownerId: typeof req.headers["key-owner-id"] === "string" ? req.headers["key-owner-id"] : admin.subject,
    scopes,
    expiresAt: expiresAt.toISOString(),
    createdAt: now.toISOString(),
  };
  await deps.store.createApiKey(k);
  deps.logger.info({ keyId: k.keyId, scopes }, "API key issued");
  sendJson(res, 200, { ...keyDto(k), value });
}

async function listKeys(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  await deps.auth.requireAdmin(req);
  sendJson(res, 200, { keys: (await deps.store.listApiKeys()).map((k) => keyDto(k)) });
}

async function getKey(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  await deps.auth.requireAdmin(req);
  checkUuid(params.id, "KEY_NOT_FOUND", "key id");
  const k = await deps.store.getApiKey(params.id);
  if (!k) throw new CallplaneError("KEY_NOT_FOUND", `no API key with id ${params.id}`);
  sendJson(res, 200, keyDto(k));
}

async function revokeKey(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  await deps.auth.requireAdmin(req);
  checkUuid(params.id, "KEY_NOT_FOUND", "key id");
  const k = await deps.store.getApiKey(params.id);
  if (!k) throw new CallplaneError("KEY_NOT_FOUND", `no API key with id ${params.id}`);
  const at = new Date().toISOString();
  await deps.store.revokeApiKey(k.keyId, at);
  deps.logger.info({ keyId: k.keyId }, "API key revoked");
  sendJson(res, 200, keyDto({ ...k, revokedAt: k.revokedAt ?? at }));
}
