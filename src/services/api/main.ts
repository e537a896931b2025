import { readFileSync } from "node:fs";
import { SERVICE_SCOPES, readServiceToken, type ServiceName } from "../../lib/auth.js";
import { natsAccess, readWorkerSeed } from "../../lib/nats-auth.js";
import { parseHostPort } from "../../lib/net.js";
import { IdentitySigner, ensureIdentityKey, readIdentityKey } from "../../lib/worker-identity.js";
import { openIdentityStore } from "./identity-store.js";
import { runService } from "../../lib/service-main.js";
import { createApiService } from "./service.js";
import { openSqliteStore } from "./store/sqlite.js";

runService("api", async (config, logger) => {
  let adminPublicKeyPem: string;
  try {
    adminPublicKeyPem = readFileSync(config.auth.adminPublicKeyFile, "utf8");
  } catch {
    throw new Error(
      `cannot read the admin public key at ${config.auth.adminPublicKeyFile}; the stack creates it on first start, or set auth.adminPublicKeyFile`,
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
  const store = openSqliteStore(config.api.database.path);
  // the identity signing key is the API's alone: created here, used for nothing else
  if (ensureIdentityKey(config.auth.workerIdentityKeyFile).created)
    logger.info({ file: config.auth.workerIdentityKeyFile }, "generated the worker identity signing key");
  const identities = openIdentityStore(config.api.database.path);
  const workerAuth = config.nats.workerAuth;
  const api = createApiService({
    listen: parseHostPort(config.api.listen),
    store,
    adminPublicKeyPem,
    serviceTokens,
    maxBodyBytes: config.api.maxBodyBytes,
    workerTrust: {
      region: config.global.region,
      queue: { ...config.nats.stream, ackWaitSeconds: config.nats.consumer.ackWaitSeconds },
      nats: { app: natsAccess(config, "api"), sys: natsAccess(config, "api-revoker") },
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
    logger,
  });
  const url = await api.listen();
  return {
    urls: { api: url.origin },
    async close(graceMs) {
      await api.close(graceMs);
      await store.close();
      await identities.close();
    },
    destroy: () => api.destroy(),
  };
});
