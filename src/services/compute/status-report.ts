// Status reporting: the agent's instances, as one snapshot that replaces its previous report at the
// API (PUT /v1/internal/instances), so that `callplane deploy get` shows them; and the instances
// gauge, by status.
import type { Logger } from "../../lib/log.js";
import { Gauge, type Registry } from "../../lib/metrics.js";
import type { ComputeApiClient } from "./api-client.js";
import type { ComputeInstance } from "./backend.js";
import type { InstanceTable } from "./instance-table.js";

export interface StatusReporterDeps<I extends ComputeInstance> {
  api: ComputeApiClient;
  /** Who reports (compute.reporter): the API replaces this reporter's rows only. */
  reporter: string;
  /** Reported as each instance's backend. */
  backend: string;
  instances: InstanceTable<I>;
  registry: Registry;
  logger: Logger;
  /** What proves the report comes from this agent's cluster (backend.reportProofs). */
  proofs?: () => string[];
}

export class StatusReporter<I extends ComputeInstance> {
  /** An instance changed since the last report started. */
  dirty = false;
  private readonly gauge: Gauge;
  private reporting: Promise<void> = Promise.resolve();
  /** The instances the API last refused (another agent reports them), so each refusal is logged once. */
  private refused = "";

  constructor(private readonly deps: StatusReporterDeps<I>) {
    this.gauge = new Gauge({
      name: "callplane_compute_instances",
      help: "Function instances by status",
      labelNames: ["status"],
      registers: [deps.registry],
    });
  }

  // Fix: reports used to run concurrently (one per status change, plus the sync's), and since each
  // replaces the previous one, an older snapshot landing last showed a stale status until the next
  // sync. They now go one at a time, each taking its snapshot when it is its turn.
  report(): Promise<void> {
    const next = this.reporting.then(() => this.send());
    this.reporting = next.catch(() => undefined);
    return next;
  }

  private async send(): Promise<void> {
    this.dirty = false;
    const all = this.deps.instances.takeSnapshot();
    for (const s of ["STARTING", "ACTIVE", "ERRORED"] as const)
      this.gauge.set({ status: s }, all.filter((i) => i.status === s).length);
    const { refused } = await this.deps.api.putInstances(
      {
        reporter: this.deps.reporter,
        instances: all.map((i) => ({
          instanceId: i.instanceId,
          deploymentId: i.deployment.deploymentId,
          functionId: i.deployment.functionId,
          versionId: i.deployment.versionId,
          status: i.status,
          instanceType: i.deployment.specs[0].instanceType,
          gpu: i.deployment.specs[0].gpu,
          backend: this.deps.backend,
          location: i.location,
          ...(i.message ? { message: i.message.slice(0, 2000) } : {}),
          ...(i.workerAuth ? { workerAuth: i.workerAuth } : {}),
          createdAt: i.createdAt,
          updatedAt: i.updatedAt,
        })),
      },
      this.deps.proofs?.() ?? [],
    );
    const ids = refused.map((r) => r.instanceId).join(",");
    if (ids && ids !== this.refused)
      this.deps.logger.warn(
        { reporter: this.deps.reporter, refused },
        "the API kept instances another compute agent reports as that agent reported them: two agents share this reporter's instances (is compute.reporter or compute.workerIdentity.clusterId the same on two agents?)",
      );
    this.refused = ids;
  }
}
