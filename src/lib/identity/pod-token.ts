// Pod tokens: the service-account tokens a Kubernetes cluster signs for its worker pods, verified by
// the plane offline against the key set the cluster registered (no TokenReview: the plane may not
// reach the cluster's API server, and a registered key set lets it verify without a round trip).
// Upstream verifies the same way but never checks `iss` and admits only its agent's account at the
// base layer; here the base layer checks what every cluster token must be, and the worker layer adds
// what makes it a worker pod's own token. The order of the checks is part of the contract: the size
// before any parse, the audience (which names the cluster) before any key is looked up, the header's
// algorithm before any crypto, so a hostile token costs as little as possible and is refused for the
// first thing wrong with it. Reasons are sentences for an operator's log; they quote (shortened) what
// the token claims but never the token itself.
import { createHash, createPublicKey } from "node:crypto";
import {
  compactVerify,
  decodeJwt,
  decodeProtectedHeader,
  errors as joseErrors,
  importJWK,
  type CryptoKey,
} from "jose";

export const POD_TOKEN_MAX_BYTES = 16_384;
export const POD_TOKEN_ALGORITHMS = ["RS256", "ES256"] as const;
export type PodTokenAlgorithm = (typeof POD_TOKEN_ALGORITHMS)[number];
export const POD_TOKEN_SKEW_SECONDS = 30;
/** A worker pod's service account is `nvcf-worker-<pod name>` (the Kubernetes backend makes one per pod). */
export const WORKER_ACCOUNT_PREFIX = "nvcf-worker-";
export const JWKS_MAX_KEYS = 16;
/** The only audience a cluster's tokens for the plane carry. */
export const clusterAudience = (clusterId: string) => `nvcf-icms:${clusterId}`;
const AUDIENCE_PREFIX = clusterAudience("");
/** A cluster id as the API takes it (PUT /v1/internal/clusters/{clusterId}/...). */
export const CLUSTER_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
const SERVICE_ACCOUNT_SUBJECT = /^system:serviceaccount:([^:]+):([^:]+)$/;

/** A public key as the plane keeps it (RFC 7517 members of RSA and EC public keys only). */
export interface PublicJwk {
  kty: "RSA" | "EC";
  kid: string;
  use?: "sig";
  alg?: PodTokenAlgorithm;
  n?: string;
  e?: string;
  crv?: "P-256";
  x?: string;
  y?: string;
}

export interface Jwks {
  keys: PublicJwk[];
}

/** What the plane has on record for one cluster. */
export interface ClusterKeys {
  clusterId: string;
  /** The cluster's service-account issuer (`--service-account-issuer`), compared exactly with `iss`. */
  issuer: string;
  jwks: Jwks;
}

/** What a verified cluster token says (base layer). Times are seconds since the epoch, as in the JWT. */
export interface ClusterTokenClaims {
  clusterId: string;
  issuer: string;
  subject: string;
  keyId: string;
  algorithm: PodTokenAlgorithm;
  /** Kubernetes always sets iat; the base layer checks it when present but does not require it. */
  issuedAt?: number;
  notBefore?: number;
  expiresAt: number;
  /** The `kubernetes.io` claims, when the token carries them in the expected shape. */
  namespace?: string;
  serviceAccount?: { name: string; uid: string };
  pod?: { name: string; uid: string };
}

/** A worker pod, as its own token proves it. */
export interface PodWorker {
  clusterId: string;
  subject: string;
  namespace: string;
  serviceAccount: { name: string; uid: string };
  pod: { name: string; uid: string };
  expiresAt: number;
}

export type PodTokenFailure =
  | "oversized"
  | "malformed"
  | "audience"
  | "unknown-cluster"
  | "algorithm"
  | "signature"
  | "issuer"
  | "expired"
  | "not-yet-valid"
  | "subject"
  | "not-bound";

export interface PodTokenRefusal {
  ok: false;
  failure: PodTokenFailure;
  /** A sentence an operator understands: what was wrong and where to look. */
  reason: string;
  /** Known once the audience named one. */
  clusterId?: string;
}

