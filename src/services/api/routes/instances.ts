// Instance status reports (internal): the compute agent reports the instances it runs; the report
// replaces the reporter's previous one, and the instances that went have their identities revoked.
import { z } from "zod";
import type { RequestContext, Router } from "../../../lib/http/index.js";
import { parseBody } from "../schemas.js";
import { readJsonBody, type ApiDeps } from "./deps.js";

const instanceReportSchema = z.strictObject({
  reporter: z.string().min(1).max(128),
  instances: z.array(
    z.strictObject({
      instanceId: z.string().min(1).max(128),
      deploymentId: z.string(),
      functionId: z.string(),
      versionId: z.string(),
      status: z.enum(["STARTING", "ACTIVE", "ERRORED", "TERMINATED"]),
      instanceType: z.string(),
      gpu: z.string(),
      backend: z.string(),
      location: z.string(),
      message: z.string().max(2048).optional(),
      /** The worker identifier, while the instance is active (the seed PR's WorkerAuth). */
      workerAuth: z.strictObject({ workerIdentifier: z.string().max(256) }).optional(),
      createdAt: z.string(),
      updatedAt: z.string(),
    }),
  ),
});

export function addInstanceRoutes(router: Router, deps: ApiDeps): void {
  router.add("PUT", "/v1/internal/instances", (ctx) => reportInstances(deps, ctx));
}

async function reportInstances(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  await deps.auth.authorize(req, "internal:instances");
  const body = parseBody(instanceReportSchema, await readJsonBody(deps, req));
  await deps.store.reportInstances(
    body.reporter,
    body.instances.map(({ workerAuth: _w, ...i }) => i),
  );
  await deps.trust.onReport(body.reporter, body.instances);
  res.writeHead(204).end();
}
