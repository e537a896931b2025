// The control-plane API: functions, versions, deployments, API keys, and the internal endpoints
// that callplane's own services use (invocation auth, desired deployments, instance reports).
import { randomUUID } from "node:crypto";
import type { IncomingMessage } from "node:http";
import {
  ADMIN_ISSUER,
  API_KEY_DEFAULT_SCOPES,
  SERVICE_SCOPES,
  STACK_ADMIN_ISSUER,
  constantTimeEqualHex,
  createAdminTokenVerifier,
  looksLikeJwt,
  newApiKey,
  requireScope,
  sha256Hex,
  type Principal,
  type ServiceName,
} from "../../lib/auth.js";
import { CallplaneError } from "../../lib/errors.js";
import {
  Router,
  bearerToken,
  createHttpService,
  readJson,
  sendJson,
  type HttpService,
} from "../../lib/http.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { createRegistry, type Registry } from "../../lib/metrics.js";
import type { HostPort } from "../../lib/net.js";
import { addSecretRoutes, checkVersionLimit } from "./secrets/routes.js";
import type { SecretStore, SecretValue } from "./secrets/store.js";
import {
  createFunctionSchema,
  createKeySchema,
  deploymentSchema,
  parseBody,
  updateFunctionSchema,
  type CreateFunctionBody,
} from "./schemas.js";
import {
  NameTakenError,
  type ApiKeyRecord,
  type DeploymentRecord,
  type FunctionSpec,
  type FunctionVersionRecord,
  type InstanceRecord,
  type Store,
} from "./store/types.js";
import { z } from "zod";
import { createWorkerTrust, type WorkerTrustOptions } from "./worker-trust.js";

export interface ApiServiceOptions {
  listen: HostPort;
  store: Store;
  /** The stack's admin key (auth.adminPublicKeyFile): tokens with `iss` callplane-admin. */
  adminPublicKeyPem: string;
  /**
   * The admin token issuer's own key (adminIssuerProxy.publicKeyFile), given only while the issuer
   * is enabled: without it, tokens the issuer signed (`iss` callplane-admin-issuer) are refused.
   */
  adminIssuerPublicKeyPem?: string | undefined;
  /** What `GET /v1/info` says about the issuer (adminIssuerProxy.enabled, .gateway.enabled). */
  adminIssuer?: { enabled: boolean; gatewayEnabled: boolean };
  /** The envelope-encrypted secret store; without it, secret endpoints answer 503. */
  secrets?: SecretStore | undefined;
  /** Token values of callplane's own services, by service. */
  serviceTokens: Partial<Record<ServiceName, string>>;
  maxBodyBytes?: number;
  /** Work queues, worker NATS credentials, worker identity, the NATS auth webhook. */
  workerTrust: WorkerTrustOptions;
  ncaId?: string;
  logger?: Logger;
  registry?: Registry;
}

