// The API's secret endpoints: NVCF's `PUT /v2/nvcf/secrets/functions/{fid}/versions/{vid}`
// (contract §5.3), callplane's listing and delete beside it, the admin endpoints that drive key
// rotation, and the internal endpoint the compute agent reads values from when it starts an
// instance. Values go in, and out only to the compute agent's service token; every other answer
// names secrets, never their values.
import type { IncomingMessage } from "node:http";
import { z } from "zod";
import type { Principal } from "../../../lib/auth.js";
import { CallplaneError } from "../../../lib/errors.js";
import { sendJson, type Router } from "../../../lib/http.js";
import type { Logger } from "../../../lib/log.js";
import type { FunctionVersionRecord } from "../store/types.js";
import type { SecretStore } from "./store.js";

export const SECRET_NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;
export const MAX_SECRET_VALUE_CHARS = 32_768;
export const MAX_SECRETS_PER_VERSION = 256;

const secretValue = z.union([z.string(), z.record(z.string(), z.unknown())], {
  message: "must be a string or a JSON object",
});

/** One NVCF secret, `{name, value}`; the messages never quote a value. */
export const secretEntry = z.strictObject({
  name: z
    .string({ message: "must be a string" })
    .min(1, "must not be empty")
    .max(48, "must be at most 48 characters")
    .regex(SECRET_NAME, "must start with a letter or digit and hold only letters, digits, _ . and -"),
  value: secretValue.superRefine((v, ctx) => {
    const text = typeof v === "string" ? v : JSON.stringify(v);
    if (text.trim().length === 0) ctx.addIssue({ code: "custom", message: "must not be empty" });
    if (text.length > MAX_SECRET_VALUE_CHARS)
      ctx.addIssue({ code: "custom", message: `must be at most ${MAX_SECRET_VALUE_CHARS} characters` });
  }),
});

export const secretList = z
  .array(secretEntry)
  .max(128, "at most 128 secrets at once")
  .superRefine((list, ctx) => {
    const seen = new Set<string>();
    for (const [i, s] of list.entries()) {
      if (seen.has(s.name))
        ctx.addIssue({ code: "custom", path: [i, "name"], message: `"${s.name}" is given twice` });
      seen.add(s.name);
    }
  });

export const updateSecretsSchema = z.strictObject({
  secrets: secretList.refine((l) => l.length > 0, "must hold at least one secret"),
});

const rotateMekSchema = z.strictObject({ keyId: z.string().min(1).max(255).optional() });
const rotateNekSchema = z.strictObject({
  functionId: z
    .string()
    .regex(
      /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i,
      "must be a function id (a UUID)",
    )
    .optional(),
});

export interface SecretRouteDeps {
  router: Router;
  store: SecretStore;
  authorize(req: IncomingMessage, scope: string): Promise<Principal>;
  requireAdmin(req: IncomingMessage, what: string): Promise<Principal>;
  loadVersion(fid: string, vid: string): Promise<FunctionVersionRecord>;
  /** Reads a JSON body whose parse errors never quote it (it holds secret values). */
  readSensitiveJson(req: IncomingMessage): Promise<unknown>;
  readJson(req: IncomingMessage): Promise<unknown>;
  parse<T extends z.ZodType>(schema: T, body: unknown): z.infer<T>;
  logger: Logger;
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

export function addSecretRoutes(d: SecretRouteDeps): void {
  const { router, store, logger } = d;
  const base = "/v2/nvcf/secrets/functions/:fid/versions/:vid";

  router.add("PUT", base, async ({ req, res, params }) => {
    await d.authorize(req, "update_secrets");
    const v = await d.loadVersion(params.fid, params.vid);
    const body = d.parse(updateSecretsSchema, await d.readSensitiveJson(req));
    await checkVersionLimit(store, v.versionId, body.secrets);
    await store.put(v, body.secrets);
    logger.info(
      { functionId: v.functionId, versionId: v.versionId, names: body.secrets.map((s) => s.name) },
      "secrets stored",
    );
    res.writeHead(204).end();
  });

  router.add("GET", base, async ({ req, res, params, query }) => {
    await d.authorize(req, "update_secrets");
    const v = await d.loadVersion(params.fid, params.vid);
    const check = query.get("check");
    if (check !== null && check !== "true" && check !== "false")
      throw new CallplaneError("VALIDATION_FAILED", "check: must be true or false", {
        extra: { errors: [{ field: "check", message: "must be true or false" }] },
      });
    sendJson(res, 200, {
      functionId: v.functionId,
      functionVersionId: v.versionId,
      secrets: await store.list(v, check === "true"),
    });
  });

  router.add("DELETE", `${base}/:name`, async ({ req, res, params }) => {
    await d.authorize(req, "update_secrets");
    const v = await d.loadVersion(params.fid, params.vid);
    // deleting never decrypts, so it also removes a secret that can no longer be read
    if (!(await store.remove(v, params.name)))
      throw new CallplaneError(
        "SECRET_NOT_FOUND",
        `version ${v.versionId} of function ${v.functionId} has no secret named "${params.name.slice(0, 64)}"; GET ${`/v2/nvcf/secrets/functions/${v.functionId}/versions/${v.versionId}`} lists them`,
      );
    logger.info({ functionId: v.functionId, versionId: v.versionId, name: params.name }, "secret deleted");
    res.writeHead(204).end();
  });

  // ---- key management (admin tokens only)
  router.add("GET", "/v1/admin/secrets/keys", async ({ req, res }) => {
    await d.requireAdmin(req, "reading the secret store's key status");
    sendJson(res, 200, await store.status());
  });

  router.add("POST", "/v1/admin/secrets/mek/rotate", async ({ req, res }) => {
    await d.requireAdmin(req, "rotating the MEK");
    const body = d.parse(rotateMekSchema, (await d.readJson(req)) ?? {});
    sendJson(res, 202, await store.startMekRotation(body.keyId));
  });

  router.add("POST", "/v1/admin/secrets/mek/rotate/abort", async ({ req, res }) => {
    await d.requireAdmin(req, "aborting a MEK rotation");
    sendJson(res, 200, await store.abortMekRotation());
  });

  router.add("POST", "/v1/admin/secrets/nek/rotate", async ({ req, res }) => {
    await d.requireAdmin(req, "rotating NEKs");
    const body = d.parse(rotateNekSchema, (await d.readJson(req)) ?? {});
    if (body.functionId !== undefined) {
      const fid = body.functionId.toLowerCase();
      const r = await store.rotateNeks(fid);
      sendJson(res, 202, r);
      return;
    }
    sendJson(res, 202, await store.rotateNeks());
  });

  // ---- internal: the compute agent, when it starts (or refreshes) an instance
  router.add("GET", "/v1/internal/secrets/functions/:fid/versions/:vid", async ({ req, res, params }) => {
    await d.authorize(req, "internal:secrets");
    const v = await d.loadVersion(params.fid, params.vid);
    const out = await store.values(v);
    res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" });
    res.end(JSON.stringify({ functionId: v.functionId, functionVersionId: v.versionId, ...out }));
  });
}
