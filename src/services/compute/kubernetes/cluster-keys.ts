// Cluster registration, the agent's side: the API verifies worker pods' tokens offline against the
// key set registered for their cluster, so the agent keeps that registration current. At start and
// every compute.kubernetes.keysRefreshSeconds it finds the cluster's issuer and keys from its own
// projected token (issuer-keys.ts) and pushes them (PUT /v1/internal/clusters/{id}/keys) when they
// changed since the API last took them, and at start.
//
// Its proof is that token (audience nvcf-icms:<clusterId>), which the API verifies against the keys
// it already holds, so a rotated key is accepted only from someone the old key vouches for. The
// previous token goes along while it lives: when the kubelet refreshed the agent's token with a new
// key before the agent saw the new set, the current token no longer verifies against the keys on
// record, and the previous one still does. The first keys of a cluster (nothing on record yet), or
// keys after the agent missed a whole rotation, need an admin: enrollmentTokenFile, or an operator.
//
// A look never throws: the agent runs on without registration (workers' tokens of a new key fail
// until it lands), and the next look tries again.
import { jwksHash, type Jwks as VerifiedJwks } from "../../../lib/identity/index.js";
import type { KubeClient } from "../../../lib/kube/index.js";
import type { Logger } from "../../../lib/log.js";
import { ComputeApiError, type ClusterKeysAnswer, type ComputeApiClient } from "../api-client.js";
import {
  KeysFinder,
  readIdentityToken,
  readSmallFile,
  type FoundKeys,
  type IdentityToken,
  type Jwks,
  type KeysSource,
} from "./issuer-keys.js";
import { tokenAudience } from "./pod-spec.js";

/** compute.kubernetes.identityTokenFile's default: where the rendered agent pod mounts its token. */
export const DEFAULT_IDENTITY_TOKEN_FILE = "/var/run/secrets/callplane/identity/token";

/** The refusals an admin's enrollment resolves (errors.md). */
const ENROLLMENT_CODES = new Set(["CLUSTER_NOT_ENROLLED", "CLUSTER_PROOF_REFUSED"]);

/** The agent's settings (compute.kubernetes), and what the cluster's CA is. */
export interface ClusterKeysSettings {
  /** compute.kubernetes.identityTokenFile ("": DEFAULT_IDENTITY_TOKEN_FILE). */
  identityTokenFile: string;
  /** compute.kubernetes.keysRefreshSeconds, in milliseconds. */
  refreshMs: number;
  /** compute.kubernetes.enrollmentTokenFile ("": none). */
  enrollmentTokenFile: string;
  /** The cluster's CA (the KubeClient's): discovery trusts it besides Node's root CAs. */
  caPem: string;
  /** Where OIDC discovery is asked instead of the token's issuer (tests; see KeysFinderOptions). */
  discoveryUrl?: string;
}

export interface ClusterKeysPublisherOptions extends ClusterKeysSettings {
  clusterId: string;
  kube: KubeClient;
  api: Pick<ComputeApiClient, "putClusterKeys">;
  logger: Logger;
}

/** What one look did. */
export type KeysLook =
  | {
      outcome: "pushed";
      issuer: string;
      keyIds: string[];
      via: KeysSource;
      /** proof: the agent's own tokens; enrollment: the admin token of enrollmentTokenFile. */
      credential: "proof" | "enrollment";
      answer: ClusterKeysAnswer;
    }
  | { outcome: "unchanged"; issuer: string; keyIds: string[]; via: KeysSource }
  | { outcome: "failed"; reason: string; code?: string };

/** The set's identity regardless of order and formatting (the API hashes what it registers the same way). */
const setHash = (jwks: Jwks): string => jwksHash(jwks as unknown as VerifiedJwks);

const keyIdsOf = (jwks: Jwks): string[] => jwks.keys.map((k) => k.kid ?? "");

export class ClusterKeysPublisher {
  private readonly finder: KeysFinder;
  private readonly abort = new AbortController();
  private readonly tokenFile: string;
  private current: IdentityToken | undefined;
  private previous: IdentityToken | undefined;
  /** What the API took last (this process): the next push waits for a change. */
  private accepted: { issuer: string; hash: string } | undefined;
  private chain: Promise<unknown> = Promise.resolve();
  private timer: NodeJS.Timeout | undefined;
  private started = false;
  private stopped = false;
  private stopping: Promise<void> | undefined;
  /** The last warning of each kind: a condition that lasts is warned of once, then at debug. */
  private readonly warned = new Map<string, string>();