export interface ApiService {
  listen(): Promise<URL>;
  close(graceMs?: number): Promise<void>;
  destroy(): void;
  readonly http: HttpService;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function checkUuid(
  value: string,
  what: "FUNCTION_NOT_FOUND" | "VERSION_NOT_FOUND" | "DEPLOYMENT_NOT_FOUND" | "KEY_NOT_FOUND",
  label: string,
): void {
  if (!UUID.test(value)) throw new CallplaneError(what, `${label} "${value}" is not a UUID`);
}

function functionStatus(deployment: DeploymentRecord | undefined, instances: InstanceRecord[]): string {
  if (!deployment) return "INACTIVE";
  const live = instances.filter((i) => i.status !== "TERMINATED");
  if (live.some((i) => i.status === "ACTIVE")) return "ACTIVE";
  if (live.length > 0 && live.every((i) => i.status === "ERRORED")) return "ERROR";
  return "DEPLOYING";
}

function instanceDto(i: InstanceRecord) {
  return {
    instanceId: i.instanceId,
    functionId: i.functionId,
    functionVersionId: i.versionId,
    instanceType: i.instanceType,
    instanceStatus: i.status,
    gpu: i.gpu,
    backend: i.backend,
    location: i.location,
    ...(i.message ? { message: i.message } : {}),
    instanceCreatedAt: i.createdAt,
    instanceUpdatedAt: i.updatedAt,
  };
}

function functionDto(
  v: FunctionVersionRecord,
  deployment: DeploymentRecord | undefined,
  instances: InstanceRecord[],
  secretNames: string[] = [],
) {
  const s = v.spec;
  return {
    id: v.functionId,
    versionId: v.versionId,
    ncaId: v.ncaId,
    name: v.name,
    status: functionStatus(deployment, instances),
    inferenceUrl: s.inferenceUrl,
    inferencePort: s.inferencePort,
    health: s.health,
    healthUri: s.health.uri,
    containerImage: s.containerImage,
    ...(s.containerArgs !== undefined ? { containerArgs: s.containerArgs } : {}),
    containerEnvironment: s.containerEnvironment,
    apiBodyFormat: s.apiBodyFormat,
    functionType: s.functionType,
    tags: s.tags,
    ...(s.description !== undefined ? { description: s.description } : {}),
    createdAt: v.createdAt,
    activeInstances: instances.filter((i) => i.status !== "TERMINATED").map(instanceDto),
    // names only, as NVCF's FunctionDto: values never leave the secret store here
    secrets: secretNames,
  };
}

function specFromBody(b: Omit<CreateFunctionBody, "name">): FunctionSpec {
  const health = b.health ?? {
    protocol: "HTTP" as const,
    uri: b.healthUri ?? "/v2/health/ready",
    timeout: "PT10S",
    expectedStatusCode: 200,
  };
  return {
    inferenceUrl: b.inferenceUrl,
    inferencePort: b.inferencePort,
    health: { ...health, port: health.port ?? b.inferencePort },
    containerImage: b.containerImage,
    containerArgs: b.containerArgs,
    containerEnvironment: b.containerEnvironment,
    tags: b.tags,
    description: b.description,
    functionType: b.functionType,
    apiBodyFormat: b.apiBodyFormat,
  };
}

function keyDto(k: ApiKeyRecord, now = Date.now()) {
  const status = k.revokedAt ? "REVOKED" : Date.parse(k.expiresAt) <= now ? "EXPIRED" : "ACTIVE";
  return {
    id: k.keyId,
    status,
    owner_type: "USER",
    owner_id: k.ownerId,
    issuer_service_id: "callplane-api",
    audience_service_ids: ["callplane-api"],
    description: k.description,
    created_at: k.createdAt,
    expires_at: k.expiresAt,
    ...(k.revokedAt ? { revoked_at: k.revokedAt } : {}),
    authorizations: {
      policies: [
        {
          product: "nv-cloud-functions",
          resources: [{ id: "*", type: "account-functions" }],
          scopes: k.scopes,
        },
      ],
    },
  };
}

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

const invocationAuthSchema = z.strictObject({
  apiKey: z.string().min(1).max(4096),
  functionId: z.string(),
  functionVersionId: z.string().optional(),
});

export function createApiService(opts: ApiServiceOptions): ApiService {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("api");
  const { store } = opts;
  const limit = opts.maxBodyBytes ?? 1024 * 1024;
  const ncaId = opts.ncaId ?? "callplane";
  const serviceHashes = Object.entries(opts.serviceTokens).map(([name, token]) => ({
    name: name as ServiceName,
    hash: sha256Hex(token),
  }));
  const issuerOn = opts.adminIssuerPublicKeyPem !== undefined;
  const verifierPromise = createAdminTokenVerifier(
    [
      { issuer: STACK_ADMIN_ISSUER, publicKeyPem: opts.adminPublicKeyPem },
      ...(issuerOn ? [{ issuer: ADMIN_ISSUER, publicKeyPem: opts.adminIssuerPublicKeyPem! }] : []),
    ],
    issuerOn
      ? {}
      : {
          [ADMIN_ISSUER]:
            "this admin token comes from the admin token issuer, which is turned off (adminIssuerProxy.enabled: false), so the API no longer accepts its tokens; " +
            "use a token from your identity provider (CALLPLANE_TOKEN, or `token:` in the CLI config file), or mint one with `callplane admin token`",
        },
  );
  const secrets = opts.secrets;
  const secretStore = (): SecretStore => {
    if (!secrets) throw new CallplaneError("UNAVAILABLE", "this API runs without a secret store");
    return secrets;
  };
  // Avoid an unhandled rejection before the first request if the key is bad; listen() awaits it too.
  verifierPromise.catch(() => undefined);

  async function apiKeyPrincipal(token: string): Promise<Principal & { kind: "apikey" }> {
    const k = await store.getApiKeyByHash(sha256Hex(token));
    if (!k)
      throw new CallplaneError(
        "TOKEN_INVALID",
        "the API key is not known; create one with `callplane key create`",
      );
    if (k.revokedAt)
      throw new CallplaneError("TOKEN_INVALID", `the API key ${k.keyId} was revoked at ${k.revokedAt}`);
    if (Date.parse(k.expiresAt) <= Date.now())
      throw new CallplaneError("TOKEN_EXPIRED", `the API key ${k.keyId} expired at ${k.expiresAt}`);
    return {
      kind: "apikey",
      subject: k.ownerId,
      keyId: k.keyId,
      scopes: new Set(k.scopes),
      expiresAt: new Date(k.expiresAt),
    };
  }

  async function authenticate(req: IncomingMessage): Promise<Principal> {
    const token = bearerToken(req);
    if (token.startsWith("cps-")) {
      const h = sha256Hex(token);
      const svc = serviceHashes.find((s) => constantTimeEqualHex(s.hash, h));
      if (!svc) throw new CallplaneError("TOKEN_INVALID", "the service token is not known to this API");
      return { kind: "service", subject: svc.name, scopes: new Set(SERVICE_SCOPES[svc.name]) };
    }
    if (looksLikeJwt(token)) {
      const p = await (await verifierPromise).verify(token);
      // Internal scopes belong to callplane's own services only; a signed admin token that claims
      // one is still not a service.
      return { ...p, scopes: new Set([...p.scopes].filter((s) => !s.startsWith("internal:"))) };
    }
    return apiKeyPrincipal(token);
  }

  async function authorize(req: IncomingMessage, scope: string): Promise<Principal> {
    const p = await authenticate(req);
    requireScope(p, scope);
    return p;
  }

  async function requireAdmin(
    req: IncomingMessage,
    what = "managing API keys",
  ): Promise<Principal & { kind: "admin" }> {
    const p = await authenticate(req);
    if (p.kind !== "admin") {
      throw new CallplaneError(
        "FORBIDDEN_SCOPE",
        `${what} needs an admin token (from \`callplane init\` or the admin issuer), not an API key`,
        {
          extra: { requiredScope: "admin token" },
        },
      );
    }
    return p;
  }

  async function loadVersion(fid: string, vid: string): Promise<FunctionVersionRecord> {
    checkUuid(fid, "FUNCTION_NOT_FOUND", "function id");
    checkUuid(vid, "VERSION_NOT_FOUND", "version id");
    const v = await store.getVersion(fid, vid);
    if (v) return v;
    if (!(await store.functionExists(fid)))
      throw new CallplaneError("FUNCTION_NOT_FOUND", `no function with id ${fid}`);
    throw new CallplaneError("VERSION_NOT_FOUND", `function ${fid} has no version ${vid}`);
  }

  const secretNames = async (versionIds?: string[]) =>
    secrets ? await secrets.names(versionIds) : new Map<string, string[]>();

  async function versionDtos(versions: FunctionVersionRecord[]) {
    const [deployments, instances, names] = await Promise.all([
      store.listDeployments(),
      store.listInstances(),
      secretNames(versions.map((v) => v.versionId)),
    ]);
    const byVersion = new Map(deployments.map((d) => [d.versionId, d]));
    return versions.map((v) =>
      functionDto(
        v,
        byVersion.get(v.versionId),
        instances.filter((i) => i.versionId === v.versionId),
        names.get(v.versionId),
      ),
    );
  }

  async function oneDto(v: FunctionVersionRecord) {
    const [d, instances, names] = await Promise.all([
      store.getDeployment(v.functionId, v.versionId),
      store.listInstances(v.versionId),
      secretNames([v.versionId]),
    ]);
    return functionDto(v, d, instances, names.get(v.versionId));
  }

  /** Stores the secrets a create request carried; on failure, removes what the request created. */
  async function storeInitialSecrets(
    v: FunctionVersionRecord,
    list: Array<{ name: string; value: SecretValue }> | undefined,
    undo: () => Promise<unknown>,
  ): Promise<void> {
    if (!list?.length) return;
    try {
      const s = secretStore();
      await checkVersionLimit(s, v.versionId, list);
      await s.put(v, list);
    } catch (err) {
      await undo().catch((e: unknown) =>
        logger.error({ err: e, versionId: v.versionId }, "could not remove a version whose secrets failed"),
      );
      throw err;
    }
  }

  async function deploymentDto(d: DeploymentRecord) {
    const [v, instances] = await Promise.all([
      store.getVersion(d.functionId, d.versionId),
      store.listInstances(d.versionId),
    ]);
    return {
      deploymentId: d.deploymentId,
      functionId: d.functionId,
      functionVersionId: d.versionId,
      functionName: v?.name ?? "",
      ncaId,
      functionStatus: functionStatus(d, instances),
      healthInfo: instances
        .filter((i) => i.status === "ERRORED")
        .map((i) => ({
          gpu: i.gpu,
          backend: i.backend,
          instanceType: i.instanceType,
          error: i.message ?? "instance errored",
        })),
      deploymentSpecifications: d.specs,
      instances: instances.map(instanceDto),
      createdAt: d.createdAt,
      lastUpdatedAt: d.updatedAt,
    };
  }

  const router = new Router();
  const json = (req: IncomingMessage) => readJson(req, limit);
  const sensitiveJson = (req: IncomingMessage) => readJson(req, limit, { sensitive: true });
  const trust = createWorkerTrust(opts.workerTrust, {
    store,
    logger,
    authorize,
    async readBody(req) {
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const c of req as AsyncIterable<Buffer>) {
        size += c.length;
        if (size > limit)
          throw new CallplaneError("BODY_TOO_LARGE", `the body is larger than the limit of ${limit} bytes`);
        chunks.push(c);
      }
      return Buffer.concat(chunks);
    },
  });
  trust.mount(router);

