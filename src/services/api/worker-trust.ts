// The API's part in worker trust:
// - the work queues: the API creates each deployed version's stream and consumer (on deploy, on
//   the first invocation, and whenever the compute agent syncs), so that neither workers nor
//   invocation replicas need JetStream admin rights;
// - what workers get to reach NATS (nats.workerAuth): the shared worker nkey in nkey mode, their
//   account (NVCF_NATS_ACCOUNT) in token mode;
// - per-worker identity: signs each instance's identity token for the compute agent, refreshes it,
//   answers RFC 7662 introspection, revokes it when the instance is terminated and closes the NATS
//   connections that logged in with it;
// - the auth callout's webhook (POST /v2/nvcf/webhook/nats-auth): a worker token in, the user and
//   permissions of one function version out.
import type { IncomingMessage } from "node:http";
import type { NatsConnection } from "@nats-io/transport-node";
import { z } from "zod";
import { CallplaneError } from "../../lib/errors.js";
import { sendJson, type Router } from "../../lib/http.js";
import type { Logger } from "../../lib/log.js";
import {
  NATS_ACCOUNTS,
  tokenWorkerPermissions,
  type NatsAccess,
  type Permissions,
} from "../../lib/nats-auth.js";
import { closeConnections } from "../../lib/nats-admin.js";
import { WorkQueues, connectNats, drainOrClose, type QueueLimits } from "../../lib/queue.js";
import { workerIdentifier, type IdentitySigner, type VerifiedIdentity } from "../../lib/worker-identity.js";
import type { IdentityStore } from "./identity-store.js";
import { parseBody } from "./schemas.js";
import type { Store } from "./store/types.js";

export type WorkerAuthMode = "nkey" | "token";

export interface WorkerTrustOptions {
  region: string;
  queue: QueueLimits;
  /**
   * NATS for the queues (APP) and for closing revoked workers' connections (SYS); tests may leave it
   * out. `servers`: how many servers the cluster has (nats.cluster.size), each asked for the
   * connections it holds.
   */
  nats?: { app: NatsAccess; sys?: NatsAccess; servers?: number };
  workerAuth: WorkerAuthMode;
  /** nkey mode: the shared worker nkey seed (read when asked, so a rotation is picked up). */
  workerNkeySeed?: () => string;
  identity: { signer: IdentitySigner; store: IdentityStore };
}

interface Deps {
  store: Store;
  logger: Logger;
  authorize(req: IncomingMessage, scope: string): Promise<unknown>;
  readBody(req: IncomingMessage): Promise<Buffer>;
}

const identityRequestSchema = z.strictObject({
  functionId: z.string(),
  versionId: z.string(),
  deploymentId: z.string(),
});

const webhookSchema = z.object({
  account: z.string(),
  pluginName: z.string(),
  payload: z.string().max(16_384),
});

export type Introspection =
  | { active: false; reason: string; failure: "expired" | "invalid" | "revoked" }
  | ({ active: true } & VerifiedIdentity);

