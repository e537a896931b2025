// The invocation service's question before it queues a request (internal): may this API key invoke
// this function, and which of its versions are deployed to take the request?
import { z } from "zod";
import { requireScope } from "../../../lib/identity/index.js";
import { CallplaneError } from "../../../lib/errors.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { parseBody } from "../schemas.js";
import { readJsonBody, type ApiDeps } from "./deps.js";

const invocationAuthSchema = z.strictObject({
  apiKey: z.string().min(1).max(4096),
  functionId: z.string(),
  functionVersionId: z.string().optional(),
});

export function addInvocationAuthRoutes(router: Router, deps: ApiDeps): void {
  router.add("POST", "/v1/internal/invocation-auth", (ctx) => authorizeInvocation(deps, ctx));
}

async function authorizeInvocation(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const { store } = deps;
  await deps.auth.authorize(req, "internal:invocation-auth");
  const body = parseBody(invocationAuthSchema, await readJsonBody(deps, req));
  const key = await deps.auth.apiKeyPrincipal(body.apiKey);
  requireScope(key, "invoke_function");
  // a function of another account (not shared with the key's), or outside the key's policies,
  // is not found, as one that does not exist
  const versions = await deps.auth
    .reachOf(key, key.account)
    .functionVersions("invoke_function", body.functionId);
  const deployments = new Map(
    (await store.listDeployments())
      .filter((d) => d.functionId === body.functionId)
      .map((d) => [d.versionId, d]),
  );
  let candidates = versions.filter((v) => deployments.has(v.versionId));
  if (body.functionVersionId !== undefined) {
    const v = versions.find((x) => x.versionId === body.functionVersionId);
    if (!v)
      throw new CallplaneError(
        "VERSION_NOT_FOUND",
        `function ${body.functionId} has no version ${body.functionVersionId}`,
      );
    candidates = candidates.filter((x) => x.versionId === body.functionVersionId);
    if (candidates.length === 0) {
      throw new CallplaneError(
        "FUNCTION_NOT_DEPLOYED",
        `version ${body.functionVersionId} of function ${body.functionId} is not deployed; deploy it with \`callplane deploy create\``,
      );
    }
  }
  if (candidates.length === 0) {
    throw new CallplaneError(
      "FUNCTION_NOT_DEPLOYED",
      `function ${body.functionId} has no deployed version; deploy one with \`callplane deploy create\``,
    );
  }
  // on first invocation at the latest (remembered per process, so this costs nothing after)
  await Promise.all(candidates.map((v) => deps.trust.ensureQueueSoft(v.versionId)));
  sendJson(res, 200, {
    functionId: body.functionId,
    functionName: versions[0].name,
    ncaId: versions[0].ncaId,
    clientNcaId: key.account,
    subject: key.subject,
    keyId: key.keyId,
    keyExpiresAt: key.expiresAt.toISOString(),
    functionVersions: candidates.map((v) => ({
      functionVersionId: v.versionId,
      defaultInvocationPath: v.spec.inferenceUrl,
      functionType: v.spec.functionType,
      maxRequestConcurrency: deployments.get(v.versionId)!.specs[0].maxRequestConcurrency,
    })),
  });
}
