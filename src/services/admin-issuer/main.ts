import { readFileSync } from "node:fs";
import { readOperatorCredential } from "../../lib/identity/index.js";
import { parseHostPort } from "../../lib/net/index.js";
import { runService } from "../../lib/process/index.js";
import { createAdminIssuer } from "./service.js";

runService("admin-issuer", async (config, logger) => {
  if (!config.adminIssuerProxy.enabled) {
    throw new Error(
      "adminIssuerProxy.enabled is false: the admin issuer is turned off and must not be started",
    );
  }
  let privateKeyPem: string;
  try {
    privateKeyPem = readFileSync(config.adminIssuerProxy.signingKeyFile, "utf8");
  } catch {
    throw new Error(
      `cannot read the admin issuer's signing key at ${config.adminIssuerProxy.signingKeyFile}; the stack creates it on first start, or set adminIssuerProxy.signingKeyFile`,
    );
  }
  // read once: a new credential takes effect when the issuer restarts
  const operatorCredential = readOperatorCredential(config.adminIssuerProxy.operatorCredentialFile);
  const issuer = createAdminIssuer({
    listen: parseHostPort(config.adminIssuerProxy.listen),
    privateKeyPem,
    ttlSeconds: config.adminIssuerProxy.tokenTtlSeconds,
    operatorCredential,
    hosts: config.global.hosts,
    peerCredentials: config.adminIssuerProxy.peerCredentials,
    logger,
  });
  const url = await issuer.listen();
  return { urls: { issuer: url.origin }, close: (g) => issuer.close(g), destroy: () => issuer.destroy() };
});