export type ClusterKeysLookup = (
  clusterId: string,
) => ClusterKeys | undefined | Promise<ClusterKeys | undefined>;

const refuse = (failure: PodTokenFailure, reason: string, clusterId?: string): PodTokenRefusal =>
  clusterId === undefined ? { ok: false, failure, reason } : { ok: false, failure, reason, clusterId };

/** Quotes a value the token claims, shortened: it goes into log lines and must stay one short line. */
const q = (v: unknown): string => {
  const s = typeof v === "string" ? v : (JSON.stringify(v) ?? String(v));
  return JSON.stringify(s.length > 120 ? `${s.slice(0, 120)}…` : s);
};
const iso = (seconds: number) => new Date(seconds * 1000).toISOString();
const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);
const str = (v: unknown): string | undefined => (typeof v === "string" && v !== "" ? v : undefined);
const nameAndUid = (v: unknown): { name: string; uid: string } | undefined => {
  if (!isObject(v)) return undefined;
  const name = str(v.name);
  const uid = str(v.uid);
  return name && uid ? { name, uid } : undefined;
};

/** A compact JWS: three base64url parts; the signature may be empty (alg none, refused later by name). */
const COMPACT_JWS = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;

// Imported keys are kept per registered key object, so that the callout, which verifies a token per
// connection, does not import the same key each time. A registry must therefore replace a
// cluster's key objects when its keys change, never edit them in place.
const imported = new WeakMap<PublicJwk, Promise<CryptoKey | Uint8Array>>();

/**
 * Base layer: size, audience (exactly one value `nvcf-icms:<clusterId>`), the keys of that cluster
 * via `keysOf`, the header's algorithm (RS256 or ES256 only), the signature by the registered key the
 * header's kid names, `iss` equal to the registered issuer, `exp` required, `exp`/`nbf`/`iat` with
 * `skewSeconds` of clock skew. A throw from `keysOf` is not a refusal: it propagates.
 */