  // ---- functions and versions (contract §5.1)
  router.add("POST", "/v2/nvcf/functions", async ({ req, res }) => {
    await authorize(req, "register_function");
    const body = parseBody(createFunctionSchema, await sensitiveJson(req));
    if (body.secrets?.length) secretStore();
    if (await store.getFunctionByName(body.name)) {
      throw new CallplaneError(
        "FUNCTION_NAME_TAKEN",
        `a function named "${body.name}" exists; add a version to it with POST /v2/nvcf/functions/{functionId}/versions, or pick another name`,
      );
    }
    const now = new Date().toISOString();
    const v: FunctionVersionRecord = {
      functionId: randomUUID(),
      versionId: randomUUID(),
      name: body.name,
      ncaId,
      spec: specFromBody(body),
      createdAt: now,
    };
    try {
      await store.createFunction(v);
    } catch (err) {
      // (another replica created the name between the check above and this write)
      if (err instanceof NameTakenError) {
        throw new CallplaneError("FUNCTION_NAME_TAKEN", `a function named "${body.name}" exists`);
      }
      throw err;
    }
    await storeInitialSecrets(v, body.secrets, () => store.deleteVersion(v.functionId, v.versionId));
    logger.info({ functionId: v.functionId, versionId: v.versionId, name: v.name }, "function created");
    sendJson(res, 200, { function: await oneDto(v) });
  });

