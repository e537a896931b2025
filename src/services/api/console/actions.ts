// The console's actions, confirmed on the server: the first POST answers a page saying exactly
// what will happen, with a form that repeats the fields plus confirmed=1; the second applies it
// through the same store and worker-trust calls the API's own routes make (POST, PUT and DELETE on
// a deployment, the revoke of an instance's identity), writes the audit log, and sends the browser
// back to the function's page.
import { randomUUID } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { CallplaneError } from "../../../lib/errors.js";
import { checkInstanceTypes } from "../instance-types.js";
import { deployVersion } from "../routes/deployments.js";
import { deploymentSchema, parseBody } from "../schemas.js";
import type { AuditAction, AuditRecord } from "../store/types.js";
import { actorOf, type ConsoleAdmin } from "./auth.js";
import type { ConsoleDeps } from "./context.js";
import { recordAudit } from "./audit.js";
import { loadFunction } from "./functions.js";
import { html, type Html } from "./html.js";

/** What a form posted, as strings. */
export type Fields = URLSearchParams;

/** The largest form the console reads: its fields are ids and small numbers (a token at login). */
export const MAX_FORM_BYTES = 16 * 1024;

export async function readForm(req: IncomingMessage): Promise<Fields> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req as AsyncIterable<Buffer>) {
    size += c.length;
    if (size > MAX_FORM_BYTES)
      throw new CallplaneError("BODY_TOO_LARGE", `a console form is at most ${MAX_FORM_BYTES} bytes`);
    chunks.push(c);
  }
  return new URLSearchParams(Buffer.concat(chunks).toString("utf8"));
}

function field(f: Fields, name: string): string {
  const v = f.get(name);
  if (v === null || v === "")
    throw new CallplaneError("VALIDATION_FAILED", `${name}: the form must send it`, {
      extra: { errors: [{ field: name, message: "missing" }] },
    });
  return v;
}

function count(f: Fields, name: string): number {
  const raw = field(f, name);
  const n = Number(raw);
  if (!/^\d{1,6}$/.test(raw) || !Number.isSafeInteger(n))
    throw new CallplaneError("VALIDATION_FAILED", `${name}: "${raw.slice(0, 20)}" is not a whole number`, {
      extra: { errors: [{ field: name, message: "must be a whole number" }] },
    });
  return n;
}

export type ActionName = AuditAction;

export function isAction(name: string): name is ActionName {
  return name === "deploy" || name === "scale" || name === "undeploy" || name === "revoke-identity";
}

/** What an action will do, checked against the store; `apply` does it and says what to audit. */
interface Plan {
  functionId: string;
  /** One sentence: exactly what will happen. */
  says: Html;
  /** The fields the confirm form repeats. */
  fields: Record<string, string>;
  button: string;
  apply(): Promise<{ target: string; detail: Record<string, unknown> }>;
}

/** The deployment an action names (functionId, versionId), with its function's versions. */
async function deploymentOf(c: ConsoleDeps, f: Fields) {
  const functionId = field(f, "functionId");
  const versionId = field(f, "versionId");
  const versions = await loadFunction(c, functionId);
  const d = await c.api.store.getDeployment(functionId, versionId);
  if (!d)
    throw new CallplaneError(
      "DEPLOYMENT_NOT_FOUND",
      `version ${versionId.slice(0, 64)} of ${versions[0].name} is not deployed`,
    );
  return { functionId, versionId, versions, d };
}

