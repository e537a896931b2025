// The reconcile loop: every syncIntervalMs, reads the desired deployments from the API, starts and
// stops instances (through the backend) until each deployment has its count, hands running ones a
// new secrets revision, and reports. Status changes between syncs are reported as they happen. An
// instance that went away outside the agent (its pod deleted, or Failed) is taken out, reported
// TERMINATED and replaced at once: the next sync starts right away.
import type { Logger } from "../../lib/log.js";
import type { ComputeApiClient } from "./api-client.js";
import type { ComputeBackend, ComputeInstance } from "./backend.js";
import type { DesiredDeployment } from "./deployment.js";
import type { InstanceTable } from "./instance-table.js";
import type { StatusReporter } from "./status-report.js";

export interface ReconcilerDeps<I extends ComputeInstance> {
  api: ComputeApiClient;
  backend: ComputeBackend<I>;
  instances: InstanceTable<I>;
  reporter: StatusReporter<I>;
  syncIntervalMs: number;
  /** compute.workerIdentity.clusterId: a deployment whose spec names clusters runs only on those. */
  clusterId: string;
  logger: Logger;
}

export class Reconciler<I extends ComputeInstance> {
  /** The last sync with the API succeeded (the agent's readiness). */
  lastSyncOk = false;
  private timer: NodeJS.Timeout | undefined;
  private syncing: Promise<void> | undefined;
  private stopped = false;
  /** An instance ended during a sync: sync again right after it. */
  private again = false;
  /** The deployments this agent does not run (another cluster's), each logged once. */
  private readonly skipped = new Set<string>();

  constructor(private readonly deps: ReconcilerDeps<I>) {}

  /** Syncs now, then every syncIntervalMs after the previous sync ended. */
  start(): void {
    this.tick();
  }

  /** No sync starts any more (the sync under way, if any, goes on). */
  halt(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
  }

  /**
   * Halts, and waits for the sync under way and (unless `stops` is false) the instances it was
   * stopping. Pods outlive the agent: their stops are not waited for (their own grace applies, and
   * the next start adopts or finishes what is left).
   */
  async stop(opts: { stops?: boolean } = {}): Promise<void> {
    this.halt();
    await this.syncing;
    if (opts.stops !== false) await this.deps.instances.settled();
  }

  /** An instance's status changed (the backend calls this). */
  readonly instanceChanged = (): void => {
    this.deps.reporter.dirty = true;
    // Fix: once closing, close() sends the last report itself. A status change that came later (an
    // instance's exit noticed after its stop) used to queue one more report behind it, with
    // nothing left in it, which replaced the TERMINATED rows with none.
    if (!this.syncing && !this.stopped) void this.deps.reporter.report().catch(() => undefined);
    if (this.deps.instances.hasEnded()) this.soon();
  };

  /** Syncs now (or right after the sync under way) instead of at the next interval. */
  private soon(): void {
    if (this.stopped) return;
    if (this.syncing) {
      this.again = true;
      return;
    }
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => this.tick(), 0);
  }

  private tick(): void {
    if (this.stopped) return;
    // one sync at a time: a tick during one runs again right after it
    if (this.syncing) {
      this.again = true;
      return;
    }
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.syncing = this.sync()
      .catch((err: unknown) => {
        this.lastSyncOk = false;
        this.deps.logger.warn(
          { err: (err as Error).message },
          "sync with the control plane failed; retrying",
        );
      })
      .finally(() => {
        this.syncing = undefined;
        if (this.deps.reporter.dirty && !this.stopped)
          void this.deps.reporter.report().catch(() => undefined);
        const delay = this.again ? 0 : this.deps.syncIntervalMs;
        this.again = false;
        if (!this.stopped) this.timer = setTimeout(() => this.tick(), delay);
      });
  }

  /**
   * Whether this agent runs the deployment: its first spec names this cluster (or no cluster) and
   * a (gpu, instanceType) this backend offers. Another cluster's deployment is skipped (logged once,
   * not reported); instances of it this agent has are stopped, as for an undeployed one.
   */
  private runsHere(d: DesiredDeployment): boolean {
    const { backend, clusterId, logger } = this.deps;
    const spec = d.specs[0];
    let why: string | undefined;
    if (!spec) why = "it has no deployment specification";
    else if (spec.clusters?.length && !spec.clusters.includes(clusterId))
      why = `it names clusters ${spec.clusters.join(", ")}, not this one (${clusterId})`;
    else if (!backend.offers(spec.gpu, spec.instanceType))
      why = `this cluster (${clusterId}) does not offer instance type ${spec.instanceType} with gpu ${spec.gpu}`;
    if (!why) {
      this.skipped.delete(d.deploymentId);
      return true;
    }
    if (!this.skipped.has(d.deploymentId)) {
      this.skipped.add(d.deploymentId);
      logger.info(
        { deploymentId: d.deploymentId, function: d.name, clusterId, reason: why },
        "deployment skipped: it is another cluster's",
      );
    }
    return false;
  }

  async sync(): Promise<void> {
    const { api, backend, instances, logger } = this.deps;
    const desired = await api.desiredState();
    const deployments = desired.deployments.filter((d) => this.runsHere(d));
    // instances started from now on get what the API says now (a mode switch reaches new workers
    // only; running ones keep what they started with)
    backend.setWorkerNatsEnv(desired.workerNatsEnv ?? {});
    this.lastSyncOk = true;
    const wanted = new Set(deployments.map((d) => d.deploymentId));
    // Stops are not waited for: a pod's takes as long as its grace (minutes), and the next sync must
    // not wait for it. Each one reports when it is done; stop() waits for them.
    const stop = (inst: I) => {
      void instances
        .stop(inst)
        .catch((err: unknown) =>
          logger.warn(
            { instanceId: inst.instanceId, err: (err as Error).message },
            "stopping an instance failed",
          ),
        )
        .finally(this.instanceChanged);
    };
    for (const inst of instances.takeEnded()) {
      logger.info(
        {
          function: inst.deployment.name,
          instanceId: inst.instanceId,
          location: inst.location,
          message: inst.message,
        },
        "instance went away outside the agent: replacing it",
      );
      stop(inst);
    }
    for (const [id, list] of instances.removeUnwanted(wanted)) {
      logger.info({ deploymentId: id, instances: list.length }, "deployment removed: stopping its instances");
      for (const i of list) stop(i);
    }
    for (const d of deployments) {
      const spec = d.specs[0];
      if (!spec) continue;
      const target = backend.instanceCount(spec);
      const list = instances.listOf(d.deploymentId);
      while (list.length < target) {
        const inst = backend.create(d, instances.inUse(), this.instanceChanged);
        list.push(inst);
        // (the log field keeps its name: the local backend's location is the instance's host)
        logger.info(
          { function: d.name, instanceId: inst.instanceId, host: inst.location },
          "starting instance",
        );
        inst.start();
      }
      while (list.length > target) {
        const inst = list.pop()!;
        stop(inst);
      }
      // a secret of the version changed: running instances get the new file
      for (const inst of list) inst.refreshSecrets(d.secretsRevision ?? 0);
    }
    await this.deps.reporter.report();
  }
}
