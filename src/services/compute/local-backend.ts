// The local backend (see local.ts): each instance gets its own address in compute.instanceNetwork,
// its function's secrets from the API in a folder of its own under the agent's secrets root, its
// own working and output folders (instance-folders.ts), and a worker identity from the identity
// provider; its inference server runs as the user compute.local.runAs names (instance-user.ts).
import { removeTreeSync } from "../../lib/fs.js";
import type { Logger } from "../../lib/log.js";
import { cidrHost, parseCidr, type Cidr } from "../../lib/net/index.js";
import type { ComputeApiClient } from "./api-client.js";
import { defaultInstanceCount, type ComputeBackend, type DeploymentSpec } from "./backend.js";
import type { BackendFilled, DesiredDeployment, InstanceEnvironment } from "./deployment.js";
import type { IdentityProvider } from "./identity.js";
import { LOCAL_INSTANCE_TYPE, type InstanceTypeOffer } from "./instance-types.js";
import { passMode, prepareAgentRoot } from "./instance-folders.js";
import { resolveInstanceUser, type InstanceUser } from "./instance-user.js";
import { LocalInstance } from "./local.js";
import { prepareSecretsRoot } from "./secrets.js";

export interface LocalBackendOptions {
  /** compute.instanceNetwork: each instance's address is one of its hosts. */
  instanceNetwork: string;
  instanceEnv: Omit<InstanceEnvironment, BackendFilled>;
  /** compute.local: whether local/command may run, and the user servers run as ("": the default). */
  local: { allowCommand: boolean; runAs: string };
  /** Where instances' working and output folders go (instancesRoot() of the data folder). */
  instancesRoot: string;
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
  readonly outlivesAgent = false;
  private readonly network: Cidr;
  private readonly instanceEnv: InstanceEnvironment;
  private workerNatsEnv: Record<string, string> = {};
  private user: InstanceUser | undefined;

  constructor(private readonly opts: LocalBackendOptions) {
    this.network = parseCidr(opts.instanceNetwork);
    const api = opts.api;
    this.instanceEnv = {
      ...opts.instanceEnv,
      identity: opts.identity,
      workerNatsEnv: () => this.workerNatsEnv,
      allowCommand: opts.local.allowCommand,
      user: () => {
        if (!this.user) throw new Error("the local backend was not prepared");
        return this.user;
      },
      instancesRoot: opts.instancesRoot,
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
    return defaultInstanceCount(spec);
  }

  offers(gpu: string, instanceType: string): boolean {
    return gpu === LOCAL_INSTANCE_TYPE.gpu && instanceType === LOCAL_INSTANCE_TYPE.name;
  }

  /** One type, a CPU instance on this machine. */
  offerInstanceTypes(publish: (types: readonly InstanceTypeOffer[]) => void): void {
    publish([LOCAL_INSTANCE_TYPE]);
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

  /**
   * Resolves the servers' user (creating the default one) and prepares the folders; throws what to
   * fix. Nothing is adopted: an earlier run's processes went with it.
   */
  prepare(): Promise<LocalInstance[]> {
    this.prepareFolders();
    return Promise.resolve([]);
  }

  private prepareFolders(): void {
    const { logger, local } = this.opts;
    const user = (this.user = resolveInstanceUser(local.runAs));
    this.logUser(user);
    const mode = passMode(user);
    const left = prepareAgentRoot(this.opts.instancesRoot, mode, "");
    if (left)
      logger.info(
        { folders: left, root: this.opts.instancesRoot },
        "removed instance folders left by an earlier run",
      );
    const secrets = this.opts.secrets;
    if (!secrets) return;
    const n = prepareSecretsRoot(secrets.root, mode);
    if (n) logger.info({ folders: n, root: secrets.root }, "removed secrets folders left by an earlier run");
  }

  /** Says once, at start, what keeps function instances from the stack's keys on this machine. */
  private logUser(user: InstanceUser): void {
    const { logger, local } = this.opts;
    const at = { user: user.name, uid: user.uid, allowCommand: local.allowCommand };
    if (user.switched)
      logger.info(
        at,
        `function instances run as the user ${user.name}, which cannot read the stack's data folder`,
      );
    else if (local.allowCommand)
      logger.warn(
        at,
        "the compute agent does not run as root, so function instances run as its own user and can read everything it can, the stack's keys, MEK and database included; with compute.local.allowCommand on, any function's command can. Turn it off, or run the stack as root (instances then run as an unprivileged user)",
      );
    else
      logger.info(
        at,
        "function instances run as the compute agent's own user (it is not root); only the built-in images run (compute.local.allowCommand is off)",
      );
  }

  /** The agent's own folders (stack-<hash>) go with it; each instance removed its own. */
  dispose(): Promise<void> {
    removeTreeSync([this.opts.instancesRoot, ...(this.opts.secrets ? [this.opts.secrets.root] : [])]);
    return Promise.resolve();
  }
}