  constructor(private readonly opts: ClusterKeysPublisherOptions) {
    this.tokenFile = opts.identityTokenFile || DEFAULT_IDENTITY_TOKEN_FILE;
    this.finder = new KeysFinder({
      kube: opts.kube,
      caPem: opts.caPem,
      ...(opts.discoveryUrl !== undefined ? { discoveryUrl: opts.discoveryUrl } : {}),
    });
  }

  /** Looks now, then every refreshMs after each look ends (looks never overlap). */
  start(): void {
    if (this.started || this.stopped) return;
    this.started = true;
    const tick = () =>
      void this.look().then(() => {
        if (this.stopped) return;
        this.timer = setTimeout(tick, this.opts.refreshMs);
        this.timer.unref();
      });
    tick();
  }

  /** One look (after any under way): finds the keys and pushes them when they changed. Never rejects. */
  look(): Promise<KeysLook> {
    const next = this.chain.then(() => this.lookOnce());
    this.chain = next;
    return next;
  }

  /** Stops looking; a request under way is aborted. */
  stop(): Promise<void> {
    return (this.stopping ??= (async () => {
      this.stopped = true;
      if (this.timer) clearTimeout(this.timer);
      this.abort.abort();
      await this.chain;
      await this.finder.close();
    })());
  }

  private async lookOnce(): Promise<KeysLook> {
    if (this.stopped) return { outcome: "failed", reason: "stopped" };
    try {
      return await this.lookAndPush();
    } catch (err) {
      // (nothing above should throw; a look must never end the loop)
      return this.failed("look", `looking at the cluster's keys failed: ${(err as Error).message}`);
    }
  }

  private async lookAndPush(): Promise<KeysLook> {
    const { clusterId, logger } = this.opts;
    let token: IdentityToken;
    try {
      token = this.remember(await readIdentityToken(this.tokenFile));
      this.warned.delete("token");
    } catch (err) {
      return this.failed(
        "token",
        `cannot read the agent's identity token (compute.kubernetes.identityTokenFile): ${(err as Error).message}`,
      );
    }
    const audience = tokenAudience(clusterId);
    if (!token.aud.includes(audience))
      this.warnOnce(
        "audience",
        `the agent's identity token ${this.tokenFile} is for ${JSON.stringify(token.aud)}, not ${audience}: the API refuses it as proof of the cluster; mount a projected token with that audience (the rendered agent pod has one)`,
      );
    else this.warned.delete("audience");

    let found: FoundKeys;
    try {
      found = await this.finder.find(token, this.abort.signal);
      this.warned.delete("keys");
    } catch (err) {
      return this.failed(
        "keys",
        `no usable keys of the issuer ${token.iss}: ${(err as Error).message}; the keys pushed last stay registered`,
      );
    }
    if (found.discoveryError)
      this.warnOnce(
        "discovery",
        `OIDC discovery failed (${found.discoveryError}); the API server's key set holds the token's key and is used instead`,
      );
    else this.warned.delete("discovery");
    const keyIds = keyIdsOf(found.jwks);
    if (token.kid && !keyIds.includes(token.kid))
      this.warnOnce(
        "kid",
        `the issuer's key set (${keyIds.join(", ")}) does not hold the key ${token.kid} that signed the agent's own token: tokens signed with it will not verify`,
      );
    else this.warned.delete("kid");

    const hash = setHash(found.jwks);
    if (this.accepted?.hash === hash && this.accepted.issuer === found.issuer) {
      logger.debug({ clusterId, issuer: found.issuer, keyIds, via: found.via }, "cluster keys unchanged");
      return { outcome: "unchanged", issuer: found.issuer, keyIds, via: found.via };
    }
    return await this.push(found, hash);
  }

  /** The token read now becomes the current one; the one before it stays as the previous. */
  private remember(t: IdentityToken): IdentityToken {
    if (this.current?.token !== t.token) {
      this.previous = this.current;
      this.current = t;
    }
    return this.current;
  }

