// The control-plane API: functions, versions, deployments, API keys, and the internal endpoints
// that callplane's own services use (invocation auth, desired deployments, instance reports, the
// instance types of each cluster).
// This module only wires: who is calling (routes/auth.ts), worker trust (worker-trust.ts), one
// route module per resource (routes/), and the HTTP service's lifecycle.
import type { ServiceName } from "../../lib/identity/index.js";
import { Router, createHttpService, type HostNames, type HttpService } from "../../lib/http/index.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { createRegistry, type Registry } from "../../lib/metrics.js";
import type { HostPort } from "../../lib/net/index.js";
import { ApiAuth } from "./routes/auth.js";
import type { ApiDeps, AuditBounds } from "./routes/deps.js";
import { addDeploymentRoutes } from "./routes/deployments.js";
import { addFunctionRoutes } from "./routes/functions.js";
import { addInfoRoutes } from "./routes/info.js";
import { addInstanceRoutes } from "./routes/instances.js";
import { addInvocationAuthRoutes } from "./routes/invocation-auth.js";
import { addAccountRoutes } from "./routes/accounts.js";
import { addAdminTokenRoutes } from "./routes/admin-tokens.js";
import { addAuthorizationRoutes } from "./routes/authorizations.js";
import { addKeyRoutes } from "./routes/keys.js";
import { addSecretRoutes } from "./routes/secrets.js";
import { addWorkerTrustRoutes } from "./routes/worker-trust.js";
import { addClusterRoutes } from "./routes/clusters.js";
import { addConsoleRoutes } from "./console/routes.js";
import type { ComputeSettings } from "./instance-types.js";
import { PlaneMetrics } from "./plane-metrics.js";
import type { SecretStore } from "./secrets/store.js";
import type { Store } from "./store/types.js";
import { WorkerTrust, type WorkerTrustOptions } from "./worker-trust.js";

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
  /** The default account's id (an NVCF ncaId): the stack's demo and every key made before accounts are in it. */
  ncaId?: string;
  /** The longest life a new API key may have, in days (apikeys.maxLifetimeDays; 365). */
  maxKeyLifetimeDays?: number;
  /** The console's audit log bounds (api.audit); 100,000 rows and 365 days unless given. */
  audit?: AuditBounds;
  /** compute.local.allowCommand; off (the image local/command is refused) unless given. */
  allowLocalCommand?: boolean;
  /**
   * compute.backend and compute.workerIdentity.clusterId: with the local backend, that cluster
   * always offers the local instance type (local/local.cpu); with kubernetes, only the types the
   * agents registered count. The local backend and the cluster "local" unless given.
   */
  compute?: ComputeSettings;
  /**
   * Host names the API answers besides IP literals and localhost (global.hosts); another is refused
   * (HOST_NOT_SERVED), which keeps DNS-rebinding pages out. Undefined: any (tests that call by name).
   */
  hosts?: HostNames;
  /**
   * Certificate files the operator console's health page shows the expiry of (the stack CA, the
   * callback proxy's and NATS's serving certificates, where the API can read them).
   */
  consoleCertificateFiles?: ReadonlyArray<{ name: string; file: string }>;
  /**
   * Where the console's health page asks the callback proxy's /health, or why it cannot
   * (callbackProxyHealth of the configuration); undefined: the proxy is off.
   */
  consoleCallbackProxy?: { url: string } | { why: string } | undefined;
  /** How long the health page keeps its probes' answers (5 s; tests 0). */
  consoleProbeCacheMs?: number;
  /** Where the console's request page reads a request's spans (consoleTraceSource of the config). */
  consoleTraces?: { file: string } | { queryUrl: string } | undefined;
  logger?: Logger;
  registry?: Registry;
}

export interface ApiService {
  listen(): Promise<URL>;
  close(graceMs?: number): Promise<void>;
  destroy(): void;
  readonly http: HttpService;
}

export function createApiService(opts: ApiServiceOptions): ApiService {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("api");
  const auth = new ApiAuth({
    store: opts.store,
    adminPublicKeyPem: opts.adminPublicKeyPem,
    adminIssuerPublicKeyPem: opts.adminIssuerPublicKeyPem,
    serviceTokens: opts.serviceTokens,
    defaultAccount: opts.ncaId ?? "callplane",
  });
  const trust = new WorkerTrust(opts.workerTrust, opts.store, logger, registry);
  new PlaneMetrics(registry, { store: opts.store, queues: trust, logger });
  const deps: ApiDeps = {
    store: opts.store,
    secrets: opts.secrets,
    auth,
    trust,
    logger,
    maxBodyBytes: opts.maxBodyBytes ?? 1024 * 1024,
    ncaId: opts.ncaId ?? "callplane",
    maxKeyLifetimeDays: opts.maxKeyLifetimeDays ?? 365,
    adminIssuer: opts.adminIssuer,
    allowLocalCommand: opts.allowLocalCommand ?? false,
    compute: opts.compute ?? { backend: "local", clusterId: "local" },
    audit: opts.audit ?? { maxRows: 100_000, maxAgeDays: 365 },
  };

  const router = new Router();
  addWorkerTrustRoutes(router, deps);
  // ---- functions and versions (contract §5.1)
  addFunctionRoutes(router, deps);
  // ---- deployments (contract §5.2), and the desired deployments the compute agent reads
  addDeploymentRoutes(router, deps);
  // ---- API keys (contract §5.4)
  addKeyRoutes(router, deps);
  // ---- accounts, functions shared between them, admin tokens revoked by id
  addAccountRoutes(router, deps);
  addAuthorizationRoutes(router, deps);
  addAdminTokenRoutes(router, deps);
  // ---- internal: callplane's own services
  addInvocationAuthRoutes(router, deps);
  addInstanceRoutes(router, deps);
  // ---- clusters: the instance types they offer (registered by compute agents, listed as NVCF's cluster groups)
  addClusterRoutes(router, deps);
  // ---- secrets (contract §5.3) and their keys
  if (opts.secrets) addSecretRoutes(router, deps);
  // ---- what a client may know before it has a token
  addInfoRoutes(router, deps);
  // ---- the operator console: HTML pages under /console for plane-wide admins
  const consolePages = addConsoleRoutes(router, deps, {
    certificateFiles: opts.consoleCertificateFiles ?? [],
    callbackProxy: opts.consoleCallbackProxy,
    traces: opts.consoleTraces,
    ...(opts.consoleProbeCacheMs !== undefined ? { probeCacheMs: opts.consoleProbeCacheMs } : {}),
  });

  // bodies here are small JSON documents: a client that stops sending is cut off after 60 s
  const http = createHttpService({
    name: "api",
    listen: opts.listen,
    logger,
    registry,
    router,
    requestTimeoutMs: 60_000,
    ...(opts.hosts ? { hosts: opts.hosts } : {}),
  });
  return {
    http,
    async listen() {
      await auth.ready();
      // the default account exists, and owns every key made before there were accounts
      await opts.store.adoptIntoAccount({
        ncaId: deps.ncaId,
        name: "default",
        createdAt: new Date().toISOString(),
      });
      await trust.start();
      await consolePages.start();
      return http.listen();
    },
    async close(graceMs) {
      // live streams never end by themselves: they would hold the drain for all of graceMs
      consolePages.close();
      await http.close(graceMs);
      await trust.close();
    },
    destroy: () => {
      consolePages.close();
      http.destroy();
      trust.destroy();
    },
  };
}
