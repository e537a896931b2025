// The local backend (see local.ts): each instance gets its own address in compute.instanceNetwork,
// its function's secrets from the API in a folder of its own under the agent's secrets root, and a
// worker identity from the identity provider.
import { rmSync } from "node:fs";
import type { Logger } from "../../lib/log.js";
import { cidrHost, parseCidr, type Cidr } from "../../lib/net/index.js";
import type { ComputeApiClient } from "./api-client.js";
import type { ComputeBackend, DeploymentSpec } from "./backend.js";
import type { DesiredDeployment, InstanceEnvironment } from "./deployment.js";
import type { IdentityProvider } from "./identity.js";
import { LocalInstance } from "./local.js";
import { prepareSecretsRoot } from "./secrets.js";

export interface LocalBackendOptions {
  /** compute.instanceNetwork: each instance's address is one of its hosts. */
  instanceNetwork: string;
  instanceEnv: Omit<InstanceEnvironment, "identity" | "workerNatsEnv" | "secrets">;
  /**
   * Where instances get their secrets (compute.secrets): each instance a folder under `root`.
   * Without it, instances get no secrets.
   */
  secrets?: { root: string; env: boolean };
  /** Where each instance's identity comes from. */
  identity: IdentityProvider;
  /** Fetches a version's secrets. */
  api: ComputeApiClient;
  logger: Logger;
}

export class LocalBackend implements ComputeBackend<LocalInstance> {
  readonly name = "local";
  private readonly network: Cidr;
  private readonly instanceEnv: InstanceEnvironment;
  private workerNatsEnv: Record<string, string> = {};

  constructor(private readonly opts: LocalBackendOptions) {
    this.network = parseCidr(opts.instanceNetwork);
    const api = opts.api;
    this.instanceEnv = {
      ...opts.instanceEnv,
      identity: opts.identity,
      workerNatsEnv: () => this.workerNatsEnv,
      ...(opts.secrets
        ? {
            secrets: {
              root: opts.secrets.root,
              env: opts.secrets.env,
              fetch: (fid: string, vid: string) => api.secrets(fid, vid),
            },
          }
        : {}),
    };
  }

  /** The local backend does not scale to zero: it runs minInstances, and at least one. */
  instanceCount(spec: DeploymentSpec): number {
    return Math.min(spec.maxInstances, Math.max(spec.minInstances, 1));
  }

  create(d: DesiredDeployment, inUse: readonly LocalInstance[], onChange: () => void): LocalInstance {
    const slot = this.freeSlot(inUse);
    return new LocalInstance(
      d,
      slot,
      cidrHost(this.network, slot),
      this.instanceEnv,
      this.opts.logger,
      onChange,
    );
  }

  private freeSlot(inUse: readonly LocalInstance[]): number {
    // Fix: slots of stopping instances used to count as free, so a deployment added in the same
    // sync as another was removed got the address still held by the draining processes and its
    // servers failed with EADDRINUSE (reported ERRORED) until the old ones were gone.
    const used = new Set(inUse.map((i) => i.slot));
    for (let n = 1; n < 2 ** (32 - this.network.bits) - 1; n++) if (!used.has(n)) return n;
    throw new Error(`no free address left in ${this.network.text} for another instance`);
  }

  setWorkerNatsEnv(env: Record<string, string>): void {
    this.workerNatsEnv = env;
  }

  prepare(): void {
    const secrets = this.opts.secrets;
    if (!secrets) return;
    const n = prepareSecretsRoot(secrets.root);
    if (n)
      this.opts.logger.info(
        { folders: n, root: secrets.root },
        "removed secrets folders left by an earlier run",
      );
  }

  /** The agent's own secrets folder (stack-<hash>) goes with it; each instance removed its own. */
  dispose(): void {
    if (!this.opts.secrets) return;
    try {
      rmSync(this.opts.secrets.root, { recursive: true, force: true });
    } catch {
      // removed at the next start
    }
  }
}
