// Per-worker identity (the seed PR #846, for callplane's compute backends): every instance gets a
// short-lived signed token of its own before its worker starts. It plays the part of Kubernetes'
// projected service-account token: audience nvcf-icms:<clusterId>, 900 s by default, in a file the
// worker reads (NVCF_TOKEN_FILE_PATH), refreshed in place before it expires. The control-plane API
// signs it (its own key, used for nothing else) and is the only one that says whether it is still
// good (RFC 7662 introspection): a token whose instance was terminated is refused even before exp.
import {
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  randomUUID,
  type KeyObject,
} from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { SignJWT, errors as joseErrors, jwtVerify } from "jose";
import { writeFileAtomic } from "../fs.js";

export const IDENTITY_ISSUER = "callplane-api";
export const IDENTITY_TYP = "worker-identity+jwt";
export const IDENTITY_ALG = "ES256";
export const identityAudience = (clusterId: string) => `nvcf-icms:${clusterId}`;
/** The worker identifier, as Kubernetes would name the per-pod service account. */
export const workerIdentifier = (instanceId: string) => `nvcf-worker-${instanceId}`;

export interface IdentityClaims {
  instanceId: string;
  functionId: string;
  functionVersionId: string;
  deploymentId: string;
}

export interface VerifiedIdentity extends IdentityClaims {
  subject: string;
  audience: string;
  issuer: string;
  tokenId: string;
  issuedAt: number;
  expiresAt: number;
}

export type IdentityFailure = "expired" | "invalid" | "wrong-audience";

/** Creates the identity signing key when missing (EC P-256, 0600). */
export function ensureIdentityKey(file: string): { created: boolean } {
  if (existsSync(file)) return { created: false };
  const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  writeFileAtomic(file, privateKey.export({ type: "pkcs8", format: "pem" }).toString(), 0o600);
  return { created: true };
}

export class IdentitySigner {
  private readonly privateKey: KeyObject;
  private readonly publicKey: KeyObject;

  constructor(
    privateKeyPem: string,
    readonly clusterId: string,
    readonly ttlSeconds: number,
  ) {
    this.privateKey = createPrivateKey(privateKeyPem);
    this.publicKey = createPublicKey(this.privateKey);
  }

  get audience(): string {
    return identityAudience(this.clusterId);
  }

  async sign(
    c: IdentityClaims,
    now = Date.now(),
  ): Promise<{ token: string; expiresAt: number; tokenId: string }> {
    const iat = Math.floor(now / 1000);
    const exp = iat + this.ttlSeconds;
    const tokenId = randomUUID();
    const token = await new SignJWT({
      instance_id: c.instanceId,
      worker_id: workerIdentifier(c.instanceId),
      function_id: c.functionId,
      function_version_id: c.functionVersionId,
      deployment_id: c.deploymentId,
      token_type: "worker_identity",
    })
      .setProtectedHeader({ alg: IDENTITY_ALG, typ: IDENTITY_TYP })
      .setIssuer(IDENTITY_ISSUER)
      .setAudience(this.audience)
      .setSubject(workerIdentifier(c.instanceId))
      .setJti(tokenId)
      .setIssuedAt(iat)
      .setExpirationTime(exp)
      .sign(this.privateKey);
    return { token, expiresAt: exp, tokenId };
  }

  /** Checks signature, type, issuer, audience and expiry (no leeway beyond 5 s); says why not. */
  async verify(token: string): Promise<VerifiedIdentity | { failure: IdentityFailure; reason: string }> {
    try {
      const { payload, protectedHeader } = await jwtVerify(token, this.publicKey, {
        algorithms: [IDENTITY_ALG],
        issuer: IDENTITY_ISSUER,
        typ: IDENTITY_TYP,
        clockTolerance: 5,
        requiredClaims: ["exp", "iat", "jti", "sub", "aud"],
      });
      void protectedHeader;
      const aud = Array.isArray(payload.aud) ? payload.aud : [payload.aud];
      if (!aud.includes(this.audience))
        return { failure: "wrong-audience", reason: `the token's audience is not ${this.audience}` };
      const str = (k: string) => (typeof payload[k] === "string" ? payload[k] : "");
      const c = {
        instanceId: str("instance_id"),
        functionId: str("function_id"),
        functionVersionId: str("function_version_id"),
        deploymentId: str("deployment_id"),
      };
      if (!c.instanceId || !c.functionVersionId || payload.sub !== workerIdentifier(c.instanceId))
        return { failure: "invalid", reason: "the token lacks the instance or version it names" };
      return {
        ...c,
        subject: payload.sub,
        audience: this.audience,
        issuer: IDENTITY_ISSUER,
        tokenId: payload.jti!,
        issuedAt: payload.iat!,
        expiresAt: payload.exp!,
      };
    } catch (err) {
      if (err instanceof joseErrors.JWTExpired)
        return { failure: "expired", reason: "the token has expired" };
      return {
        failure: "invalid",
        reason: `not a worker identity token of this control plane (${(err as Error).message})`,
      };
    }
  }
}

export function readIdentityKey(file: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (err) {
    throw new Error(
      `cannot read the worker identity signing key at ${file} (auth.workerIdentityKeyFile): ${(err as Error).message}`,
      { cause: err },
    );
  }
}
