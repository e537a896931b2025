import { readFileSync } from "node:fs";
import {
  ensureIdentityKey,
  IdentitySigner,
  readIdentityKey,
  readServiceToken,
  samePublicKey,
  SERVICE_SCOPES,
  type ServiceName,
} from "../../lib/identity/index.js";
import { callbackProxyHealth, ConfigError, databaseProblems, type Config } from "../../lib/config/index.js";
import type { Logger } from "../../lib/log.js";
import { createRegistry } from "../../lib/metrics.js";
import { natsAccess, readWorkerSeed } from "../../lib/nats/index.js";
import {
  createEnvMekProvider,
  createFileMekProvider,
  loadMekPlugin,
  type MekProvider,
} from "../../lib/secrets/index.js";
import { parseHostPort } from "../../lib/net/index.js";
import { openIdentityStore, openPostgresIdentityStore } from "./identity-store.js";
import { runService } from "../../lib/process/index.js";
import { openSqliteSecretStorage } from "./secrets/storage.js";
import { openPostgresSecretStorage } from "./secrets/storage-postgres.js";
import { createSecretStore } from "./secrets/store.js";
import { createApiService } from "./service.js";
import { openPostgresStore } from "./store/postgres.js";
import { openSqliteStore } from "./store/sqlite.js";

function readKey(file: string, key: string, how: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch {
    throw new Error(`cannot read ${how} at ${file}; the stack creates it on first start, or set ${key}`);
  }
}

async function mekProvider(config: Config, logger: Logger): Promise<MekProvider> {
  const m = config.secrets.mek;
  switch (m.provider) {
    case "file":
      return createFileMekProvider(m.file, logger);
    case "env":
      return createEnvMekProvider(m.envVariable, process.env[m.envVariable]);
    case "plugin":
      return loadMekPlugin(m.plugin, { env: process.env, logger });
  }
}