async function planScale(c: ConsoleDeps, f: Fields): Promise<Plan> {
  const min = count(f, "minInstances");
  const max = count(f, "maxInstances");
  const { functionId, versionId, versions, d } = await deploymentOf(c, f);
  // the API's own rules for a deployment (min ≤ max, the limits) apply to a scale from here too
  const specs = parseBody(deploymentSchema, {
    deploymentSpecifications: d.specs.map((s) => ({ ...s, minInstances: min, maxInstances: max })),
  }).deploymentSpecifications;
  const before = d.specs.map((s) => ({ minInstances: s.minInstances, maxInstances: s.maxInstances }));
  return {
    functionId,
    says: html`Scale the deployment of version <span class="id">${versionId}</span> of
      <strong>${versions[0].name}</strong> from
      ${before.map((b) => `${b.minInstances}–${b.maxInstances}`).join(", ")} to
      <strong>${min}–${max}</strong>
      instances${d.specs.length > 1 ? ` (each of its ${d.specs.length} specifications)` : ""}.`,
    fields: { functionId, versionId, minInstances: String(min), maxInstances: String(max) },
    button: "Scale",
    async apply() {
      const now = new Date().toISOString();
      if (!(await c.api.store.updateDeployment(functionId, versionId, specs, now)))
        throw new CallplaneError("DEPLOYMENT_NOT_FOUND", `version ${versionId} is no longer deployed`);
      c.api.logger.info({ deploymentId: d.deploymentId }, "deployment updated");
      return {
        target: `${functionId}/${versionId}`,
        detail: {
          function: versions[0].name,
          deploymentId: d.deploymentId,
          before,
          after: { minInstances: min, maxInstances: max },
        },
      };
    },
  };
}

/** The deploy form's instance type: a [gpu, name] pair as JSON (names may hold any safe character). */
function instanceTypeOf(f: Fields): { gpu: string; instanceType: string } {
  const raw = field(f, "instanceType");
  let pair: unknown;
  try {
    pair = JSON.parse(raw);
  } catch {
    pair = undefined;
  }
  if (!Array.isArray(pair) || pair.length !== 2 || !pair.every((p) => typeof p === "string"))
    throw new CallplaneError(
      "VALIDATION_FAILED",
      `instanceType: "${raw.slice(0, 40)}" is not one of the form's choices; pick an instance type from the list`,
      { extra: { errors: [{ field: "instanceType", message: "not one of the offered instance types" }] } },
    );
  return { gpu: pair[0], instanceType: pair[1] };
}

async function planDeploy(c: ConsoleDeps, f: Fields): Promise<Plan> {
  const functionId = field(f, "functionId");
  const versionId = field(f, "versionId");
  const { gpu, instanceType } = instanceTypeOf(f);
  const min = count(f, "minInstances");
  const max = count(f, "maxInstances");
  const concurrency = f.get("maxRequestConcurrency") ? count(f, "maxRequestConcurrency") : 1;
  const versions = await loadFunction(c, functionId);
  const v = versions.find((x) => x.versionId === versionId);
  if (!v)
    throw new CallplaneError(
      "VERSION_NOT_FOUND",
      `${versions[0].name} has no version ${versionId.slice(0, 64)}; pick one on the function's page`,
    );
  if (await c.api.store.getDeployment(functionId, versionId))
    throw new CallplaneError(
      "DEPLOYMENT_EXISTS",
      `version ${versionId} of ${v.name} is deployed already; scale it on the function's page instead`,
    );
  // the API's own rules for a deployment, and a type some cluster offers, checked before confirming
  const specs = parseBody(deploymentSchema, {
    deploymentSpecifications: [
      { gpu, instanceType, minInstances: min, maxInstances: max, maxRequestConcurrency: concurrency },
    ],
  }).deploymentSpecifications;
  await checkInstanceTypes(c.api.store, c.api.compute, specs);
  return {
    functionId,
    says: html`Deploy version <span class="id">${versionId}</span> of <strong>${v.name}</strong> on
      <strong>${gpu}/${instanceType}</strong> with <strong>${min}–${max}</strong> instances, each taking up to
      ${concurrency} requests at once: the compute agent starts its instances, and invocations of this version
      are taken from then on.`,
    fields: {
      functionId,
      versionId,
      instanceType: JSON.stringify([gpu, instanceType]),
      minInstances: String(min),
      maxInstances: String(max),
      maxRequestConcurrency: String(concurrency),
    },
    button: "Deploy",
    async apply() {
      const d = await deployVersion(c.api, v, specs);
      return {
        target: `${functionId}/${versionId}`,
        detail: {
          function: v.name,
          deploymentId: d.deploymentId,
          gpu,
          instanceType,
          minInstances: min,
          maxInstances: max,
          maxRequestConcurrency: concurrency,
        },
      };
    },
  };
}

