// API-key checks for the invocation hot path. The control-plane API is asked once per (key,
// function, version) and the answer, grant or refusal, is cached: grants for ttl (never past the
// key's own expiry), refusals for negativeTtl. A revoked key is therefore refused within ttl
// seconds (at most 30, enforced by the config schema). Concurrent misses for the same entry share
// one API call. Keys are held only as SHA-256 hashes.
import { createHash } from "node:crypto";
import { Agent, request } from "undici";
import { CallplaneError, ERROR_CODES, type ErrorCode, type Problem } from "../lib/errors.js";
import type { Logger } from "../lib/log.js";
import { Counter, type Registry } from "../lib/metrics.js";

/**
 * Longer than any API key (callplane's are 54 characters, `nvapi-` and 48 more; NVCF's about 70):
 * a longer bearer value is refused here, for both front doors, before the API is asked (whose
 * refusal would name its own internal field).
 */
export const MAX_API_KEY_LENGTH = 256;

export interface GrantVersion {
  functionVersionId: string;
  defaultInvocationPath: string;
  functionType: string;
}

export interface Grant {
  functionId: string;
  functionName: string;
  /** The account that owns the function. */
  ncaId: string;
  /** The account of the key that called (NVCF's clientNcaId): requests and sessions belong to it. */
  clientNcaId: string;
  subject: string;
  keyId: string;
  keyExpiresAt: string;
  functionVersions: GrantVersion[];
}

interface Entry {
  expires: number;
  grant?: Grant;
  error?: CallplaneError;
  pending?: Promise<Grant>;
}

export interface AuthCacheOptions {
  apiUrl: string;
  serviceToken: string;
  ttlMs: number;
  negativeTtlMs: number;
  maxEntries: number;
  logger: Logger;
  registry: Registry;
}

/** The cache settings as the configuration gives them (invocation.authCache), in seconds. */
export interface AuthCacheSettings {
  ttlSeconds: number;
  negativeTtlSeconds: number;
  maxEntries: number;
}

export const DEFAULT_AUTH_CACHE: AuthCacheSettings = {
  ttlSeconds: 10,
  negativeTtlSeconds: 5,
  maxEntries: 10_000,
};

/** An AuthCache for a front-door service, from its configuration's settings. */
export function createAuthCache(
  opts: { apiUrl: string; serviceToken: string; authCache?: AuthCacheSettings | undefined },
  logger: Logger,
  registry: Registry,
): AuthCache {
  const c = opts.authCache ?? DEFAULT_AUTH_CACHE;
  return new AuthCache({
    apiUrl: opts.apiUrl,
    serviceToken: opts.serviceToken,
    ttlMs: c.ttlSeconds * 1000,
    negativeTtlMs: c.negativeTtlSeconds * 1000,
    maxEntries: c.maxEntries,
    logger,
    registry,
  });
}

export class AuthCache {
  private readonly entries = new Map<string, Entry>();
  private readonly dispatcher = new Agent({ keepAliveTimeout: 30_000, connections: 16 });
  private readonly lookups: Counter;
  private readonly url: string;

  constructor(private readonly opts: AuthCacheOptions) {
    this.url = new URL("/v1/internal/invocation-auth", opts.apiUrl).href;
    this.lookups = new Counter({
      name: "callplane_invocation_auth_lookups_total",
      help: "API-key checks on the invocation path, by result (hit: answered from the cache)",
      labelNames: ["result"],
      registers: [opts.registry],
    });
  }

  async authorize(apiKey: string, functionId: string, functionVersionId?: string): Promise<Grant> {
    if (apiKey.length > MAX_API_KEY_LENGTH) {
      throw new CallplaneError(
        "TOKEN_INVALID",
        `the bearer token in the Authorization header is ${apiKey.length} characters long, longer than any API key (at most ${MAX_API_KEY_LENGTH}); send the API key as it was created (callplane key create)`,
      );
    }
    const key = `${createHash("sha256").update(apiKey).digest("base64")}|${functionId}|${functionVersionId ?? ""}`;
    const now = Date.now();
    const hit = this.entries.get(key);
    if (hit) {
      if (hit.pending) return hit.pending;
      if (hit.expires > now) {
        this.lookups.inc({ result: "hit" });
        if (hit.grant) return hit.grant;
        throw hit.error!;
      }
      this.entries.delete(key);
    }
    this.lookups.inc({ result: "miss" });
    const entry: Entry = { expires: 0 };
    const pending = this.fetchGrant(apiKey, functionId, functionVersionId).then(
      (grant) => {
        entry.pending = undefined;
        entry.grant = grant;
        entry.expires = Math.min(Date.now() + this.opts.ttlMs, Date.parse(grant.keyExpiresAt));
        return grant;
      },
      (err: unknown) => {
        entry.pending = undefined;
        if (err instanceof CallplaneError && err.status < 500) {
          entry.error = err;
          entry.expires = Date.now() + this.opts.negativeTtlMs;
        } else {
          this.entries.delete(key);
        }
        throw err;
      },
    );
    entry.pending = pending;
    this.entries.set(key, entry);
    if (this.entries.size > this.opts.maxEntries) {
      // Map keeps insertion order: drop the oldest tenth
      let drop = Math.ceil(this.opts.maxEntries / 10);
      for (const k of this.entries.keys()) {
        if (drop-- <= 0) break;
        if (k !== key) this.entries.delete(k);
      }
    }
    return pending;
  }

  private async fetchGrant(apiKey: string, functionId: string, functionVersionId?: string): Promise<Grant> {
    let res;
    try {
      res = await request(this.url, {
        method: "POST",
        dispatcher: this.dispatcher,
        headers: { authorization: `Bearer ${this.opts.serviceToken}`, "content-type": "application/json" },
        body: JSON.stringify({
          apiKey,
          functionId,
          ...(functionVersionId !== undefined ? { functionVersionId } : {}),
        }),
        headersTimeout: 10_000,
        bodyTimeout: 10_000,
      });
    } catch (err) {
      throw new CallplaneError(
        "UNAVAILABLE",
        "the control-plane API cannot be reached to check the API key; retry shortly",
        { cause: err },
      );
    }
    const body: unknown = await res.body.json().catch(() => undefined);
    if (res.statusCode === 200) return body as Grant;
    const problem = body as Partial<Problem> | undefined;
    const code: ErrorCode | undefined =
      // own properties only: a code of "toString" is no code
      typeof problem?.code === "string" && Object.hasOwn(ERROR_CODES, problem.code)
        ? problem.code
        : undefined;
    if (code && res.statusCode < 500) {
      throw new CallplaneError(
        code,
        problem?.detail ?? ERROR_CODES[code].title,
        problem?.requiredScope ? { extra: { requiredScope: problem.requiredScope } } : {},
      );
    }
    this.opts.logger.error(
      { status: res.statusCode, problem },
      "the control-plane API failed an invocation auth check",
    );
    throw new CallplaneError(
      "UNAVAILABLE",
      "the control-plane API failed to check the API key; retry shortly",
    );
  }

  private closing: Promise<void> | undefined;

  /**
   * Waits for lookups in flight, then closes the connections. Idempotent: undici rejects a second
   * close() of an agent (it is destroyed once closed) with ClientDestroyedError, and a replica's
   * destroy() after close() would otherwise end in an unhandled rejection.
   */
  close(): Promise<void> {
    this.closing ??= this.dispatcher.close().catch(() => undefined);
    return this.closing;
  }

  /** Aborts lookups in flight, also during a close(). Safe after close(). */
  destroy(): void {
    const destroyed = this.dispatcher.destroy().catch(() => undefined);
    this.closing ??= destroyed;
  }
}
