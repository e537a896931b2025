// API keys (contract §5.4): issued, listed, read and revoked with an admin token only, each in the
// account the request acts in. A key carries only scopes the admin token that issued it has, and
// reaches only what its policies name; a policy callplane cannot enforce is refused, never stored
// wider. Its value is shown once, at creation, and only its hash is stored.
import { randomUUID } from "node:crypto";
import { API_KEY_DEFAULT_SCOPES, newApiKey, sha256Hex } from "../../../lib/identity/index.js";
import { CallplaneError } from "../../../lib/errors.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { createKeySchema, parseBody, type CreateKeyBody } from "../schemas.js";
import { ALL_FUNCTIONS } from "../store/rows.js";
import type { ApiKeyRecord, KeyPolicy, KeyResource } from "../store/types.js";
import { FUNCTION_SCOPES, SHARED_SCOPES } from "./access.js";
import { readJsonBody, type ApiDeps } from "./deps.js";
import { keyDto } from "./dto.js";
import { UUID, checkUuid } from "./load.js";

export function addKeyRoutes(router: Router, deps: ApiDeps): void {
  router.add("POST", "/v1/keys", (ctx) => createKey(deps, ctx));
  router.add("GET", "/v1/keys", (ctx) => listKeys(deps, ctx));
  router.add("GET", "/v1/keys/:id", (ctx) => getKey(deps, ctx));
  router.add("DELETE", "/v1/keys/:id", (ctx) => revokeKey(deps, ctx));
}

const DAY_MS = 86_400_000;

async function createKey(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const admin = await deps.auth.requireAdmin(req);
  const account = await deps.auth.actingAccount(admin, req);
  const body = parseBody(createKeySchema, (await readJsonBody(deps, req)) ?? {});
  const policies = await enforceablePolicies(deps, account, body);
  const scopes = [...new Set(policies.flatMap((p) => p.scopes))];
  const missing = scopes.filter((s) => !admin.scopes.has(s));
  if (missing.length) {
    throw new CallplaneError(
      "FORBIDDEN_SCOPE",
      `a key can carry only scopes the admin token has; this token lacks ${missing.join(", ")}`,
      { extra: { requiredScope: missing[0] } },
    );
  }
  const now = new Date();
  const expiresAt = keyExpiry(deps, body, now);
  const value = newApiKey();
  const k: ApiKeyRecord = {
    keyId: randomUUID(),
    hash: sha256Hex(value),
    description: body.description,
    ownerId: typeof req.headers["key-owner-id"] === "string" ? req.headers["key-owner-id"] : admin.subject,
    ncaId: account,
    scopes,
    policies,
    expiresAt: expiresAt.toISOString(),
    createdAt: now.toISOString(),
  };
  await deps.store.createApiKey(k);
  deps.logger.info({ keyId: k.keyId, ncaId: account, scopes }, "API key issued");
  sendJson(res, 200, { ...keyDto(k), value });
}

/** `expires_at`, in the future and within apikeys.maxLifetimeDays; 30 days when not given. */
function keyExpiry(deps: ApiDeps, body: CreateKeyBody, now: Date): Date {
  const max = deps.maxKeyLifetimeDays;
  const expiresAt = body.expires_at
    ? new Date(body.expires_at)
    : new Date(now.getTime() + Math.min(30, max) * DAY_MS);
  const refuse = (message: string) =>
    new CallplaneError("VALIDATION_FAILED", `expires_at: ${message}`, {
      extra: { errors: [{ field: "expires_at", message }] },
    });
  if (expiresAt.getTime() <= now.getTime()) throw refuse("must be in the future");
  if (expiresAt.getTime() > now.getTime() + max * DAY_MS)
    throw refuse(
      `must be at most ${max} days from now (apikeys.maxLifetimeDays); create a new key before this one expires`,
    );
  return expiresAt;
}

/**
 * The key's policies as they will be enforced: the default scopes on every function of the account
 * (and shared with it) when none are given; each named resource checked. Anything callplane could
 * only enforce wider than asked is refused with POLICY_NOT_ENFORCEABLE, listing every problem.
 */
