// The admin token issuer proxy's section, and its rules: an address of its own, and (once paths are
// resolved) a key pair of its own.
import { z } from "zod";
import type { ApiConfig } from "./api.js";
import type { AuthConfig } from "./auth.js";
import { hostPort, optionalUrl, seconds, section } from "./fields.js";
import { podAnnotations, resources } from "./kubernetes.js";

export const adminIssuerProxySection = section({
  enabled: z.boolean().default(true),
  podAnnotations: podAnnotations(),
  resources: resources("50m", "64Mi", "256Mi"),
  listen: hostPort.default("127.0.0.1:8081"),
  url: optionalUrl(["http", "https"]),
  tokenTtlSeconds: seconds(43_200, 7 * 86_400),
  signingKeyFile: z.string().default(""),
  publicKeyFile: z.string().default(""),
  operatorCredentialFile: z.string().default(""),
  peerCredentials: z.boolean().default(true),
  gateway: section({ enabled: z.boolean().default(true) }),
});

export type AdminIssuerProxyConfig = z.output<typeof adminIssuerProxySection>;

/** The issuer and the API cannot share an address. */
export function issuerListenProblems(c: {
  adminIssuerProxy: AdminIssuerProxyConfig;
  api: ApiConfig;
}): string[] {
  const p: string[] = [];
  if (c.adminIssuerProxy.enabled && c.adminIssuerProxy.listen === c.api.listen) {
    p.push(
      `adminIssuerProxy.listen and api.listen are both ${c.api.listen}: give the issuer its own address`,
    );
  }
  return p;
}

/** Rules on paths once they are resolved: the issuer's key pair must be its own. */
export function keyFileProblems(c: { adminIssuerProxy: AdminIssuerProxyConfig; auth: AuthConfig }): string[] {
  const p: string[] = [];
  const ai = c.adminIssuerProxy;
  for (const [mine, other] of [
    ["signingKeyFile", "adminSigningKeyFile"],
    ["publicKeyFile", "adminPublicKeyFile"],
  ] as const) {
    if (ai[mine] === c.auth[other]) {
      p.push(
        `adminIssuerProxy.${mine} and auth.${other} name the same file (${ai[mine]}): the issuer needs a key of its own, ` +
          `or turning it off could not withdraw the tokens it issued. Give adminIssuerProxy.${mine} another file, ` +
          "or leave it empty for <global.dataDir>/keys/admin-issuer.*",
      );
    }
  }
  return p;
}
