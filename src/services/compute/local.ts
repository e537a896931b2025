// The local backend: a function instance is two processes on this machine, the inference server
// and a worker agent beside it, on the instance's own loopback address (like a pod's IP), so that
// instances never collide on ports. Both are supervised (restarted with backoff when they die) and
// never detached: stopping the agent stops them.
//
// This module is one instance's lifecycle: its status, its secrets file, its worker identity, and
// starting and stopping it. What runs is deployment.ts; the two processes are
// instance-processes.ts.
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "../../lib/log.js";
import type { InstanceStatus } from "../../lib/instance-status.js";
import { InstanceSecrets } from "./secrets.js";
import { InstanceIdentity } from "./identity.js";
import { distRoot } from "../../lib/paths.js";
import { inferenceCommand, type DesiredDeployment, type InstanceEnvironment } from "./deployment.js";
import { InstanceFolders } from "./instance-folders.js";
import { InstanceProcesses } from "./instance-processes.js";
import { programFilesProblem } from "./instance-user.js";
import type { ComputeInstance, WorkerAuth } from "./backend.js";

// the types a caller of LocalInstance names, where it has always found them
export type { DesiredDeployment, InstanceEnvironment } from "./deployment.js";

export class LocalInstance implements ComputeInstance {
  private id = randomUUID();
  /** Its id; a start attempt after a failed one is a new instance with a new id (a revoked identity stays revoked). */
  get instanceId(): string {
    return this.id;
  }
  status: InstanceStatus = "STARTING";
  message: string | undefined;
  readonly createdAt = new Date().toISOString();
  updatedAt = this.createdAt;
  private stopped = false;
  private secrets: InstanceSecrets | undefined;
  private refreshing: Promise<void> | undefined;
  private wantedRevision = 0;
  private identity: InstanceIdentity | undefined;
  private folders: InstanceFolders | undefined;
  private starting: AbortController | undefined;
  private readonly processes: InstanceProcesses;

  constructor(
    readonly deployment: DesiredDeployment,
    readonly slot: number,
    readonly host: string,
    private readonly env: InstanceEnvironment,
    private readonly logger: Logger,
    private readonly onChange: () => void,
  ) {
    this.processes = new InstanceProcesses(deployment, slot, host, env, {
      status: () => this.status,
      set: (status, message) => this.set(status, message),
    });
  }

  private set(status: InstanceStatus, message?: string): void {
    if (this.status === "TERMINATED") return;
    if (this.status === status && this.message === message) return;
    this.status = status;
    this.message = message;
    this.updatedAt = new Date().toISOString();
    this.logger.info(
      { instanceId: this.instanceId, function: this.deployment.name, host: this.host, status, message },
      `instance ${status}`,
    );
    this.onChange();
  }

  /** Its location, as the agent reports it: its own loopback address. */
  get location(): string {
    return this.host;
  }

  /** The revision of the secrets this instance's file holds (-1: none written yet). */
  get secretsRevision(): number {
    return this.secrets?.revision ?? -1;
  }

  /**
   * Writes the function's secrets into the instance's own folder before its server starts. Until
   * the API answers, the instance stays STARTING (and says why); it is never started without them.
   */
  private async prepareSecrets(): Promise<Record<string, string>> {
    const cfg = this.env.secrets;
    if (!cfg) return {};
    const s = new InstanceSecrets(cfg, this.instanceId, this.env.user());
    this.secrets = s;
    this.wantedRevision = this.deployment.secretsRevision ?? 0;
    let delay = 500;
    while (!this.stopped) {
      try {
        const fetched =
          this.wantedRevision === 0
            ? { revision: 0, values: {}, unreadable: [] }
            : await cfg.fetch(this.deployment.functionId, this.deployment.versionId);
        this.reportUnreadable(fetched.unreadable);
        s.write(fetched);
        if (this.message?.startsWith("waiting for")) this.set("STARTING");
        return s.env();
      } catch (err) {
        this.set(
          "STARTING",
          `waiting for the API to give the instance its secrets: ${(err as Error).message}`,
        );
        await sleep(delay);
        delay = Math.min(delay * 2, 10_000);
      }
    }
    return {};
  }

  private reportUnreadable(list: Array<{ name: string; code: string }>): void {
    if (list.length)
      this.logger.warn(
        { instanceId: this.instanceId, function: this.deployment.name, secrets: list.map((u) => u.name) },
        "some secrets of this version cannot be decrypted; the instance gets the others (see the API log)",
      );
  }

