// Where a cluster's service-account keys are found, from the agent's own projected token, as NVCA's
// JWKSUpdater finds them: the token's `iss` (read unverified: the agent only needs to know where to
// look, and the API verifies everything it is sent) names the issuer; its OIDC discovery document
// must name that issuer exactly, and its jwks_uri is the key set. When discovery fails (an issuer
// not reachable from the pod, or not readable anonymously) the API server's own /openid/v1/jwks is
// used instead, but only when it holds the token's key id: a set without it is not the one that
// signs this cluster's tokens (an API server behind an external issuer, say), and pushing it would
// replace good keys with useless ones.
//
// Every request is bounded (a deadline and a size limit): the issuer is outside the agent's control,
// and a look that hangs would hold every later look behind it.
import { open } from "node:fs/promises";
import { rootCertificates } from "node:tls";
import { Agent, request, type Dispatcher } from "undici";
import type { KubeClient } from "../../../lib/kube/index.js";

/** The API refuses larger pod tokens before parsing them; a larger file is not a token. */
export const MAX_TOKEN_BYTES = 16 * 1024;
/** A discovery document or key set larger than this is refused (real ones are a few KiB). */
export const MAX_DOCUMENT_BYTES = 1024 * 1024;
/** Each request's deadline, headers and body together. */
export const REQUEST_TIMEOUT_MS = 10_000;

/** One JSON Web Key, as published (the agent pushes it as it came). */
export interface Jwk {
  kty: string;
  kid?: string;
  [k: string]: unknown;
}
export interface Jwks {
  keys: Jwk[];
}

/** What the agent reads, unverified, from a token. */
export interface IdentityToken {
  token: string;
  iss: string;
  kid: string | undefined;
  /** Seconds since the epoch. */
  exp: number | undefined;
  aud: string[];
}

export type KeysSource = "oidc" | "apiserver";

export interface FoundKeys {
  issuer: string;
  jwks: Jwks;
  via: KeysSource;
  /** Why discovery was passed over, when the key set came from the API server. */
  discoveryError?: string;
}

function jsonPart(part: string | undefined, what: string): Record<string, unknown> {
  try {
    const v = JSON.parse(Buffer.from(part ?? "", "base64url").toString("utf8")) as unknown;
    if (v && typeof v === "object" && !Array.isArray(v)) return v as Record<string, unknown>;
  } catch {
    // (said below)
  }
  throw new Error(`its ${what} is not base64url JSON`);
}

/** The claims the agent needs from a JWT, unverified. */
export function decodeToken(token: string): IdentityToken {
  const parts = token.split(".");
  if (parts.length !== 3) throw new Error("it is not a JWT (three dot-separated parts)");
  const header = jsonPart(parts[0], "header");
  const payload = jsonPart(parts[1], "payload");
  if (typeof payload.iss !== "string" || !payload.iss) throw new Error("it has no iss claim");
  const aud = typeof payload.aud === "string" ? [payload.aud] : Array.isArray(payload.aud) ? payload.aud : [];
  return {
    token,
    iss: payload.iss,
    kid: typeof header.kid === "string" ? header.kid : undefined,
    exp: typeof payload.exp === "number" ? payload.exp : undefined,
    aud: aud.filter((a): a is string => typeof a === "string"),
  };
}

/** A small file's text, trimmed, refused past `limit` bytes (read again each time: the kubelet rotates it). */
export async function readSmallFile(file: string, limit = MAX_TOKEN_BYTES): Promise<string> {
  const fh = await open(file, "r");
  try {
    const buf = Buffer.alloc(limit + 1);
    const { bytesRead } = await fh.read(buf, 0, limit + 1, 0);
    if (bytesRead > limit) throw new Error(`${file} is larger than ${limit} bytes`);
    const text = buf.subarray(0, bytesRead).toString("utf8").trim();
    if (!text) throw new Error(`${file} is empty`);
    return text;
  } finally {
    await fh.close();
  }
}

export async function readIdentityToken(file: string): Promise<IdentityToken> {
  const token = await readSmallFile(file);
  try {
    return decodeToken(token);
  } catch (err) {
    throw new Error(`${file} holds no usable token: ${(err as Error).message}`);
  }
}

function isHttpsUrl(s: string): boolean {
  try {
    return new URL(s).protocol === "https:";
  } catch {
    return false;
  }
}

/** A JWK set's shape (each key typed); anything else is refused before it is pushed. */
function asJwks(v: unknown, from: string): Jwks {
  const keys = (v as { keys?: unknown } | null)?.keys;
  if (
    !Array.isArray(keys) ||
    !keys.every(
      (k) =>
        k &&
        typeof k === "object" &&
        typeof (k as Jwk).kty === "string" &&
        ((k as Jwk).kid === undefined || typeof (k as Jwk).kid === "string"),
    )
  )
    throw new Error(`${from} is not a JWK set ({keys: [{kty, kid?, ...}]})`);
  return { keys: keys as Jwk[] };
}