export async function verifyClusterToken(
  token: string,
  keysOf: ClusterKeysLookup,
  opts: { now?: number; skewSeconds?: number } = {},
): Promise<{ ok: true; claims: ClusterTokenClaims } | PodTokenRefusal> {
  const nowSeconds = (opts.now ?? Date.now()) / 1000;
  const skew = opts.skewSeconds ?? POD_TOKEN_SKEW_SECONDS;

  // 1. size, before anything reads the token (length first: it bounds byteLength's work)
  if (typeof token !== "string") return refuse("malformed", "the token is not a string");
  if (token.length > POD_TOKEN_MAX_BYTES || Buffer.byteLength(token) > POD_TOKEN_MAX_BYTES)
    return refuse(
      "oversized",
      `the token is ${Buffer.byteLength(token)} bytes, over the ${POD_TOKEN_MAX_BYTES}-byte limit (a Kubernetes service-account token is about 1 KB): not a pod token`,
    );

  // 2. an unverified parse, only to find the cluster whose keys decide
  const parsed = parseUnverified(token);
  if (!parsed)
    return refuse(
      "malformed",
      "the token is not a signed JWT (three base64url parts: a JSON header, a JSON claims object, a signature)",
    );
  const { header, payload } = parsed;
  const aud: unknown[] =
    payload.aud === undefined ? [] : Array.isArray(payload.aud) ? payload.aud : [payload.aud];
  if (aud.length === 0)
    return refuse(
      "audience",
      `the token names no audience; a worker's token must name exactly one, ${clusterAudience("<clusterId>")} (the audience of the pod's projected token)`,
    );
  if (aud.length > 1)
    return refuse(
      "audience",
      `the token names ${aud.length} audiences (${aud.slice(0, 4).map(q).join(", ")}); a token for the plane must name exactly one, ${clusterAudience("<clusterId>")}, so that no other service accepts it too`,
    );
  const [only] = aud;
  if (typeof only !== "string" || !only.startsWith(AUDIENCE_PREFIX) || only === AUDIENCE_PREFIX)
    return refuse(
      "audience",
      `the token's audience ${q(only)} is not ${clusterAudience("<clusterId>")}: it was requested for another service`,
    );
  const clusterId = only.slice(AUDIENCE_PREFIX.length);
  // (before the lookup: an id no cluster can have costs no query, nor a cache entry, and long ones
  // stay out of the log)
  if (!CLUSTER_ID_PATTERN.test(clusterId))
    return refuse(
      "audience",
      `the token's audience names ${q(clusterId)}, which is not a cluster id (1 to 128 letters, digits, dots, dashes and underscores)`,
    );

  // 3. the cluster's keys and issuer, as registered
  const cluster = await keysOf(clusterId);
  if (!cluster)
    return refuse(
      "unknown-cluster",
      `the token is for cluster ${q(clusterId)}, which has not registered its keys (its compute agent registers them with PUT /v1/internal/clusters/${encodeURIComponent(clusterId)}/keys)`,
      clusterId,
    );

  // 4. the algorithm by name, before any crypto: none and HS* (the public key used as an HMAC
  // secret) are never tried, and neither is anything a Kubernetes issuer does not sign with
  const alg = header.alg;
  if (!(POD_TOKEN_ALGORITHMS as readonly unknown[]).includes(alg))
    return refuse(
      "algorithm",
      alg === "none"
        ? "the token is unsigned (alg none); only RS256 and ES256 signatures are accepted"
        : `the token is signed with ${q(alg)}; only RS256 and ES256 are accepted (what Kubernetes service-account issuers sign with)`,
      clusterId,
    );
  const algorithm = alg as PodTokenAlgorithm;
  // crit extensions (b64: false makes the signed payload something other than the claims just read)
  // are never set by a Kubernetes issuer
  if (header.crit !== undefined)
    return refuse(
      "malformed",
      "the token's header has critical extensions (crit), which cluster tokens never carry",
      clusterId,
    );

  // 5. the key the header names, among the cluster's own (keys embedded in the header, jwk/jku/x5u,
  // are never looked at), and the signature
  const kid = header.kid;
  if (typeof kid !== "string" || kid === "")
    return refuse(
      "signature",
      `the token's header names no key (kid); cluster ${q(clusterId)}'s tokens must (Kubernetes always sets it)`,
      clusterId,
    );
  const jwk = cluster.jwks.keys.find((k) => k.kid === kid);
  if (!jwk)
    return refuse(
      "signature",
      `the token is signed by a key cluster ${q(clusterId)} has not registered (kid ${q(kid)}); after a key rotation, the cluster's compute agent pushes its new keys within keysRefreshSeconds`,
      clusterId,
    );
  const keyAlg: PodTokenAlgorithm = jwk.kty === "RSA" ? "RS256" : "ES256";
  if (keyAlg !== algorithm || (jwk.alg !== undefined && jwk.alg !== algorithm))
    return refuse(
      "algorithm",
      `the token says ${algorithm}, but key ${q(kid)} of cluster ${q(clusterId)} is for ${jwk.alg ?? keyAlg}`,
      clusterId,
    );
  let verified: Uint8Array;
  try {
    let key = imported.get(jwk);
    if (!key) {
      key = importJWK({ ...jwk }, algorithm);
      imported.set(jwk, key);
    }
    ({ payload: verified } = await compactVerify(token, await key, { algorithms: [algorithm] }));
  } catch (err) {
    if (err instanceof joseErrors.JWSSignatureVerificationFailed)
      return refuse(
        "signature",
        `the signature does not verify with key ${q(kid)} registered for cluster ${q(clusterId)}: the token was altered, or signed by another key under the same kid`,
        clusterId,
      );
    if (err instanceof joseErrors.JOSEError)
      return refuse("malformed", `the token's signed parts are not well formed (${err.code})`, clusterId);
    // a registered key jose cannot use (a registry that skipped checkJwks): the plane's fault
    return refuse(
      "signature",
      `key ${q(kid)} registered for cluster ${q(clusterId)} cannot verify ${algorithm} signatures (${(err as Error).message}); re-register the cluster's keys`,
      clusterId,
    );
  }

  // from here on the claims are the signed ones (the same bytes the unverified parse read)
  const claims = JSON.parse(Buffer.from(verified).toString("utf8")) as Record<string, unknown>;

  // 6. the issuer: a cluster's keys vouch for its own issuer only
  if (claims.iss !== cluster.issuer)
    return refuse(
      "issuer",
      `the token was issued by ${q(claims.iss ?? "(no iss)")}, but cluster ${q(clusterId)} is registered with issuer ${q(cluster.issuer)}; if the cluster's --service-account-issuer changed, re-register it`,
      clusterId,
    );

  // 7. the times, with skew for clocks that disagree a little
  const time = (name: "exp" | "nbf" | "iat"): number | undefined | null => {
    const v = claims[name];
    if (v === undefined) return undefined;
    return typeof v === "number" && Number.isFinite(v) ? v : null;
  };
  const exp = time("exp");
  const nbf = time("nbf");
  const iat = time("iat");
  if (exp === undefined)
    return refuse(
      "malformed",
      "the token has no expiry (exp); only expiring tokens are accepted (a legacy service-account token Secret never expires: use the pod's projected token)",
      clusterId,
    );
  if (exp === null || nbf === null || iat === null)
    return refuse("malformed", "the token's exp, nbf or iat is not a number of seconds", clusterId);
  if (nowSeconds > exp + skew)
    return refuse(
      "expired",
      `the token expired at ${iso(exp)} (now ${iso(nowSeconds)}, ${skew} s of clock skew allowed); the kubelet refreshes a pod's token: the worker must read its token file again before connecting`,
      clusterId,
    );
  if (nbf !== undefined && nowSeconds + skew < nbf)
    return refuse(
      "not-yet-valid",
      `the token is not valid before ${iso(nbf)} (now ${iso(nowSeconds)}, ${skew} s of clock skew allowed): the cluster's clock is ahead of the plane's`,
      clusterId,
    );
  if (iat !== undefined && nowSeconds + skew < iat)
    return refuse(
      "not-yet-valid",
      `the token was issued at ${iso(iat)}, in the future (now ${iso(nowSeconds)}, ${skew} s of clock skew allowed): the cluster's clock is ahead of the plane's`,
      clusterId,
    );

  const subject = str(claims.sub);
  if (!subject) return refuse("subject", "the token has no subject (sub)", clusterId);
  const k8s = isObject(claims["kubernetes.io"]) ? claims["kubernetes.io"] : {};
  const namespace = str(k8s.namespace);
  const serviceAccount = nameAndUid(k8s.serviceaccount);
  const pod = nameAndUid(k8s.pod);
  return {
    ok: true,
    claims: {
      clusterId,
      issuer: cluster.issuer,
      subject,
      keyId: kid,
      algorithm,
      ...(iat !== undefined ? { issuedAt: iat } : {}),
      ...(nbf !== undefined ? { notBefore: nbf } : {}),
      expiresAt: exp,
      ...(namespace ? { namespace } : {}),
      ...(serviceAccount ? { serviceAccount } : {}),
      ...(pod ? { pod } : {}),
    },
  };
}

