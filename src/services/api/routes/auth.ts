// Who is calling the API: a service token of one of callplane's own services (`cps-…`), a signed
// admin token (a JWT from the stack's admin key or, while it is on, the admin token issuer's), or
// an API key; and whether that caller may do what the route does.
import type { IncomingMessage } from "node:http";
import {
  ADMIN_ISSUER,
  PLANE_WIDE,
  SERVICE_SCOPES,
  STACK_ADMIN_ISSUER,
  constantTimeEqualHex,
  createAdminTokenVerifier,
  looksLikeJwt,
  requireScope,
  sha256Hex,
  type AdminTokenVerifier,
  type Principal,
  type ServiceName,
} from "../../../lib/identity/index.js";
import { CallplaneError } from "../../../lib/errors.js";
import { bearerToken } from "../../../lib/http/index.js";
import type { KeyPolicy, Store } from "../store/types.js";
import { ACCOUNT_HEADER, Reach } from "./access.js";

/** An API key's principal, with its policies. */
export type KeyPrincipal = Principal & { kind: "apikey"; policies: readonly KeyPolicy[] };

export interface ApiAuthOptions {
  store: Store;
  /** The stack's admin key (auth.adminPublicKeyFile): tokens with `iss` callplane-admin. */
  adminPublicKeyPem: string;
  /** The admin token issuer's own key, given only while the issuer is enabled. */
  adminIssuerPublicKeyPem?: string | undefined;
  /** Token values of callplane's own services, by service. */
  serviceTokens: Partial<Record<ServiceName, string>>;
  /** The account of keys and tokens that name none (the plane's first account). */
  defaultAccount: string;
}

export class ApiAuth {
  /** Whether tokens the admin token issuer signed (`iss` callplane-admin-issuer) are accepted. */
  readonly issuerTokensAccepted: boolean;
  private readonly store: Store;
  private readonly defaultAccount: string;
  private readonly serviceHashes: Array<{ name: ServiceName; hash: string }>;
  private readonly verifier: Promise<AdminTokenVerifier>;

  constructor(opts: ApiAuthOptions) {
    this.store = opts.store;
    this.defaultAccount = opts.defaultAccount;
    this.serviceHashes = Object.entries(opts.serviceTokens).map(([name, token]) => ({
      name: name as ServiceName,
      hash: sha256Hex(token),
    }));
    const issuerOn = opts.adminIssuerPublicKeyPem !== undefined;
    this.issuerTokensAccepted = issuerOn;
    this.verifier = createAdminTokenVerifier(
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
    // Avoid an unhandled rejection before the first request if the key is bad; ready() awaits it too.
    this.verifier.catch(() => undefined);
  }

  /** Resolves once the admin keys are imported; rejects if one is bad (listen() awaits it). */
  async ready(): Promise<void> {
    await this.verifier;
  }

  async apiKeyPrincipal(token: string): Promise<KeyPrincipal> {
    const k = await this.store.getApiKeyByHash(sha256Hex(token));
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
      account: k.ncaId || this.defaultAccount,
      scopes: new Set(k.scopes),
      expiresAt: new Date(k.expiresAt),
      policies: k.policies,
    };
  }

  async authenticate(req: IncomingMessage): Promise<Principal | KeyPrincipal> {
    return this.authenticateToken(bearerToken(req));
  }

  /** Who a token is, wherever it came from (the console also takes it from its cookie). */
  async authenticateToken(token: string): Promise<Principal | KeyPrincipal> {
    if (token.startsWith("cps-")) {
      const h = sha256Hex(token);
      const svc = this.serviceHashes.find((s) => constantTimeEqualHex(s.hash, h));
      if (!svc) throw new CallplaneError("TOKEN_INVALID", "the service token is not known to this API");
      return { kind: "service", subject: svc.name, scopes: new Set(SERVICE_SCOPES[svc.name]) };
    }
    if (looksLikeJwt(token)) {
      const p = await (await this.verifier).verify(token);
      const revokedAt = await this.store.adminTokenRevokedAt(p.tokenId);
      if (revokedAt !== undefined)
        throw new CallplaneError(
          "TOKEN_REVOKED",
          `the admin token ${p.tokenId} was revoked at ${revokedAt}; get a new one with \`callplane init\``,
        );
      // Internal scopes belong to callplane's own services only; a signed admin token that claims
      // one is still not a service.
      return {
        ...p,
        account: p.account ?? this.defaultAccount,
        scopes: new Set([...p.scopes].filter((s) => !s.startsWith("internal:"))),
      };
    }
    return this.apiKeyPrincipal(token);
  }

  async authorize(req: IncomingMessage, scope: string): Promise<Principal | KeyPrincipal> {
    const p = await this.authenticate(req);
    requireScope(p, scope);
    return p;
  }

  /** Authenticates, checks the scope, and finds the account the request acts in: what it reaches. */
  async caller(req: IncomingMessage, scope: string): Promise<Reach> {
    const p = await this.authorize(req, scope);
    return this.reachOf(p, await this.actingAccount(p, req));
  }

  /** What a principal reaches when it acts in `account`. */
  reachOf(p: Principal | KeyPrincipal, account: string): Reach {
    return new Reach(this.store, {
      principal: p,
      account,
      policies: "policies" in p ? p.policies : undefined,
    });
  }

  /**
   * The account a request acts in: a key's or an account admin token's own (naming another is
   * refused); for a plane-wide admin token or a service, the account the request names
   * (ACCOUNT_HEADER), else the default one.
   */
  async actingAccount(p: Principal, req: IncomingMessage): Promise<string> {
    const raw = req.headers[ACCOUNT_HEADER];
    if (Array.isArray(raw) || (typeof raw === "string" && raw.includes(",")))
      throw new CallplaneError("BAD_REQUEST", `send one ${ACCOUNT_HEADER} header, naming one account`);
    const named = raw?.trim() || undefined;
    if (p.kind === "service" || p.account === PLANE_WIDE) {
      if (named === undefined) return this.defaultAccount;
      if (!(await this.store.getAccount(named)))
        throw new CallplaneError(
          "ACCOUNT_NOT_FOUND",
          `no account with id ${JSON.stringify(named.slice(0, 64))}; list accounts with \`callplane account list\``,
        );
      return named;
    }
    if (named !== undefined && named !== p.account)
      throw new CallplaneError(
        "ACCOUNT_FORBIDDEN",
        `this ${p.kind === "apikey" ? "API key" : "admin token"} belongs to account ${p.account} and cannot act for another (${ACCOUNT_HEADER}: ${named.slice(0, 64)}); use a key or token of that account, or a plane-wide admin token`,
      );
    return p.account;
  }

  /** The default account's id: keys and tokens that name no account act in it. */
  get defaultAccountId(): string {
    return this.defaultAccount;
  }

  /** An admin token of the whole plane (PLANE_WIDE), for what concerns every account. */
  async requirePlaneAdmin(req: IncomingMessage, what: string): Promise<Principal & { kind: "admin" }> {
    const p = await this.requireAdmin(req, what);
    if (p.account !== PLANE_WIDE)
      throw new CallplaneError(
        "ACCOUNT_FORBIDDEN",
        `${what} needs a plane-wide admin token; this one is for account ${p.account}`,
      );
    return p;
  }

  async requireAdmin(
    req: IncomingMessage,
    what = "managing API keys",
  ): Promise<Principal & { kind: "admin" }> {
    const p = await this.authenticate(req);
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
}
