// Instance status reports (internal): the compute agent reports the instances it runs; the report
// replaces the reporter's previous one, and the instances that ended have their identities revoked
// and their workers' NATS connections closed.
// Each live instance's worker identity is kept with it (Store.workerAuthOf), never a token.
import { z } from "zod";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { CallplaneError } from "../../../lib/errors.js";
import { CLUSTER_REPORTER_PREFIX } from "../pod-tokens.js";
import { parseBody, safeText } from "../schemas.js";
import type { WorkerAuth } from "../store/types.js";
import { readJsonBody, type ApiDeps } from "./deps.js";

/**
 * Who an instance's worker is: the local backend's identity id (`{workerIdentifier}`), or NVCA's
 * WorkerAuth (the Kubernetes backend): the pod's service account (`sub`, `saUid`) and the pod
 * (`workerIdentifiers`, NVCA sends the one pod), against which the pod's projected token is checked.
 * One object with every field optional, checked after, so that a mistake is named by its field
 * (a union would report only that neither shape matched).
 */
const workerAuthSchema = z
  .strictObject({
    workerIdentifier: z.string().max(256).optional(),
    // system:serviceaccount:<namespace, ≤ 63>:<account, ≤ 253>
    sub: safeText.min(1).max(512).optional(),
    saUid: safeText.min(1).max(128).optional(),
    workerIdentifiers: z
      .array(z.strictObject({ name: safeText.min(1).max(253), uid: safeText.min(1).max(128) }))
      .min(1)
      .max(16)
      .optional(),
  })
  .superRefine((w, ctx) => {
    const podFields = (["sub", "saUid", "workerIdentifiers"] as const).filter((k) => w[k] !== undefined);
    if (w.workerIdentifier !== undefined) {
      for (const k of podFields)
        ctx.addIssue({ code: "custom", path: [k], message: "not allowed beside workerIdentifier" });
    } else {
      for (const k of ["sub", "saUid", "workerIdentifiers"] as const)
        if (w[k] === undefined)
          ctx.addIssue({
            code: "custom",
            path: [k],
            message: "required: give workerIdentifier, or sub, saUid and workerIdentifiers",
          });
    }
  })
  .transform((w): WorkerAuth =>
    w.workerIdentifier !== undefined
      ? { workerIdentifier: w.workerIdentifier }
      : { sub: w.sub!, saUid: w.saUid!, workerIdentifiers: w.workerIdentifiers! },
  );

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
      /** Who the worker is, while the instance lives (the seed PR's WorkerAuth). */
      workerAuth: workerAuthSchema.optional(),
      createdAt: z.string(),
      updatedAt: z.string(),
    }),
  ),
});

export function addInstanceRoutes(router: Router, deps: ApiDeps): void {
  router.add("PUT", "/v1/internal/instances", (ctx) => reportInstances(deps, ctx));
}

/** The proof header of a report: the agent's own projected token(s), comma-separated (a JWT has no comma). */
export const CLUSTER_PROOF_HEADER = "x-callplane-cluster-proof";

/**
 * Every cluster's agent holds the same compute service token, so the reporter name alone does not
 * say which cluster speaks: a report as an enrolled cluster's agent (kubernetes-<clusterId>) must
 * carry that agent's proof, or another agent could rewrite (or empty) its instances and so refuse
 * its workers.
 */
async function checkReporter(deps: ApiDeps, req: RequestContext["req"], reporter: string): Promise<void> {
  if (!reporter.startsWith(CLUSTER_REPORTER_PREFIX)) return;
  const clusterId = reporter.slice(CLUSTER_REPORTER_PREFIX.length);
  const keys = await deps.store.clusterKeys(clusterId);
  if (!keys) return; // not enrolled: no token of its workers verifies anyway
  const header = req.headers[CLUSTER_PROOF_HEADER];
  const proofs = (Array.isArray(header) ? header.join(",") : (header ?? ""))
    .split(",")
    .map((x) => x.trim())
    .filter(Boolean)
    .slice(0, 2);
  const proof = await deps.trust.podTokens.proveCluster(keys, proofs);
  if (!proof.ok)
    throw new CallplaneError(
      "CLUSTER_PROOF_REFUSED",
      `a report as ${reporter} must prove it comes from cluster ${clusterId}'s compute agent (its projected token in ${CLUSTER_PROOF_HEADER}): ${proof.reasons.join("; ")}`,
    );
}

async function reportInstances(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  await deps.auth.authorize(req, "internal:instances");
  const body = parseBody(instanceReportSchema, await readJsonBody(deps, req));
  await checkReporter(deps, req, body.reporter);
  // a terminated instance's worker identity is dropped, as ICMS deletes it on a terminal update:
  // nothing may be checked against an instance that no longer runs
  const { refused, ended } = await deps.store.reportInstances(
    body.reporter,
    body.instances.map(({ workerAuth, ...i }) => ({
      ...i,
      workerAuth: i.status === "TERMINATED" ? undefined : workerAuth,
    })),
  );
  if (refused.length)
    deps.logger.warn(
      { reporter: body.reporter, instanceIds: refused },
      "a status report named instances another compute agent reports: they were left as that agent reported them",
    );
  await deps.trust.onReport(
    body.instances.filter((i) => !refused.includes(i.instanceId)),
    ended,
  );
  if (refused.length)
    sendJson(res, 200, {
      refused: refused.map((instanceId) => ({
        instanceId,
        reason: "another compute agent reports this instance; an agent reports only the instances it runs",
      })),
    });
  else res.writeHead(204).end();
}