/**
 * Worker layer, on a verified token: the subject is `system:serviceaccount:<ns>:nvcf-worker-<pod>`,
 * the `kubernetes.io` claims agree with it (namespace, account name), and the token is bound to that
 * very pod (a TokenRequest made for the account by anyone else is not bound, or bound elsewhere).
 * Which namespace and which pod uid are right is for the caller (the instance's workerAuth).
 */
export function workerOf(claims: ClusterTokenClaims): { ok: true; worker: PodWorker } | PodTokenRefusal {
  const { clusterId, subject } = claims;
  const m = SERVICE_ACCOUNT_SUBJECT.exec(subject);
  if (!m)
    return refuse(
      "subject",
      `the token's subject ${q(subject)} is not a Kubernetes service account (system:serviceaccount:<namespace>:<name>)`,
      clusterId,
    );
  const [, ns, account] = m;
  if (!account.startsWith(WORKER_ACCOUNT_PREFIX) || account === WORKER_ACCOUNT_PREFIX)
    return refuse(
      "subject",
      `the token belongs to service account ${q(`${ns}/${account}`)}, not a worker pod's (${WORKER_ACCOUNT_PREFIX}<pod>): only a worker pod's own token logs in as that worker`,
      clusterId,
    );
  const podName = account.slice(WORKER_ACCOUNT_PREFIX.length);
  if (claims.namespace !== ns)
    return refuse(
      "subject",
      `the token's subject is in namespace ${q(ns)} but its kubernetes.io namespace claim says ${q(claims.namespace ?? "(none)")}`,
      clusterId,
    );
  if (!claims.serviceAccount)
    return refuse(
      "subject",
      "the token has no kubernetes.io serviceaccount claim (name and uid); a worker's uid is matched against its instance",
      clusterId,
    );
  if (claims.serviceAccount.name !== account)
    return refuse(
      "subject",
      `the token's subject names account ${q(account)} but its kubernetes.io serviceaccount claim says ${q(claims.serviceAccount.name)}`,
      clusterId,
    );
  if (!claims.pod)
    return refuse(
      "not-bound",
      `the token of ${q(`${ns}/${account}`)} is not bound to a pod (no kubernetes.io pod name and uid): a TokenRequest made outside the pod; a worker must use its pod's projected token`,
      clusterId,
    );
  if (claims.pod.name !== podName)
    return refuse(
      "subject",
      `the token is bound to pod ${q(claims.pod.name)}, but its account ${q(account)} is pod ${q(podName)}'s: a pod running under another worker's service account`,
      clusterId,
    );
  return {
    ok: true,
    worker: {
      clusterId,
      subject,
      namespace: ns,
      serviceAccount: claims.serviceAccount,
      pod: claims.pod,
      expiresAt: claims.expiresAt,
    },
  };
}