  /** The current token, and the previous one while it has not expired (newest first). */
  proofs(): string[] {
    const proofs = this.current ? [this.current.token] : [];
    const p = this.previous;
    if (p?.exp !== undefined && p.exp * 1000 > Date.now()) proofs.push(p.token);
    return proofs;
  }

  private async push(found: FoundKeys, hash: string): Promise<KeysLook> {
    const { api, clusterId, enrollmentTokenFile } = this.opts;
    const signal = this.abort.signal;
    const body = { issuer: found.issuer, jwks: found.jwks, proofs: this.proofs() };
    let refusal: ComputeApiError;
    try {
      return this.pushed(found, hash, await api.putClusterKeys(clusterId, body, { signal }), "proof");
    } catch (err) {
      if (!(err instanceof ComputeApiError) || !ENROLLMENT_CODES.has(err.code ?? ""))
        return this.failed(
          "push",
          `the API did not take the cluster's keys: ${(err as Error).message}; retrying at the next look`,
          err instanceof ComputeApiError ? err.code : undefined,
        );
      refusal = err;
    }
    if (!enrollmentTokenFile) return this.failed("push", this.whatToDo(refusal), refusal.code);
    let admin: string;
    try {
      admin = await readSmallFile(enrollmentTokenFile);
    } catch (err) {
      return this.failed(
        "push",
        `the API refused the agent's proof (${refusal.code}), and compute.kubernetes.enrollmentTokenFile cannot be read: ${(err as Error).message}; retrying at the next look`,
        refusal.code,
      );
    }
    try {
      const answer = await api.putClusterKeys(clusterId, body, { signal, bearer: admin });
      return this.pushed(found, hash, answer, "enrollment");
    } catch (err) {
      return this.failed(
        "push",
        `the API refused the agent's proof (${refusal.code}), and the enrollment token of compute.kubernetes.enrollmentTokenFile too: ${(err as Error).message}; retrying at the next look`,
        err instanceof ComputeApiError ? err.code : undefined,
      );
    }
  }

  private whatToDo(refusal: ComputeApiError): string {
    const id = this.opts.clusterId;
    const why =
      refusal.code === "CLUSTER_NOT_ENROLLED"
        ? `the API has no keys of cluster ${id} yet (CLUSTER_NOT_ENROLLED), and takes the first ones only from an admin`
        : `the API refused the agent's proof for cluster ${id} (CLUSTER_PROOF_REFUSED: its keys changed while they were not pushed)`;
    return `${why}: workers' pod tokens of this cluster do not verify until an admin enrolls it: run \`callplane cluster enroll ${id}\`, or give the agent an admin token (scope cluster-management) in compute.kubernetes.enrollmentTokenFile; retrying at the next look (${refusal.message})`;
  }

  private pushed(
    found: FoundKeys,
    hash: string,
    answer: ClusterKeysAnswer,
    credential: "proof" | "enrollment",
  ): KeysLook {
    this.accepted = { issuer: found.issuer, hash };
    this.warned.delete("push");
    const keyIds = keyIdsOf(found.jwks);
    this.opts.logger.info(
      {
        clusterId: this.opts.clusterId,
        issuer: found.issuer,
        keyIds,
        via: found.via,
        credential,
        changed: answer?.changed,
      },
      credential === "enrollment"
        ? "cluster enrolled with the admin token of compute.kubernetes.enrollmentTokenFile: keys pushed to the API"
        : "cluster keys pushed to the API",
    );
    return { outcome: "pushed", issuer: found.issuer, keyIds, via: found.via, credential, answer };
  }

  private failed(kind: string, reason: string, code?: string): KeysLook {
    if (this.stopped) return { outcome: "failed", reason: "stopped" };
    this.warnOnce(kind, reason, code);
    return { outcome: "failed", reason, ...(code ? { code } : {}) };
  }

  private warnOnce(kind: string, message: string, code?: string): void {
    const fields = { clusterId: this.opts.clusterId, ...(code ? { code } : {}) };
    if (this.warned.get(kind) === message) this.opts.logger.debug(fields, message);
    else this.opts.logger.warn(fields, message);
    this.warned.set(kind, message);
  }
}