  router.add("POST", "/v2/nvcf/functions/:fid/versions", async ({ req, res, params }) => {
    await authorize(req, "register_function");
    checkUuid(params.fid, "FUNCTION_NOT_FOUND", "function id");
    const body = parseBody(createFunctionSchema, await sensitiveJson(req));
    if (body.secrets?.length) secretStore();
    const existing = await store.listVersions(params.fid);
    if (existing.length === 0)
      throw new CallplaneError("FUNCTION_NOT_FOUND", `no function with id ${params.fid}`);
    if (existing[0].name !== body.name) {
      throw new CallplaneError(
        "VALIDATION_FAILED",
        `name: a new version keeps its function's name "${existing[0].name}"`,
        {
          extra: { errors: [{ field: "name", message: `must be "${existing[0].name}"` }] },
        },
      );
    }
    const v: FunctionVersionRecord = {
      functionId: params.fid,
      versionId: randomUUID(),
      name: body.name,
      ncaId,
      spec: specFromBody(body),
      createdAt: new Date().toISOString(),
    };
    await store.createVersion(v);
    await storeInitialSecrets(v, body.secrets, () => store.deleteVersion(v.functionId, v.versionId));
    logger.info({ functionId: v.functionId, versionId: v.versionId }, "function version created");
    sendJson(res, 200, { function: await oneDto(v) });
  });