function parseUnverified(
  token: string,
): { header: Record<string, unknown>; payload: Record<string, unknown> } | undefined {
  if (!COMPACT_JWS.test(token)) return undefined;
  try {
    // decodeJwt insists on a JSON object payload; decodeProtectedHeader on a JSON object header
    return { header: decodeProtectedHeader(token), payload: decodeJwt(token) };
  } catch {
    return undefined;
  }
}

/** The iss and kid of a token, unverified (the compute agent reads its own token's issuer). */
export function unverifiedIssuerAndKid(token: string): { issuer: string; keyId: string } | undefined {
  if (typeof token !== "string" || token.length > POD_TOKEN_MAX_BYTES) return undefined;
  const parsed = parseUnverified(token.trim());
  if (!parsed) return undefined;
  const issuer = str(parsed.payload.iss);
  const keyId = str(parsed.header.kid);
  return issuer && keyId ? { issuer, keyId } : undefined;
}

// Members that only a private or symmetric key has: a set that carries one leaked its secret, and is
// refused rather than cleaned, so the operator learns of it.
const PRIVATE_MEMBERS = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"] as const;
const RSA_MIN_BITS = 2048;
// Above this an RSA verification costs enough to be a lever for whoever registers the key.
const RSA_MAX_BITS = 8192;
const BASE64URL = /^[A-Za-z0-9_-]+$/;

/**
 * Registration input: a JSON Web Key Set the plane will trust. Every problem names the key (index
 * and kid) and what is wrong. Returns the set cleaned to the public members the verifier uses.
 */