export function createWorkerTrust(opts: WorkerTrustOptions, deps: Deps) {
  const { logger, store } = deps;
  const { signer, store: identities } = opts.identity;
  let app: NatsConnection | undefined;
  let sys: NatsConnection | undefined;
  let queues: WorkQueues | undefined;
  const lastReport = new Map<string, Set<string>>();

  async function ensureQueue(fvid: string): Promise<void> {
    if (!queues) return;
    await queues.ensure(fvid);
  }

  /** Creates the queue if it can; a failure is logged (the next sync or invocation tries again). */
  function ensureQueueSoft(fvid: string): Promise<void> {
    return ensureQueue(fvid).catch((err: unknown) =>
      logger.warn({ versionId: fvid, err: (err as Error).message }, "could not create the work queue"),
    );
  }

  async function introspect(token: string): Promise<Introspection> {
    const v = await signer.verify(token);
    if ("failure" in v)
      return { active: false, failure: v.failure === "expired" ? "expired" : "invalid", reason: v.reason };
    const rec = await identities.get(v.instanceId);
    if (!rec)
      return { active: false, failure: "invalid", reason: "no identity was issued for this instance" };
    if (rec.status === "REVOKED")
      return {
        active: false,
        failure: "revoked",
        reason: `the identity of instance ${v.instanceId} was revoked at ${rec.revokedAt} (${rec.revokedWhy ?? "revoked"})`,
      };
    if (rec.versionId !== v.functionVersionId)
      return {
        active: false,
        failure: "invalid",
        reason: "the token names another version than its instance",
      };
    return { active: true, ...v };
  }

  /** The NATS user of a worker with its own identity: named after its version, plus the instance. */
  const workerUser = (fvid: string, instanceId: string) => `worker-${fvid}.${instanceId}`;

  /** Closes every NATS connection that logged in with this instance's identity (token mode), on every server. */
  async function kick(instanceId: string): Promise<number> {
    if (!sys) return 0;
    const r = await closeConnections(sys, (u) => u.startsWith("worker-") && u.endsWith(`.${instanceId}`), {
      servers: opts.nats?.servers ?? 1,
    });
    if (r.servers.length < r.expected)
      logger.warn(
        {
          instanceId,
          answered: r.servers.map((s) => s.name),
          expected: r.expected,
          natsConnectionsClosed: r.closed,
        },
        "not every NATS server answered: a connection the revoked worker holds on a server that did not answer ends when its user JWT expires",
      );
    return r.closed;
  }

  async function revoke(instanceId: string, why: string): Promise<boolean> {
    const was = await identities.revoke(instanceId, why, new Date().toISOString());
    if (was) {
      const kicked = await kick(instanceId).catch((err: unknown) => {
        logger.warn(
          { instanceId, err: (err as Error).message },
          "could not close the revoked worker's NATS connections; they end when their user JWT expires",
        );
        return 0;
      });
      logger.info({ instanceId, why, natsConnectionsClosed: kicked }, "worker identity revoked");
    }
    return was;
  }

  function permissionsDto(p: Permissions) {
    return {
      publish: { allow: p.publish.allow, deny: p.publish.deny ?? [] },
      subscribe: { allow: p.subscribe.allow, deny: p.subscribe.deny ?? [] },
      ...(p.allowResponses ? { response: { maxMsgs: 1 } } : {}),
    };
  }

  function mount(router: Router): void {
    router.add("PUT", "/v1/internal/work-queues/:fvid", async ({ req, res, params }) => {
      await deps.authorize(req, "internal:invocation-auth");
      const deployed = (await store.listDeployments()).some((d) => d.versionId === params.fvid);
      if (!deployed)
        throw new CallplaneError("FUNCTION_NOT_DEPLOYED", `version ${params.fvid} is not deployed`);
      queues?.forget(params.fvid);
      await ensureQueue(params.fvid).catch((err: unknown) => {
        throw new CallplaneError(
          "UNAVAILABLE",
          "NATS JetStream did not create the work queue; retry shortly",
          {
            cause: err,
          },
        );
      });
      res.writeHead(204).end();
    });

    router.add("POST", "/v1/internal/instances/:iid/identity", async ({ req, res, params }) => {
      await deps.authorize(req, "internal:identities");
      const body = parseBody(
        identityRequestSchema,
        JSON.parse((await deps.readBody(req)).toString() || "null"),
      );
      const d = await store.getDeploymentById(body.deploymentId).catch(() => undefined);
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
      logger.debug({ instanceId: params.iid, expiresAt: signed.expiresAt }, "worker identity issued");
      sendJson(res, 200, {
        token: signed.token,
        expiresAt: new Date(signed.expiresAt * 1000).toISOString(),
        expiresIn: signer.ttlSeconds,
        audience: signer.audience,
        workerIdentifier: workerIdentifier(params.iid),
        tokenSource: "api",
      });
    });

    router.add("GET", "/v1/internal/instances/:iid/identity", async ({ req, res, params }) => {
      await deps.authorize(req, "internal:identities");
      const r = await identities.get(params.iid);
      if (!r)
        throw new CallplaneError("IDENTITY_NOT_FOUND", `no identity was issued for instance ${params.iid}`);
      sendJson(res, 200, r);
    });

    router.add("DELETE", "/v1/internal/instances/:iid/identity", async ({ req, res, params }) => {
      await deps.authorize(req, "internal:identities");
      const r = await identities.get(params.iid);
      if (!r)
        throw new CallplaneError("IDENTITY_NOT_FOUND", `no identity was issued for instance ${params.iid}`);
      const revoked = await revoke(params.iid, "provisioning undone by the compute agent");
      sendJson(res, 200, { instanceId: params.iid, revoked, status: "REVOKED" });
    });

    // RFC 7662: the token as a form field (or JSON); the caller authenticates (a service token)
    router.add("POST", "/v1/workers/tokens/introspect", async ({ req, res }) => {
      await deps.authorize(req, "internal:introspect");
      const raw = (await deps.readBody(req)).toString("utf8");
      const token = /^\s*\{/.test(raw)
        ? (JSON.parse(raw) as { token?: unknown }).token
        : new URLSearchParams(raw).get("token");
      if (typeof token !== "string" || !token)
        throw new CallplaneError(
          "VALIDATION_FAILED",
          "token: send the token to introspect (form field token)",
        );
      const r = await introspect(token);
      if (!r.active) {
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
        token_type: "worker_identity",
        instance_id: r.instanceId,
        worker_id: workerIdentifier(r.instanceId),
        function_id: r.functionId,
        function_version_id: r.functionVersionId,
        deployment_id: r.deploymentId,
      });
    });

    router.add("POST", "/v2/nvcf/webhook/nats-auth", async ({ req, res }) => {
      await deps.authorize(req, "internal:nats-auth");
      const body = parseBody(webhookSchema, JSON.parse((await deps.readBody(req)).toString() || "null"));
      if (opts.workerAuth !== "token")
        throw new CallplaneError(
          "WORKER_AUTH_MODE_OFF",
          "nats.workerAuth is nkey: workers authenticate with the shared worker nkey, not with tokens; set nats.workerAuth: token to accept worker tokens",
        );
      if (body.account !== NATS_ACCOUNTS.app || body.pluginName !== "webhook")
        throw new CallplaneError(
          "NATS_ACCOUNT_REFUSED",
          `workers log in to account ${NATS_ACCOUNTS.app} with plugin webhook, not account ${body.account} with plugin ${body.pluginName}; the worker must read NVCF_NATS_ACCOUNT`,
        );
      const r = await introspect(body.payload);
      if (!r.active) {
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
        permissions: permissionsDto(tokenWorkerPermissions(opts.region, r.functionVersionId, r.instanceId)),
      });
    });
  }

  return {
    mount,
    ensureQueueSoft,
    revoke,
    /** What the compute agent hands every worker it starts to reach NATS, by mode. */
    workerNatsEnv(): { workerAuth: WorkerAuthMode; env: Record<string, string> } {
      if (opts.workerAuth === "token")
        return { workerAuth: "token", env: { NVCF_NATS_ACCOUNT: NATS_ACCOUNTS.app } };
      const seed = opts.workerNkeySeed?.();
      return { workerAuth: "nkey", env: seed ? { NKEY_SEED: seed } : {} };
    },
    /**
     * An instance report replaces the reporter's previous one: instances it reports TERMINATED,
     * and those it no longer reports, are gone, and their identities are revoked.
     */
    async onReport(reporter: string, after: Array<{ instanceId: string; status: string }>) {
      const before = lastReport.get(reporter) ?? new Set<string>();
      const live = new Set(after.filter((i) => i.status !== "TERMINATED").map((i) => i.instanceId));
      lastReport.set(reporter, live);
      const gone = new Set([...before, ...after.map((i) => i.instanceId)].filter((id) => !live.has(id)));
      for (const id of gone) await revoke(id, "instance terminated");
    },
    async start(): Promise<void> {
      if (!opts.nats) return;
      app = await connectNats(opts.nats.app, "api", logger);
      queues = new WorkQueues(app, opts.region, opts.queue);
      if (opts.nats.sys) sys = await connectNats(opts.nats.sys, "api-revoker", logger);
    },
    async close(): Promise<void> {
      await Promise.all([drainOrClose(app), drainOrClose(sys)]);
    },
    destroy(): void {
      void app?.close();
      void sys?.close();
    },
  };
}

export type WorkerTrust = ReturnType<typeof createWorkerTrust>;
