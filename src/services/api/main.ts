import { readFileSync } from "node:fs";
import { SERVICE_SCOPES, readServiceToken, type ServiceName } from "../../lib/auth.js";
import { parseHostPort } from "../../lib/net.js";
import { runService } from "../../lib/service-main.js";
import { createApiService } from "./service.js";
import { openPostgresStore } from "./store/postgres.js";
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
  const db = config.api.database;
  const store =
    db.driver === "postgres"
      ? await openPostgresStore({ url: db.url, maxConnections: db.maxConnections })
      : openSqliteStore(db.path);
  const api = createApiService({
    listen: parseHostPort(config.api.listen),
    store,
    adminPublicKeyPem,
    serviceTokens,
    maxBodyBytes: config.api.maxBodyBytes,
    logger,
  });
  const url = await api.listen();
  return {
    urls: { api: url.origin },
    async close(graceMs) {
      await api.close(graceMs);
      await store.close();
    },
    destroy: () => api.destroy(),
  };
});