export function checkJwks(x: unknown): { ok: true; jwks: Jwks } | { ok: false; problems: string[] } {
  if (!isObject(x) || !Array.isArray(x.keys))
    return { ok: false, problems: ['the key set is not a JSON object with a "keys" array (RFC 7517)'] };
  const keys = x.keys as unknown[];
  if (keys.length === 0) return { ok: false, problems: ["the key set holds no keys"] };
  if (keys.length > JWKS_MAX_KEYS)
    return {
      ok: false,
      problems: [`the key set holds ${keys.length} keys; at most ${JWKS_MAX_KEYS} are accepted`],
    };
  const problems: string[] = [];
  const cleaned: PublicJwk[] = [];
  const seen = new Map<string, number>();
  for (const [i, k] of keys.entries()) {
    if (!isObject(k)) {
      problems.push(`key ${i} is not a JSON object`);
      continue;
    }
    const kid = typeof k.kid === "string" && k.kid !== "" && k.kid.length <= 256 ? k.kid : undefined;
    const name = kid ? `key ${i} (kid ${q(kid)})` : `key ${i}`;
    const before = problems.length;
    const bad = (what: string) => problems.push(`${name} ${what}`);
    if (!kid)
      bad(
        k.kid === undefined
          ? "has no kid; every key needs one, since a token names the key it was signed with"
          : "has a kid that is not a string of 1 to 256 characters",
      );
    else if (seen.has(kid)) bad(`repeats the kid of key ${seen.get(kid)}`);
    else seen.set(kid, i);
    const secret = PRIVATE_MEMBERS.filter((m) => k[m] !== undefined);
    if (secret.length)
      bad(
        `holds private key material (${secret.join(", ")}): register the public key only, and treat this one as leaked`,
      );
    if (k.use !== undefined && k.use !== "sig")
      bad(`has use ${q(k.use)}; a signing key has use "sig" or none`);
    const b64 = (m: string) => typeof k[m] === "string" && BASE64URL.test(k[m]);
    if (k.kty === "RSA") {
      if (k.alg !== undefined && k.alg !== "RS256") bad(`has alg ${q(k.alg)}; an RSA key must be for RS256`);
      if (!b64("n") || !b64("e")) bad("is an RSA key without its modulus and exponent (n, e) in base64url");
    } else if (k.kty === "EC") {
      if (k.alg !== undefined && k.alg !== "ES256") bad(`has alg ${q(k.alg)}; an EC key must be for ES256`);
      if (k.crv !== "P-256")
        bad(`is an EC key on curve ${q(k.crv ?? "(none)")}; only P-256 (ES256) is accepted`);
      else if (!b64("x") || !b64("y")) bad("is an EC key without its coordinates (x, y) in base64url");
    } else {
      bad(`has kty ${q(k.kty ?? "(none)")}; only RSA and EC keys are accepted`);
    }
    if (problems.length > before) continue;
    const jwk: PublicJwk =
      k.kty === "RSA"
        ? { kty: "RSA", kid: kid!, n: k.n as string, e: k.e as string }
        : { kty: "EC", kid: kid!, crv: "P-256", x: k.x as string, y: k.y as string };
    if (k.use !== undefined) jwk.use = "sig";
    if (k.alg !== undefined) jwk.alg = k.alg as PodTokenAlgorithm;
    // node's import checks what member checks cannot: an EC point on the curve, an RSA modulus's size
    let bits: number | undefined;
    try {
      bits = createPublicKey({ key: { ...jwk }, format: "jwk" }).asymmetricKeyDetails?.modulusLength;
    } catch (err) {
      bad(`is not a usable public key (${(err as Error).message})`);
      continue;
    }
    if (jwk.kty === "RSA" && (bits === undefined || bits < RSA_MIN_BITS || bits > RSA_MAX_BITS)) {
      bad(`is a ${bits}-bit RSA key; RS256 keys of ${RSA_MIN_BITS} to ${RSA_MAX_BITS} bits are accepted`);
      continue;
    }
    cleaned.push(jwk);
  }
  return problems.length ? { ok: false, problems } : { ok: true, jwks: { keys: cleaned } };
}

/** A stable hash of a key set (sha256 of its keys sorted by kid, canonical JSON) to tell whether it changed. */
export function jwksHash(jwks: Jwks): string {
  const keys = [...jwks.keys].sort((a, b) => (a.kid < b.kid ? -1 : a.kid > b.kid ? 1 : 0));
  return createHash("sha256").update(canonicalJson(keys)).digest("hex");
}

/** JSON with object members in code-point order at every depth, so equal sets hash equal. */
function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(",")}]`;
  if (isObject(v))
    return `{${Object.keys(v)
      .filter((k) => v[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(v[k])}`)
      .join(",")}}`;
  return JSON.stringify(v);
}