  router.add("GET", "/v2/nvcf/functions", async ({ req, res }) => {
    await authorize(req, "list_functions");
    sendJson(res, 200, { functions: await versionDtos(await store.listVersions()) });
  });

  router.add("GET", "/v2/nvcf/functions/ids", async ({ req, res }) => {
    await authorize(req, "list_functions");
    const ids = [...new Set((await store.listVersions()).map((v) => v.functionId))];
    sendJson(res, 200, { functionIds: ids });
  });

  router.add("GET", "/v2/nvcf/functions/:fid/versions", async ({ req, res, params }) => {
    await authorize(req, "list_functions");
    checkUuid(params.fid, "FUNCTION_NOT_FOUND", "function id");
    const versions = await store.listVersions(params.fid);
    if (versions.length === 0)
      throw new CallplaneError("FUNCTION_NOT_FOUND", `no function with id ${params.fid}`);
    sendJson(res, 200, { functions: await versionDtos(versions) });
  });

  router.add("GET", "/v2/nvcf/functions/:fid/versions/:vid", async ({ req, res, params }) => {
    await authorize(req, "list_functions");
    sendJson(res, 200, { function: await oneDto(await loadVersion(params.fid, params.vid)) });
  });

  router.add("PUT", "/v2/nvcf/functions/:fid/versions/:vid", async ({ req, res, params }) => {
    await authorize(req, "update_function");
    const v = await loadVersion(params.fid, params.vid);
    const body = parseBody(updateFunctionSchema, await json(req));
    if (body.name !== undefined && body.name !== v.name) {
      throw new CallplaneError(
        "VALIDATION_FAILED",
        `name: a function's name cannot change (it is "${v.name}")`,
        { extra: { errors: [{ field: "name", message: "cannot change" }] } },
      );
    }
    const { name: _name, health, ...rest } = body;
    const spec: FunctionSpec = {
      ...v.spec,
      ...Object.fromEntries(Object.entries(rest).filter(([, x]) => x !== undefined)),
    };
    if (health) spec.health = { ...health, port: health.port ?? spec.inferencePort };
    // a health check that followed the inference port keeps following it
    else if (rest.inferencePort !== undefined && v.spec.health.port === v.spec.inferencePort)
      spec.health = { ...spec.health, port: rest.inferencePort };
    await store.updateVersion(v.functionId, v.versionId, spec);
    sendJson(res, 200, { function: await oneDto({ ...v, spec }) });
  });

  router.add("DELETE", "/v2/nvcf/functions/:fid/versions/:vid", async ({ req, res, params }) => {
    await authorize(req, "delete_function");
    await loadVersion(params.fid, params.vid);
    const r = await store.deleteVersion(params.fid, params.vid);
    if (r === "deployed") {
      throw new CallplaneError(
        "VERSION_DEPLOYED",
        `version ${params.vid} is deployed; undeploy it first with DELETE /v2/nvcf/deployments/functions/${params.fid}/versions/${params.vid}`,
      );
    }
    if (r === "not-found")
      throw new CallplaneError("VERSION_NOT_FOUND", `function ${params.fid} has no version ${params.vid}`);
    if (secrets) {
      // the function's last version takes the function, and with it the function's NEK
      if (await store.functionExists(params.fid))
        await secrets.removeVersion({ functionId: params.fid, versionId: params.vid });
      else await secrets.removeFunction(params.fid);
    }
    logger.info({ functionId: params.fid, versionId: params.vid }, "function version deleted");
    res.writeHead(204).end();
  });