async function planUndeploy(c: ConsoleDeps, f: Fields): Promise<Plan> {
  const { functionId, versionId, versions, d } = await deploymentOf(c, f);
  const live = (await c.api.store.listInstances(versionId)).filter((i) => i.status !== "TERMINATED").length;
  return {
    functionId,
    says: html`Undeploy version <span class="id">${versionId}</span> of <strong>${versions[0].name}</strong>:
      its deployment is deleted, the compute agent stops its ${live} live instances, and invocations of this
      version fail from then on.`,
    fields: { functionId, versionId },
    button: "Undeploy",
    async apply() {
      if (!(await c.api.store.deleteDeployment(functionId, versionId)))
        throw new CallplaneError("DEPLOYMENT_NOT_FOUND", `version ${versionId} is no longer deployed`);
      c.api.logger.info({ deploymentId: d.deploymentId }, "deployment deleted");
      return {
        target: `${functionId}/${versionId}`,
        detail: { function: versions[0].name, deploymentId: d.deploymentId, liveInstances: live },
      };
    },
  };
}

async function planRevoke(c: ConsoleDeps, f: Fields, actor: string): Promise<Plan> {
  const functionId = field(f, "functionId");
  const instanceId = field(f, "instanceId");
  const versions = await loadFunction(c, functionId);
  const id = await c.api.trust.identities.get(instanceId);
  if (!id || id.functionId !== functionId)
    throw new CallplaneError(
      "IDENTITY_NOT_FOUND",
      `no identity was issued by this API for instance ${instanceId.slice(0, 64)} of ${versions[0].name} (a Kubernetes pod's identity is its cluster's: stop the pod instead)`,
    );
  return {
    functionId,
    says: html`Revoke the worker identity of instance <span class="id">${instanceId}</span> of
      <strong>${versions[0].name}</strong>${id.status === "REVOKED" ? " (it is revoked already)" : ""}: its
      token is refused from now on, its NATS connections are closed, and it gets no new token.`,
    fields: { functionId, instanceId },
    button: "Revoke identity",
    async apply() {
      const revoked = await c.api.trust.revoke(instanceId, `revoked in the console by ${actor}`);
      return { target: instanceId, detail: { function: versions[0].name, functionId, revokedNow: revoked } };
    },
  };
}

export async function plan(
  c: ConsoleDeps,
  action: ActionName,
  f: Fields,
  admin: ConsoleAdmin,
): Promise<Plan> {
  switch (action) {
    case "deploy":
      return planDeploy(c, f);
    case "scale":
      return planScale(c, f);
    case "undeploy":
      return planUndeploy(c, f);
    case "revoke-identity":
      return planRevoke(c, f, actorOf(admin));
  }
}

export function confirmBody(action: ActionName, p: Plan): Html {
  // what takes something away is red
  const danger = action === "undeploy" || action === "revoke-identity";
  return html`<p class="confirm" id="confirm-what">${p.says}</p>
    <form method="post" action="/console/actions/${action}" class="inline">
      ${Object.entries(p.fields).map(
        ([k, v]) => html`<input type="hidden" name="${k}" value="${v}" /> `,
      )}<input type="hidden" name="confirmed" value="1" />
      <button id="confirm" type="submit" ${danger ? html` class="danger"` : ""}>${p.button}</button>
      <a href="/console/functions/${p.functionId}">Cancel</a>
    </form>`;
}

/** Applies a confirmed action and records it; returns where to send the browser. */
export async function applyAction(
  c: ConsoleDeps,
  action: ActionName,
  p: Plan,
  admin: ConsoleAdmin,
): Promise<string> {
  const done = await p.apply();
  const entry: AuditRecord = {
    id: randomUUID(),
    at: new Date().toISOString(),
    subject: admin.subject,
    tokenId: admin.tokenId || undefined,
    action,
    target: done.target,
    detail: done.detail,
  };
  await recordAudit(c.api, entry);
  c.api.logger.info(
    { action, target: entry.target, subject: entry.subject, tokenId: entry.tokenId },
    "console action",
  );
  return `/console/functions/${p.functionId}`;
}
