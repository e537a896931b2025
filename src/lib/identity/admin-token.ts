// Credentials callplane understands, and the checks every service applies:
// - admin tokens: ES256 JWTs verified by public key, from one of two issuers kept apart: the admin
//   token issuer service (`iss` callplane-admin-issuer, its own key pair, trusted only while
//   adminIssuerProxy.enabled) and the stack's admin key (`iss` callplane-admin: the stack's own
//   calls, `callplane admin token`, or an identity provider's key in its place);
// - API keys: opaque `nvapi-` strings, stored only as SHA-256 hashes, shown once;
// - service tokens: opaque `cps-` strings that callplane's own services present to the API; they do
//   not expire with the admin token, so a stack keeps working past hour 12.
import { createPrivateKey, createPublicKey, generateKeyPairSync, randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import {
  SignJWT,
  decodeJwt,
  errors as joseErrors,
  importPKCS8,
  importSPKI,
  jwtVerify,
  type CryptoKey,
  type KeyObject,
} from "jose";
import { CallplaneError } from "../errors.js";
import { writeFileAtomic } from "../fs.js";
import { ADMIN_DEFAULT_SCOPES, PLANE_WIDE, type Principal } from "./scopes.js";

/** The `iss` of tokens from the admin token issuer service (signed with adminIssuerProxy.signingKeyFile). */
export const ADMIN_ISSUER = "callplane-admin-issuer";
/** The `iss` of admin tokens signed with the stack's admin key (auth.adminSigningKeyFile). */
export const STACK_ADMIN_ISSUER = "callplane-admin";
export const ADMIN_AUDIENCE = "callplane-api";
export const ADMIN_ALG = "ES256";

/**
 * Creates the admin signing key pair (EC P-256) when neither file exists, and the public key from
 * the signing key when only that exists (a start that stopped between the two writes). A public key
 * without its signing key is an error, never overwritten: it may be an identity provider's key.
 */
export function ensureAdminKeyPair(
  privateKeyFile: string,
  publicKeyFile: string,
): { created: boolean; derivedPublicKey?: boolean } {
  const [havePrivate, havePublic] = [existsSync(privateKeyFile), existsSync(publicKeyFile)];
  if (havePrivate && havePublic) return { created: false };
  if (havePrivate) {
    const publicKey = createPublicKey(createPrivateKey(readFileSync(privateKeyFile, "utf8")));
    writeFileAtomic(publicKeyFile, publicKey.export({ type: "spki", format: "pem" }).toString(), 0o644);
    return { created: false, derivedPublicKey: true };
  }
  if (havePublic)
    throw new Error(
      `auth.adminPublicKeyFile (${publicKeyFile}) exists but auth.adminSigningKeyFile (${privateKeyFile}) does not: the stack signs admin tokens (the issuer, the demo) and needs the signing key of that pair; give both files, or neither to have a new pair generated`,
    );
  const { privateKey, publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  writeFileAtomic(privateKeyFile, privateKey.export({ type: "pkcs8", format: "pem" }).toString(), 0o600);
  writeFileAtomic(publicKeyFile, publicKey.export({ type: "spki", format: "pem" }).toString(), 0o644);
  return { created: true };
}

export interface AdminTokenSigner {
  sign(opts?: {
    scopes?: readonly string[];
    ttlSeconds?: number;
    subject?: string;
    /** The account the token is for, or PLANE_WIDE (the default). */
    account?: string;
  }): Promise<{
    token: string;
    id: string;
    issuedAt: Date;
    expiresAt: Date;
    scopes: string[];
    account: string;
  }>;
}

export async function createAdminTokenSigner(
  privateKeyPem: string,
  defaultTtlSeconds: number,
  issuer: string = STACK_ADMIN_ISSUER,
): Promise<AdminTokenSigner> {
  const key = await importPKCS8(privateKeyPem, ADMIN_ALG);
  return {
    async sign(opts = {}) {
      const id = randomUUID();
      const issuedAt = new Date(Math.floor(Date.now() / 1000) * 1000);
      const ttl = opts.ttlSeconds ?? defaultTtlSeconds;
      const expiresAt = new Date(issuedAt.getTime() + ttl * 1000);
      const scopes = [...(opts.scopes ?? ADMIN_DEFAULT_SCOPES)];
      const account = opts.account ?? PLANE_WIDE;
      const token = await new SignJWT({ scopes, account })
        .setProtectedHeader({ alg: ADMIN_ALG, typ: "JWT" })
        .setIssuer(issuer)
        .setAudience(ADMIN_AUDIENCE)
        .setSubject(opts.subject ?? (issuer === ADMIN_ISSUER ? "admin-issuer-proxy" : "callplane-admin"))
        .setJti(id)
        .setIssuedAt(issuedAt)
        .setExpirationTime(expiresAt)
        .sign(key);
      return { token, id, issuedAt, expiresAt, scopes, account };
    },
  };
}

export interface AdminTokenVerifier {
  /** The token's principal; `account` is undefined for a token without the claim (the API's default account). */
  verify(
    token: string,
  ): Promise<Omit<Principal & { kind: "admin" }, "account"> & { account: string | undefined }>;
}

export interface TrustedIssuer {
  /** The `iss` a token must carry to be checked against this key. */
  issuer: string;
  publicKeyPem: string;
}

/**
 * Verifies admin tokens against one key per issuer: a token's `iss` picks the key, so a token from
 * one issuer can never pass with another's key. `refused` names issuers whose tokens are refused
 * outright (an issuer that has been turned off), with the reason to give.
 */
export async function createAdminTokenVerifier(
  trusted: readonly TrustedIssuer[],
  refused: Readonly<Record<string, string>> = {},
): Promise<AdminTokenVerifier> {
  const keys = new Map<string, CryptoKey | KeyObject>();
  for (const t of trusted) keys.set(t.issuer, await importSPKI(t.publicKeyPem, ADMIN_ALG));
  const invalid = (cause?: unknown) =>
    new CallplaneError(
      "TOKEN_INVALID",
      "the token is not a valid callplane admin token or API key (bad signature, wrong issuer, or malformed)",
      cause === undefined ? {} : { cause },
    );
  return {
    async verify(token) {
      let iss: unknown;
      try {
        iss = decodeJwt(token).iss;
      } catch (err) {
        throw invalid(err);
      }
      // own properties only: an `iss` of "toString" must not find Object.prototype's
      if (typeof iss === "string" && Object.hasOwn(refused, iss))
        throw new CallplaneError("TOKEN_ISSUER_DISABLED", refused[iss]);
      const key = typeof iss === "string" ? keys.get(iss) : undefined;
      if (!key) throw invalid();
      try {
        const { payload } = await jwtVerify(token, key, {
          algorithms: [ADMIN_ALG],
          issuer: iss as string,
          audience: ADMIN_AUDIENCE,
          requiredClaims: ["exp", "jti", "sub"],
        });
        const scopes = Array.isArray(payload.scopes)
          ? payload.scopes.filter((s): s is string => typeof s === "string")
          : [];
        const account = typeof payload.account === "string" && payload.account ? payload.account : undefined;
        return {
          kind: "admin",
          subject: payload.sub!,
          tokenId: payload.jti!,
          account,
          scopes: new Set(scopes),
          expiresAt: new Date(payload.exp! * 1000),
        };
      } catch (err) {
        if (err instanceof joseErrors.JWTExpired) {
          throw new CallplaneError(
            "TOKEN_EXPIRED",
            "the admin token has expired; get a new one with `callplane init` or from your identity provider",
          );
        }
        throw invalid(err);
      }
    },
  };
}

/** Whether two PEM public keys are the same key (so that two roles do not share one). */
export function samePublicKey(a: string, b: string): boolean {
  const der = (pem: string) => createPublicKey(pem).export({ type: "spki", format: "der" });
  return der(a).equals(der(b));
}

export function looksLikeJwt(token: string): boolean {
  return token.split(".").length === 3;
}