runService("api", async (config, logger) => {
  const dbProblems = databaseProblems(config);
  if (dbProblems.length) throw new ConfigError("api", dbProblems);
  const adminPublicKeyPem = readKey(
    config.auth.adminPublicKeyFile,
    "auth.adminPublicKeyFile",
    "the admin public key",
  );
  // The issuer's key is read only while the issuer is on: turned off, the API does not know it,
  // and the tokens the issuer signed are refused.
  let adminIssuerPublicKeyPem: string | undefined;
  if (config.adminIssuerProxy.enabled) {
    adminIssuerPublicKeyPem = readKey(
      config.adminIssuerProxy.publicKeyFile,
      "adminIssuerProxy.publicKeyFile",
      "the admin token issuer's public key",
    );
    if (samePublicKey(adminIssuerPublicKeyPem, adminPublicKeyPem))
      throw new Error(
        `adminIssuerProxy.publicKeyFile (${config.adminIssuerProxy.publicKeyFile}) holds the same key as auth.adminPublicKeyFile: the issuer needs a key pair of its own, or turning it off could not withdraw its tokens`,
      );
  }
  const serviceTokens: Partial<Record<ServiceName, string>> = {};
  for (const name of Object.keys(SERVICE_SCOPES) as ServiceName[]) {
    try {
      serviceTokens[name] = readServiceToken(config.auth.serviceTokenDir, name);
    } catch (err) {
      logger.warn(
        { service: name, err: (err as Error).message },
        "no service token: that service cannot call the API",
      );
    }
  }
  const db = config.api.database;
  const postgres =
    db.driver === "postgres"
      ? await openPostgresStore({ url: db.url, maxConnections: db.maxConnections })
      : undefined;
  const sqlite = postgres ? undefined : openSqliteStore(db.path);
  const store = (postgres ?? sqlite)!;
  const registry = createRegistry("api");
  const m = config.secrets.mek;
  const secrets = createSecretStore({
    storage: postgres ? await openPostgresSecretStorage(postgres.pool) : openSqliteSecretStorage(sqlite!.db),
    provider: await mekProvider(config, logger),
    refreshMs: m.refreshSeconds * 1000,
    rotationGraceMs: m.rotationGraceSeconds * 1000,
    nekCache: {
      maxEntries: config.secrets.nekCache.maxEntries,
      ttlMs: config.secrets.nekCache.ttlSeconds * 1000,
      outageMs: config.secrets.nekCache.outageSeconds * 1000,
    },
    maxNekEncryptions: config.secrets.nek.maxEncryptions,
    logger,
    registry,
  });
  try {
    await secrets.start();
  } catch (err) {
    await store.close();
    throw err;
  }
  // the identity signing key is the API's alone: created here, used for nothing else
  if (ensureIdentityKey(config.auth.workerIdentityKeyFile).created)
    logger.info({ file: config.auth.workerIdentityKeyFile }, "generated the worker identity signing key");
  const identities = postgres ? await openPostgresIdentityStore(postgres.pool) : openIdentityStore(db.path);
  const workerAuth = config.nats.workerAuth;
  const api = createApiService({
    listen: parseHostPort(config.api.listen),
    store,
    adminPublicKeyPem,
    adminIssuerPublicKeyPem,
    adminIssuer: {
      enabled: config.adminIssuerProxy.enabled,
      gatewayEnabled: config.adminIssuerProxy.gateway.enabled,
    },
    secrets,
    serviceTokens,
    maxBodyBytes: config.api.maxBodyBytes,
    audit: config.api.audit,
    maxKeyLifetimeDays: config.apikeys.maxLifetimeDays,
    allowLocalCommand: config.compute.local.allowCommand,
    compute: { backend: config.compute.backend, clusterId: config.compute.workerIdentity.clusterId },
    hosts: config.global.hosts,
    workerTrust: {
      region: config.global.region,
      queue: { ...config.nats.stream, ackWaitSeconds: config.nats.consumer.ackWaitSeconds },
      nats: {
        app: natsAccess(config, "api"),
        sys: natsAccess(config, "api-revoker"),
        servers: config.nats.cluster.size,
        // the callback proxies' keepers answer the logs question too (not known when autoscaled)
        callbackProxies: !config.workerCallbackProxy.enabled
          ? 0
          : config.workerCallbackProxy.autoscaling.enabled
            ? undefined
            : config.workerCallbackProxy.replicaCount,
      },
      workerAuth,
      // token mode: the API does not hold the shared worker key at all, so it cannot hand it out
      ...(workerAuth === "nkey" ? { workerNkeySeed: () => readWorkerSeed(config.nats.credentialsDir) } : {}),
      identity: {
        signer: new IdentitySigner(
          readIdentityKey(config.auth.workerIdentityKeyFile),
          config.compute.workerIdentity.clusterId,
          config.compute.workerIdentity.tokenTtlSeconds,
        ),
        store: identities,
      },
    },
    consoleCertificateFiles: [
      { name: "stack-ca", file: config.pki.caCertFile },
      { name: "callback-proxy", file: config.workerCallbackProxy.tls.frontend.certFile },
      { name: "nats", file: config.nats.tls.certFile },
    ],
    consoleCallbackProxy: callbackProxyHealth(config.workerCallbackProxy),
    consoleTraces: consoleTraceSource(config),
    logger,
    registry,
  });
  const url = await api.listen();
  return {
    urls: { api: url.origin },
    async close(graceMs) {
      await api.close(graceMs);
      await secrets.close();
      await store.close();
      await identities.close();
    },
    destroy: () => api.destroy(),
  };
});

/** Where the console reads a request's spans: the span file while tracing writes one, else the query API. */
function consoleTraceSource(config: Config): { file: string } | { queryUrl: string } | undefined {
  const t = config.observability.tracing;
  if (t.enabled === true && t.file) return { file: t.file };
  return t.queryUrl ? { queryUrl: t.queryUrl } : undefined;
}