  // ---- deployments (contract §5.2)
  router.add("POST", "/v2/nvcf/deployments/functions/:fid/versions/:vid", async ({ req, res, params }) => {
    await authorize(req, "deploy_function");
    const v = await loadVersion(params.fid, params.vid);
    const body = parseBody(deploymentSchema, await json(req));
    const now = new Date().toISOString();
    const d: DeploymentRecord = {
      deploymentId: randomUUID(),
      functionId: v.functionId,
      versionId: v.versionId,
      specs: body.deploymentSpecifications,
      createdAt: now,
      updatedAt: now,
    };
    if ((await store.createDeployment(d)) === "exists") {
      throw new CallplaneError(
        "DEPLOYMENT_EXISTS",
        `version ${v.versionId} is already deployed; change it with PUT on the same path`,
      );
    }
    logger.info(
      { functionId: v.functionId, versionId: v.versionId, deploymentId: d.deploymentId },
      "deployment created",
    );
    // the queue exists before any worker or invocation needs it (workers may not create it)
    await trust.ensureQueueSoft(v.versionId);
    sendJson(res, 200, { deployment: await deploymentDto(d) });
  });

  const getDeployment = async (fid: string, vid: string) => {
    await loadVersion(fid, vid);
    const d = await store.getDeployment(fid, vid);
    if (!d)
      throw new CallplaneError(
        "DEPLOYMENT_NOT_FOUND",
        `version ${vid} of function ${fid} is not deployed; deploy it with POST on the same path`,
      );
    return d;
  };

  router.add("GET", "/v2/nvcf/deployments/functions/:fid/versions/:vid", async ({ req, res, params }) => {
    await authorize(req, "deploy_function");
    sendJson(res, 200, { deployment: await deploymentDto(await getDeployment(params.fid, params.vid)) });
  });

  router.add("GET", "/v2/nvcf/deployments/:did", async ({ req, res, params }) => {
    await authorize(req, "deploy_function");
    checkUuid(params.did, "DEPLOYMENT_NOT_FOUND", "deployment id");
    const d = await store.getDeploymentById(params.did);
    if (!d) throw new CallplaneError("DEPLOYMENT_NOT_FOUND", `no deployment with id ${params.did}`);
    sendJson(res, 200, { deployment: await deploymentDto(d) });
  });

  router.add("PUT", "/v2/nvcf/deployments/functions/:fid/versions/:vid", async ({ req, res, params }) => {
    await authorize(req, "deploy_function");
    const d = await getDeployment(params.fid, params.vid);
    const body = parseBody(deploymentSchema, await json(req));
    const now = new Date().toISOString();
    await store.updateDeployment(d.functionId, d.versionId, body.deploymentSpecifications, now);
    logger.info({ deploymentId: d.deploymentId }, "deployment updated");
    sendJson(res, 200, {
      deployment: await deploymentDto({ ...d, specs: body.deploymentSpecifications, updatedAt: now }),
    });
  });

  router.add("DELETE", "/v2/nvcf/deployments/functions/:fid/versions/:vid", async ({ req, res, params }) => {
    await authorize(req, "deploy_function");
    const d = await getDeployment(params.fid, params.vid);
    await store.deleteDeployment(d.functionId, d.versionId);
    logger.info({ deploymentId: d.deploymentId }, "deployment deleted");
    sendJson(res, 200, { deployment: { ...(await deploymentDto(d)), functionStatus: "INACTIVE" } });
  });

  // ---- API keys (contract §5.4)
  router.add("POST", "/v1/keys", async ({ req, res }) => {
    const admin = await requireAdmin(req);
    const body = parseBody(createKeySchema, (await json(req)) ?? {});
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
    await store.createApiKey(k);
    logger.info({ keyId: k.keyId, scopes }, "API key issued");
    sendJson(res, 200, { ...keyDto(k), value });
  });

  router.add("GET", "/v1/keys", async ({ req, res }) => {
    await requireAdmin(req);
    sendJson(res, 200, { keys: (await store.listApiKeys()).map((k) => keyDto(k)) });
  });

  router.add("GET", "/v1/keys/:id", async ({ req, res, params }) => {
    await requireAdmin(req);
    checkUuid(params.id, "KEY_NOT_FOUND", "key id");
    const k = await store.getApiKey(params.id);
    if (!k) throw new CallplaneError("KEY_NOT_FOUND", `no API key with id ${params.id}`);
    sendJson(res, 200, keyDto(k));
  });