  /** A secret of the version changed: rewrite the running instance's file (not its environment). */
  refreshSecrets(revision: number): void {
    const cfg = this.env.secrets;
    if (!cfg || !this.secrets || this.stopped) return;
    this.wantedRevision = revision;
    if (this.refreshing || this.secrets.revision < 0 || this.secrets.revision === revision) return;
    this.refreshing = (async () => {
      try {
        const fetched = await cfg.fetch(this.deployment.functionId, this.deployment.versionId);
        if (this.stopped) return;
        this.reportUnreadable(fetched.unreadable);
        this.secrets!.write(fetched);
        this.logger.info(
          { instanceId: this.instanceId, function: this.deployment.name, revision: fetched.revision },
          "secrets file refreshed",
        );
      } catch (err) {
        this.logger.warn(
          { instanceId: this.instanceId, err: (err as Error).message },
          "could not refresh the instance's secrets; retrying at the next sync",
        );
      } finally {
        this.refreshing = undefined;
      }
    })();
  }

  /** The worker identifier, while the instance holds an identity (reported as WorkerAuth). */
  get workerIdentifier(): string | undefined {
    return this.status === "TERMINATED" ? undefined : this.identity?.workerIdentifier;
  }

  get workerAuth(): WorkerAuth | undefined {
    const w = this.workerIdentifier;
    return w ? { workerIdentifier: w } : undefined;
  }

  /** Its processes are the agent's children: nothing ends one behind the agent's back. */
  readonly ended = false;

  get tokenFile(): string | undefined {
    return this.identity?.tokenFile;
  }

  start(): void {
    const check = inferenceCommand(this.deployment, this.host, this.env.allowCommand);
    if ("error" in check) {
      this.set("ERRORED", check.error);
      return;
    }
    const unreadable = programFilesProblem(this.env.user(), distRoot);
    if (unreadable) {
      this.set("ERRORED", unreadable);
      return;
    }
    void this.prepareSecrets()
      .then((secretsEnv) => {
        if (!this.stopped) this.launch(secretsEnv);
      })
      .catch((err: unknown) =>
        this.set("ERRORED", `cannot write the instance's secrets: ${(err as Error).message}`),
      );
  }

  private launch(secretsEnv: Record<string, string>): void {
    const d = this.deployment;
    const cmd = inferenceCommand(d, this.host, this.env.allowCommand, secretsEnv);
    if ("error" in cmd) {
      this.set("ERRORED", cmd.error);
      return;
    }
    const ac = new AbortController();
    this.starting = ac;
    void this.provisionAndSpawn(cmd, ac.signal);
  }

  /**
   * Provisions the identity, then starts the processes; a failure to provision starts nothing and
   * is retried with backoff, and a failure after provisioning undoes it before the retry.
   */
  private async provisionAndSpawn(
    cmd: { command: string; args: string[]; env: Record<string, string> },
    signal: AbortSignal,
  ): Promise<void> {
    const d = this.deployment;
    const base = join(this.env.dataDir, "instances", `${d.name}-${this.slot}`);
    // the server's own folders, outside the data folder
    const folders = new InstanceFolders(this.env.instancesRoot, this.instanceId, this.env.user());
    try {
      this.folders = folders;
      folders.create(d.specs[0].maxRequestConcurrency);
    } catch (err) {
      this.set("ERRORED", `cannot make the instance's folders in ${folders.dir}: ${(err as Error).message}`);
      return;
    }
    let delay = this.env.restart.initialMs;
    while (!signal.aborted) {
      const identity = new InstanceIdentity(
        this.env.identity,
        {
          instanceId: this.instanceId,
          functionId: d.functionId,
          versionId: d.versionId,
          deploymentId: d.deploymentId,
        },
        join(base, "identity"),
        this.logger,
      );
      try {
        await identity.provision();
        if (signal.aborted) {
          await identity.cleanup();
          return;
        }
        this.identity = identity;
        this.processes.spawn(cmd, folders, identity.tokenFile, this.instanceId);
        return;
      } catch (err) {
        this.identity = undefined;
        await identity.cleanup();
        this.set(
          "ERRORED",
          `could not provision the worker identity (${this.env.identity.source}), so no worker was started: ${(err as Error).message}; retrying`,
        );
      }
      await sleep(delay, undefined, { signal }).catch(() => undefined);
      if (signal.aborted) return;
      this.id = randomUUID();
      delay = Math.min(delay * 2, this.env.restart.maxMs);
    }
  }

  /** Drains the worker (it finishes in-flight requests), then stops the inference server. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.processes.stopRecovery();
    this.starting?.abort();
    await this.processes.stop(this.env.stopGraceMs);
    await this.refreshing;
    this.secrets?.remove();
    this.folders?.remove();
    await this.identity?.cleanup();
    this.set("TERMINATED");
  }

  /** The process ids of the instance's two processes, when they run (read-only, for tests and diagnostics). */
  get pids(): { inference: number | undefined; worker: number | undefined } {
    return this.processes.pids;
  }

  killNow(): void {
    this.stopped = true;
    this.processes.stopRecovery();
    this.starting?.abort();
    this.processes.killNow();
    try {
      this.secrets?.remove();
      this.folders?.remove();
    } catch {
      // the agent is going away; removeLeftovers() cleans up at its next start
    }
  }
}
