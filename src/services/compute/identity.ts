// An instance's worker identity, as the compute agent holds it: provisioned before the worker starts
// (no identity, no worker), written to the file the worker reads (NVCF_TOKEN_FILE_PATH), refreshed
// in place well before it expires, and undone on stop or on any failure after it was provisioned.
// Undoing tolerates what is already gone (a missing file, an identity the API no longer knows).
import { rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { request } from "undici";
import { writeFileAtomic } from "../../lib/fs.js";
import type { Logger } from "../../lib/log.js";

/** The token sources an instance identity can come from; "" in the configuration means the backend's default. */
export const TOKEN_SOURCES = ["api", "psat"] as const;
export type TokenSource = (typeof TOKEN_SOURCES)[number];

/**
 * An empty setting is the backend's default source, never "no identity" (the seed PR's review
 * gap): the API signs identities for local instances, and on Kubernetes each pod's projected
 * service-account token (psat) is its identity.
 */
export function tokenSource(setting: string, backend: "local" | "kubernetes" = "local"): TokenSource {
  if (setting === "") return backend === "kubernetes" ? "psat" : "api";
  return setting as TokenSource;
}

export interface IssuedIdentity {
  token: string;
  expiresAt: string;
  expiresIn: number;
  workerIdentifier: string;
}

/** Where identities come from (the control-plane API, for the `api` source). */
export interface IdentityProvider {
  readonly source: TokenSource;
  issue(i: {
    instanceId: string;
    functionId: string;
    versionId: string;
    deploymentId: string;
  }): Promise<IssuedIdentity>;
  /** Revokes; an identity the API does not know counts as revoked. */
  revoke(instanceId: string): Promise<void>;
}

/** The `api` source: the control-plane API signs identities; the compute agent asks with its service token. */
export function apiIdentityProvider(opts: { apiUrl: string; serviceToken: string }): IdentityProvider {
  const call = async (method: "POST" | "DELETE", instanceId: string, body?: unknown) => {
    const res = await request(new URL(`/v1/internal/instances/${instanceId}/identity`, opts.apiUrl), {
      method,
      headers: {
        authorization: `Bearer ${opts.serviceToken}`,
        ...(body ? { "content-type": "application/json" } : {}),
      },
      ...(body ? { body: JSON.stringify(body) } : {}),
      headersTimeout: 10_000,
      bodyTimeout: 10_000,
    });
    const text = await res.body.text();
    return { status: res.statusCode, text };
  };
  return {
    source: "api",
    async issue(i) {
      const r = await call("POST", i.instanceId, {
        functionId: i.functionId,
        versionId: i.versionId,
        deploymentId: i.deploymentId,
      });
      if (r.status !== 200)
        throw new Error(`the API refused the identity (${r.status}): ${r.text.slice(0, 300)}`);
      return JSON.parse(r.text) as IssuedIdentity;
    },
    async revoke(instanceId) {
      const r = await call("DELETE", instanceId);
      // 404: never issued, or already forgotten; either way there is nothing left to revoke
      if (r.status !== 200 && r.status !== 404)
        throw new Error(`the API did not revoke the identity (${r.status}): ${r.text.slice(0, 300)}`);
    },
  };
}

export class InstanceIdentity {
  private timer: NodeJS.Timeout | undefined;
  private current: IssuedIdentity | undefined;
  private closed = false;
  readonly tokenFile: string;

  constructor(
    private readonly provider: IdentityProvider,
    private readonly instance: {
      instanceId: string;
      functionId: string;
      versionId: string;
      deploymentId: string;
    },
    dir: string,
    private readonly logger: Logger,
  ) {
    this.tokenFile = join(dir, "token");
  }

  get workerIdentifier(): string | undefined {
    return this.current?.workerIdentifier;
  }

  /** Issues the identity and writes its file; on a failure after the issue, undoes the issue. */
  async provision(): Promise<void> {
    const issued = await this.provider.issue(this.instance);
    try {
      writeFileAtomic(this.tokenFile, issued.token, 0o600);
    } catch (err) {
      await this.cleanup();
      throw new Error(
        `cannot write the worker identity token to ${this.tokenFile}: ${(err as Error).message}`,
        {
          cause: err,
        },
      );
    }
    this.current = issued;
    this.schedule();
  }

  private schedule(): void {
    if (this.closed || !this.current) return;
    const left = Date.parse(this.current.expiresAt) - Date.now();
    // at two thirds of its life, so that a failing refresh has a third of it left to be retried
    const inMs = Math.max(1000, left - (this.current.expiresIn * 1000) / 3);
    this.timer = setTimeout(() => void this.refresh(), inMs);
    this.timer.unref();
  }

  private async refresh(): Promise<void> {
    if (this.closed) return;
    try {
      const next = await this.provider.issue(this.instance);
      if (this.closed) return;
      writeFileAtomic(this.tokenFile, next.token, 0o600);
      this.current = next;
      this.logger.debug(
        { instanceId: this.instance.instanceId, expiresAt: next.expiresAt },
        "worker identity refreshed",
      );
      this.schedule();
    } catch (err) {
      const left = Date.parse(this.current!.expiresAt) - Date.now();
      this.logger.warn(
        { instanceId: this.instance.instanceId, err: (err as Error).message, expiresInMs: left },
        left > 0
          ? "could not refresh the worker identity; retrying before it expires"
          : "the worker identity expired and could not be refreshed; the worker cannot log in to NATS again until it is",
      );
      this.timer = setTimeout(() => void this.refresh(), Math.max(1000, Math.min(30_000, left / 4)));
      this.timer.unref();
    }
  }

  /** Stops refreshing, removes the file and revokes the identity; what is already gone is fine. */
  async cleanup(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    for (const p of [this.tokenFile, dirname(this.tokenFile)]) {
      try {
        rmSync(p, { recursive: true, force: true });
      } catch (err) {
        // gone, or never was a folder (ENOTDIR): nothing of ours is left there
        this.logger.debug({ path: p, err: (err as Error).message }, "nothing to remove");
      }
    }
    try {
      await this.provider.revoke(this.instance.instanceId);
    } catch (err) {
      this.logger.warn(
        { instanceId: this.instance.instanceId, err: (err as Error).message },
        "could not revoke the worker identity at the API; the instance's TERMINATED report revokes it",
      );
    }
  }
}

/**
 * The provider of a token source for local instances. `psat` has none: on Kubernetes the cluster
 * projects each pod's token into it, and the agent issues nothing.
 */
export function identityProvider(
  source: TokenSource,
  opts: { apiUrl: string; serviceToken: string },
): IdentityProvider {
  switch (source) {
    case "api":
      return apiIdentityProvider(opts);
    case "psat":
      throw new Error(
        "the psat token source is a pod's projected service-account token; only the kubernetes backend has pods",
      );
  }
}
