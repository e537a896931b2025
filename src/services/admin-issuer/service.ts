// The admin token issuer: POST /v1/admin/keys returns a 12-hour admin JWT. Like upstream's
// admin-token-issuer-proxy it does not authenticate its callers, so it listens on loopback by
// default and must never be exposed; an install with its own identity provider turns it off
// (adminIssuerProxy.enabled: false) and then this service is not started, its key is not loaded,
// and the API refuses the tokens it issued before (it trusts the issuer's key only while enabled).
import { ADMIN_ISSUER, createAdminTokenSigner } from "../../lib/identity/index.js";
import { CallplaneError } from "../../lib/errors.js";
import { Router, createHttpService, readJson, sendJson } from "../../lib/http/index.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { createRegistry, Counter, type Registry } from "../../lib/metrics.js";
import type { HostPort } from "../../lib/net/index.js";

export interface AdminIssuerOptions {
  listen: HostPort;
  privateKeyPem: string;
  ttlSeconds: number;
  logger?: Logger;
  registry?: Registry;
}

export function createAdminIssuer(opts: AdminIssuerOptions) {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("admin-issuer");
  const issued = new Counter({
    name: "callplane_admin_tokens_issued_total",
    help: "Admin tokens issued",
    registers: [registry],
  });
  // its own key pair and its own `iss`: the API trusts them only while the issuer is enabled
  const signerPromise = createAdminTokenSigner(opts.privateKeyPem, opts.ttlSeconds, ADMIN_ISSUER);
  signerPromise.catch(() => undefined);
  const router = new Router();
  router.add("POST", "/v1/admin/keys", async ({ req, res }) => {
    // The body is `{}` (as upstream): the issuer cannot be asked for other scopes or a longer life,
    // and a request that tries is refused rather than silently answered with the defaults.
    const body = await readJson(req, 16 * 1024);
    if (body !== undefined && (typeof body !== "object" || body === null || Array.isArray(body)))
      throw new CallplaneError("VALIDATION_FAILED", "the body must be an empty JSON object: {}");
    const fields = body ? Object.keys(body) : [];
    if (fields.length)
      throw new CallplaneError(
        "VALIDATION_FAILED",
        `the issuer takes an empty body ({}); it sets the scopes and expiry itself (unknown fields: ${fields.slice(0, 10).join(", ")})`,
        { extra: { errors: fields.slice(0, 50).map((field) => ({ field, message: "unknown field" })) } },
      );
    const signer = await signerPromise;
    const t = await signer.sign();
    issued.inc();
    logger.info(
      { tokenId: t.id, expiresAt: t.expiresAt.toISOString(), remote: req.socket.remoteAddress },
      "admin token issued",
    );
    sendJson(res, 200, {
      id: t.id,
      value: t.token,
      status: "ACTIVE",
      owner_type: "SYSTEM",
      owner_id: "admin-issuer-proxy",
      issuer_service_id: "callplane-admin-issuer",
      audience_service_ids: ["callplane-api"],
      description: "admin token from the callplane admin issuer",
      created_at: t.issuedAt.toISOString(),
      expires_at: t.expiresAt.toISOString(),
      authorizations: {
        policies: [
          {
            aud: "callplane-api",
            auds: ["callplane-api"],
            product: "nv-cloud-functions",
            resources: [
              { id: "*", type: "account-functions" },
              { id: "*", type: "authorized-functions" },
            ],
            scopes: t.scopes,
          },
        ],
      },
    });
  });
  const http = createHttpService({
    name: "admin-issuer",
    listen: opts.listen,
    logger,
    registry,
    router,
    requestTimeoutMs: 60_000,
  });
  return {
    http,
    async listen() {
      await signerPromise;
      return http.listen();
    },
    close: (graceMs?: number) => http.close(graceMs),
    destroy: () => http.destroy(),
  };
}