async function enforceablePolicies(
  deps: ApiDeps,
  account: string,
  body: CreateKeyBody,
): Promise<KeyPolicy[]> {
  const given = body.authorizations?.policies ?? [{ scopes: [...API_KEY_DEFAULT_SCOPES] }];
  const errors: Array<{ field: string; message: string }> = [];
  const policies: KeyPolicy[] = [];
  let shared: Set<string> | undefined;
  for (const [i, p] of given.entries()) {
    const at = `authorizations.policies[${i}]`;
    const resources: KeyResource[] = [];
    for (const [j, r] of (p.resources ?? ALL_FUNCTIONS).entries()) {
      const field = `${at}.resources[${j}]`;
      if (r.type !== "account-functions" && r.type !== "authorized-functions") {
        errors.push({
          field: `${field}.type`,
          message: `"${r.type.slice(0, 64)}" is not a resource type callplane enforces; use account-functions or authorized-functions`,
        });
        continue;
      }
      if (r.id !== "*") {
        if (!UUID.test(r.id)) {
          errors.push({ field: `${field}.id`, message: `must be "*" or a function id (a UUID)` });
          continue;
        }
        const versions = await deps.store.listVersions(r.id);
        shared ??= new Set(await deps.store.listAuthorizedFunctions(account));
        const found =
          r.type === "account-functions"
            ? versions.length > 0 && versions[0].ncaId === account
            : versions.length > 0 && shared.has(r.id);
        if (!found) {
          errors.push({
            field: `${field}.id`,
            message:
              r.type === "account-functions"
                ? `account ${account} has no function ${r.id}`
                : `function ${r.id} is not shared with account ${account}`,
          });
          continue;
        }
      }
      resources.push({ id: r.id, type: r.type });
    }
    const everyOwn = resources.some((r) => r.type === "account-functions" && r.id === "*");
    for (const s of p.scopes) {
      if (!FUNCTION_SCOPES.has(s) && !everyOwn)
        errors.push({
          field: `${at}.scopes`,
          message: `${s} is not about one function, so a policy that names functions cannot narrow it; give it in a policy with the resource {"id":"*","type":"account-functions"}`,
        });
    }
    if (resources.length > 0 && resources.every((r) => r.type === "authorized-functions")) {
      const unshared = p.scopes.filter((s) => !SHARED_SCOPES.has(s));
      if (unshared.length)
        errors.push({
          field: `${at}.scopes`,
          message: `functions shared with the account can only be listed and invoked; ${unshared.join(", ")} would never apply to them`,
        });
    }
    policies.push({ scopes: [...new Set(p.scopes)], resources });
  }
  if (errors.length)
    throw new CallplaneError(
      "POLICY_NOT_ENFORCEABLE",
      errors.map((e) => `${e.field}: ${e.message}`).join("; "),
      { extra: { errors } },
    );
  return policies;
}

async function listKeys(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const admin = await deps.auth.requireAdmin(req);
  const account = await deps.auth.actingAccount(admin, req);
  const keys = (await deps.store.listApiKeys()).filter((k) => keyAccount(deps, k) === account);
  sendJson(res, 200, { keys: keys.map((k) => keyDto(k)) });
}

/** A key of the acting account, or KEY_NOT_FOUND. */
async function loadKey(deps: ApiDeps, req: RequestContext["req"], id: string): Promise<ApiKeyRecord> {
  const admin = await deps.auth.requireAdmin(req);
  const account = await deps.auth.actingAccount(admin, req);
  checkUuid(id, "KEY_NOT_FOUND", "key id");
  const k = await deps.store.getApiKey(id);
  if (!k || keyAccount(deps, k) !== account)
    throw new CallplaneError("KEY_NOT_FOUND", `no API key with id ${id} in account ${account}`);
  return k;
}

function keyAccount(deps: ApiDeps, k: ApiKeyRecord): string {
  return k.ncaId || deps.ncaId;
}

async function getKey(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  sendJson(res, 200, keyDto(await loadKey(deps, req, params.id)));
}

async function revokeKey(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const k = await loadKey(deps, req, params.id);
  const at = new Date().toISOString();
  await deps.store.revokeApiKey(k.keyId, at);
  deps.logger.info({ keyId: k.keyId }, "API key revoked");
  sendJson(res, 200, keyDto({ ...k, revokedAt: k.revokedAt ?? at }));
}
