// The admin token issuer: POST /v1/admin/keys returns a 12-hour plane-wide admin JWT. Upstream's
// admin-token-issuer-proxy authenticates no one; this one is guarded, because anyone who can mint
// an admin token can run code as the stack's user. In order: it answers only the Host names it
// serves (IP literals, localhost, global.hosts: a DNS-rebinding page sends its own name), no
// browser (any Origin header), only JSON (no form or text a page can send without a preflight), and
// mints only for the operator: a caller presenting the operator credential, a secret in a file of
// mode 0600 that only the account running the stack can read (`callplane init` reads it), or, on one
// machine (peerCredentials), a loopback caller whose process runs as that account (or root), as the
// kernel's socket table says: the same people, proved without the file. An install with its own
// identity provider turns it off (adminIssuerProxy.enabled: false): then it is not started, its key
// is not loaded, and the API refuses the tokens it issued before.
import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { ADMIN_ISSUER, PLANE_WIDE, createAdminTokenSigner } from "../../lib/identity/index.js";
import { CallplaneError } from "../../lib/errors.js";
import {
  Router,
  countHeader,
  createHttpService,
  isJsonContentType,
  readJson,
  sendJson,
  type HostNames,
} from "../../lib/http/index.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { createRegistry, Counter, type Registry } from "../../lib/metrics.js";
import { loopbackPeerUid, type HostPort } from "../../lib/net/index.js";

export interface AdminIssuerOptions {
  listen: HostPort;
  privateKeyPem: string;
  ttlSeconds: number;
  /** The operator credential (the contents of adminIssuerProxy.operatorCredentialFile). */
  operatorCredential: string;
  /** Host names served besides IP literals and localhost (global.hosts). */
  hosts: HostNames;
  /**
   * Whether a loopback caller running as this process's user (or root) is the operator without
   * the credential (adminIssuerProxy.peerCredentials; off on Kubernetes).
   */
  peerCredentials?: boolean;
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
  if (opts.operatorCredential.length < 16)
    throw new Error("the admin issuer's operator credential is empty or too short (16 characters at least)");
  const credentialDigest = digest(opts.operatorCredential);
  const router = new Router();
  router.add("POST", "/v1/admin/keys", async ({ req, res }) => {
    // (the Host and Origin checks ran before any route: createHttpService's hosts and refuseBrowsers)
    const type = req.headers["content-type"];
    if (type === undefined || !isJsonContentType(type))
      throw new CallplaneError(
        "UNSUPPORTED_MEDIA_TYPE",
        type === undefined
          ? "the issuer takes only requests with Content-Type: application/json (and the body {})"
          : `the issuer takes only Content-Type: application/json, not ${JSON.stringify(type.slice(0, 100))}`,
      );
    requireOperator(req, credentialDigest, opts.peerCredentials === true);
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
    // plane-wide: the operator's token may act for any account
    const t = await signer.sign({ account: PLANE_WIDE });
    issued.inc();
    logger.info(
      {
        tokenId: t.id,
        account: t.account,
        expiresAt: t.expiresAt.toISOString(),
        remote: req.socket.remoteAddress,
      },
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
      description: "plane-wide admin token from the callplane admin issuer",
      created_at: t.issuedAt.toISOString(),
      expires_at: t.expiresAt.toISOString(),
      authorizations: {
        policies: [
          {
            aud: "callplane-api",
            auds: ["callplane-api"],
            product: "nv-cloud-functions",
            // the NVCF shape, plus the one resource that says "every account": the token is plane-wide
            resources: [
              { id: "*", type: "accounts" },
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
    hosts: opts.hosts,
    refuseBrowsers: true,
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

function digest(text: string): Buffer {
  return createHash("sha256").update(text, "utf8").digest();
}

/** Whether the caller's process runs as this process's user, or root (peer credentials on loopback). */
function peerIsOperator(req: IncomingMessage): boolean {
  const uid = loopbackPeerUid(req.socket);
  return uid !== undefined && (uid === 0 || uid === process.getuid?.());
}

/**
 * Refuses a caller that is not the operator: without the operator credential (`Authorization:
 * Bearer <secret>`, compared in constant time) and, when `peers` is on, not a loopback process of
 * the stack's own user.
 */
function requireOperator(req: IncomingMessage, credentialDigest: Buffer, peers: boolean): void {
  const how =
    "present the operator credential as Authorization: Bearer <secret>, the contents of adminIssuerProxy.operatorCredentialFile " +
    "(readable only by the account that runs the stack); `callplane init` run as that account does this";
  const h = req.headers.authorization;
  if (h === undefined && peers && peerIsOperator(req)) return;
  if (h === undefined)
    throw new CallplaneError(
      "OPERATOR_CREDENTIAL_REQUIRED",
      `the issuer mints only for the operator: ${how}`,
    );
  if (countHeader(req.rawHeaders, "authorization") > 1)
    throw new CallplaneError("BAD_REQUEST", "the request has more than one Authorization header; send one");
  const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
  // both sides hashed first: equal lengths for timingSafeEqual, and no timing on the secret's length
  if (!m || !timingSafeEqual(digest(m[1]), credentialDigest))
    throw new CallplaneError(
      "OPERATOR_CREDENTIAL_REQUIRED",
      `the Authorization header does not carry the operator credential: ${how}`,
    );
}