  router.add("DELETE", "/v1/keys/:id", async ({ req, res, params }) => {
    await requireAdmin(req);
    checkUuid(params.id, "KEY_NOT_FOUND", "key id");
    const k = await store.getApiKey(params.id);
    if (!k) throw new CallplaneError("KEY_NOT_FOUND", `no API key with id ${params.id}`);
    const at = new Date().toISOString();
    await store.revokeApiKey(k.keyId, at);
    logger.info({ keyId: k.keyId }, "API key revoked");
    sendJson(res, 200, keyDto({ ...k, revokedAt: k.revokedAt ?? at }));
  });

  // ---- internal: callplane's own services
  router.add("POST", "/v1/internal/invocation-auth", async ({ req, res }) => {
    await authorize(req, "internal:invocation-auth");
    const body = parseBody(invocationAuthSchema, await json(req));
    const key = await apiKeyPrincipal(body.apiKey);
    requireScope(key, "invoke_function");
    if (!UUID.test(body.functionId))
      throw new CallplaneError("FUNCTION_NOT_FOUND", `function id "${body.functionId}" is not a UUID`);
    const versions = await store.listVersions(body.functionId);
    if (versions.length === 0)
      throw new CallplaneError("FUNCTION_NOT_FOUND", `no function with id ${body.functionId}`);
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
    await Promise.all(candidates.map((v) => trust.ensureQueueSoft(v.versionId)));
    sendJson(res, 200, {
      functionId: body.functionId,
      functionName: versions[0].name,
      ncaId,
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
  });

  router.add("GET", "/v1/internal/deployments", async ({ req, res }) => {
    await authorize(req, "internal:deployments");
    const deployments = await store.listDeployments();
    const revisions = secrets ? await secrets.revisions() : new Map<string, number>();
    const out = [];
    for (const d of deployments) {
      const v = await store.getVersion(d.functionId, d.versionId);
      // the revision changes whenever a secret of the version is written or deleted, so the
      // compute agent knows when to refresh the secrets of running instances
      if (v)
        out.push({
          ...d,
          name: v.name,
          ncaId: v.ncaId,
          spec: v.spec,
          secretsRevision: revisions.get(d.versionId) ?? 0,
        });
    }
    await Promise.all(out.map((d) => trust.ensureQueueSoft(d.versionId)));
    const nats = trust.workerNatsEnv();
    sendJson(res, 200, { deployments: out, workerAuth: nats.workerAuth, workerNatsEnv: nats.env });
  });

  router.add("PUT", "/v1/internal/instances", async ({ req, res }) => {
    await authorize(req, "internal:instances");
    const body = parseBody(instanceReportSchema, await json(req));
    await store.reportInstances(
      body.reporter,
      body.instances.map(({ workerAuth: _w, ...i }) => i),
    );
    await trust.onReport(body.reporter, body.instances);
    res.writeHead(204).end();
  });

  // ---- secrets (contract §5.3) and their keys
  if (secrets) {
    addSecretRoutes({
      router,
      store: secrets,
      authorize,
      requireAdmin,
      loadVersion,
      readSensitiveJson: sensitiveJson,
      readJson: json,
      parse: parseBody,
      logger,
    });
  }

  // ---- what a client may know before it has a token: is there an admin token issuer to ask?
  router.add("GET", "/v1/info", ({ res }) => {
    sendJson(res, 200, {
      service: "callplane-api",
      adminIssuer: {
        enabled: opts.adminIssuer?.enabled ?? issuerOn,
        gatewayEnabled: (opts.adminIssuer?.enabled ?? issuerOn) && (opts.adminIssuer?.gatewayEnabled ?? true),
        tokensAccepted: issuerOn,
      },
      secrets: secrets !== undefined,
    });
  });

  // bodies here are small JSON documents: a client that stops sending is cut off after 60 s
  const http = createHttpService({
    name: "api",
    listen: opts.listen,
    logger,
    registry,
    router,
    requestTimeoutMs: 60_000,
  });
  return {
    http,
    async listen() {
      await verifierPromise;
      await trust.start();
      return http.listen();
    },
    async close(graceMs) {
      await http.close(graceMs);
      await trust.close();
    },
    destroy: () => {
      http.destroy();
      trust.destroy();
    },
  };
}