/** A GET with a deadline and a size limit; answers the parsed JSON of a 200, or throws why not. */
function getJson(
  url: string,
  dispatcher: Dispatcher,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<unknown> {
  return readJson(
    url,
    (deadline) =>
      request(url, {
        method: "GET",
        dispatcher,
        headers,
        signal: deadline,
        headersTimeout: REQUEST_TIMEOUT_MS,
        bodyTimeout: REQUEST_TIMEOUT_MS,
      }),
    signal,
  );
}

/** Sends (`open`, given the request's deadline) and reads the answer: a 200's JSON, at most MAX_DOCUMENT_BYTES. */
async function readJson(
  url: string,
  open: (deadline: AbortSignal) => Promise<Dispatcher.ResponseData>,
  signal: AbortSignal,
): Promise<unknown> {
  let res: Dispatcher.ResponseData;
  try {
    res = await open(AbortSignal.any([signal, AbortSignal.timeout(REQUEST_TIMEOUT_MS)]));
  } catch (err) {
    const code = (err as { code?: string }).code;
    throw new Error(`GET ${url}: ${(err as Error).message}${code ? ` (${code})` : ""}`);
  }
  const body = res.body;
  try {
    // (a redirect is not followed: an issuer answers its documents itself)
    if (res.statusCode !== 200) throw new Error(`GET ${url} answered ${res.statusCode}`);
    if (Number(res.headers["content-length"] ?? 0) > MAX_DOCUMENT_BYTES)
      throw new Error(`GET ${url}: the answer is larger than ${MAX_DOCUMENT_BYTES} bytes`);
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of body as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > MAX_DOCUMENT_BYTES)
        throw new Error(`GET ${url}: the answer is larger than ${MAX_DOCUMENT_BYTES} bytes`);
      chunks.push(chunk);
    }
    try {
      return JSON.parse(Buffer.concat(chunks).toString("utf8")) as unknown;
    } catch {
      throw new Error(`GET ${url}: the answer is not JSON`);
    }
  } finally {
    // an undici body destroyed before its end emits an abort error: with no listener it would crash
    // the agent (a 5xx while the API server restarts took this path)
    if (!body.destroyed) body.on("error", () => undefined).destroy();
  }
}

export interface KeysFinderOptions {
  /** The agent's client of its API server (the fallback's connection and credential). */
  kube: KubeClient;
  /** The cluster's CA: discovery trusts it besides Node's root CAs (an issuer served by the cluster). */
  caPem: string;
  /**
   * Where discovery is asked instead of the token's issuer (tests: a closed port, a stand-in
   * publisher). The document found there must still name the token's issuer.
   */
  discoveryUrl?: string;
}

export class KeysFinder {
  private readonly dispatcher: Agent;

  constructor(private readonly opts: KeysFinderOptions) {
    // `ca` replaces Node's roots rather than adding to them: both are given. A bundle's
    // certificates are passed one by one (bundles joined without a newline between them parse as one).
    const cluster = opts.caPem.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g) ?? [];
    this.dispatcher = new Agent({
      connect: { ca: [...rootCertificates, ...cluster] },
      connections: 2,
      keepAliveTimeout: 10_000,
    });
  }

  /** The issuer's keys (discovery, else the API server's set when it holds the token's kid); throws why none. */
  async find(token: IdentityToken, signal: AbortSignal): Promise<FoundKeys> {
    let discoveryError: string;
    try {
      return { issuer: token.iss, jwks: await this.discover(token.iss, signal), via: "oidc" };
    } catch (err) {
      if (signal.aborted) throw err;
      discoveryError = (err as Error).message;
    }
    try {
      return {
        issuer: token.iss,
        jwks: await this.apiServerKeys(token, signal),
        via: "apiserver",
        discoveryError,
      };
    } catch (err) {
      if (signal.aborted) throw err;
      throw new Error(
        `OIDC discovery failed (${discoveryError}), and the API server's key set is not usable (${(err as Error).message})`,
      );
    }
  }

  private async discover(iss: string, signal: AbortSignal): Promise<Jwks> {
    if (!isHttpsUrl(iss)) throw new Error(`the issuer ${JSON.stringify(iss)} is not an https URL`);
    const base = (this.opts.discoveryUrl ?? iss).replace(/\/+$/, "");
    const url = `${base}/.well-known/openid-configuration`;
    const doc = (await getJson(url, this.dispatcher, { accept: "application/json" }, signal)) as {
      issuer?: unknown;
      jwks_uri?: unknown;
    } | null;
    if (typeof doc?.issuer !== "string" || typeof doc.jwks_uri !== "string")
      throw new Error(`${url} has no issuer or jwks_uri`);
    // OIDC discovery's rule: the document speaks for exactly the issuer it was found under
    if (doc.issuer !== iss)
      throw new Error(
        `${url} names the issuer ${JSON.stringify(doc.issuer)}, not the token's ${JSON.stringify(iss)}`,
      );
    if (!isHttpsUrl(doc.jwks_uri)) throw new Error(`${url}: jwks_uri ${doc.jwks_uri} is not an https URL`);
    // an API server (1.20) answers its set only to this type; other publishers ignore Accept
    const jwks = await getJson(
      doc.jwks_uri,
      this.dispatcher,
      { accept: "application/jwk-set+json, application/json" },
      signal,
    );
    return asJwks(jwks, doc.jwks_uri);
  }

  /** The API server's own set, with the agent's credential (not every cluster lets anyone read it). */
  private async apiServerKeys(token: IdentityToken, signal: AbortSignal): Promise<Jwks> {
    const { kube } = this.opts;
    const path = "/openid/v1/jwks";
    const url = kube.url(path);
    // (1.20 answers 406 to KubeClient's default application/json here)
    const jwks = asJwks(
      await readJson(
        url,
        (deadline) =>
          kube.send("GET", path, {
            accept: "application/jwk-set+json",
            signal: deadline,
            timeoutMs: REQUEST_TIMEOUT_MS,
            bodyTimeoutMs: REQUEST_TIMEOUT_MS,
          }),
        signal,
      ),
      url,
    );
    if (!token.kid) throw new Error("the token names no key id (kid) to look for in it");
    if (!jwks.keys.some((k) => k.kid === token.kid))
      throw new Error(
        `it does not hold the token's key id ${token.kid} (it holds ${jwks.keys.map((k) => k.kid ?? "?").join(", ") || "no key"})`,
      );
    return jwks;
  }

  close(): Promise<void> {
    return this.dispatcher.close();
  }
}
