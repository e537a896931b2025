// The plane as the API sees it, per deployed function version: the instances wanted and ready,
// and the depth of its work queue. Sampled when /metrics is read (at most once per SAMPLE_MS, every
// gauge of a scrape sharing one sample), never per request.
//
// Why the API samples the queues: it alone has the JetStream API rights to read a consumer
// (permissions.ts: $JS.API.CONSUMER.INFO; invocation and grpc-proxy replicas may only publish,
// purge and delete), it knows every deployed version from its store, and it is one place: N
// front-door replicas would each report the same depth and ask JetStream N times as often. With
// several API replicas each reports the same values; dashboards take max() across them.
//
// The label values are the deployments in the store (created by admins and account owners), not
// anything a request names.
import type { Logger } from "../../lib/log.js";
import { Counter, Gauge, type Registry } from "../../lib/metrics.js";
import type { Store } from "./store/types.js";

/** How long one sample serves (scrapes closer than this share it). */
const SAMPLE_MS = 5_000;
/** How long the queue part of a sample may take; versions not read by then are left out. */
const QUEUE_DEADLINE_MS = 3_000;
/** Consumer reads in flight at once. */
const QUEUE_READS = 8;

export interface QueueSource {
  readonly queuesReadable: boolean;
  queueBacklog(fvid: string): Promise<{ pending: number; ackPending: number } | undefined>;
}

interface VersionSample {
  functionId: string;
  versionId: string;
  desired: number;
  ready: number;
  queue: { pending: number; ackPending: number } | undefined;
}

/** The instance count a deployment spec asks for: as the compute agent reads it (backend.ts). */
function desiredInstances(spec: { minInstances: number; maxInstances: number }): number {
  return Math.min(spec.maxInstances, Math.max(spec.minInstances, 1));
}

export class PlaneMetrics {
  private sample: Promise<VersionSample[]> | undefined;
  private sampledAt = 0;
  private readonly sampleErrors: Counter<"part">;

  constructor(
    registry: Registry,
    private readonly deps: { store: Store; queues: QueueSource; logger: Logger },
  ) {
    const labelNames = ["function_id", "function_version_id"] as const;
    const current = () => this.current();
    const gauge = (name: string, help: string, value: (v: VersionSample) => number | undefined) =>
      new Gauge({
        name,
        help,
        labelNames,
        registers: [registry],
        async collect() {
          const sample = await current();
          this.reset();
          for (const v of sample) {
            const n = value(v);
            if (n !== undefined) this.set({ function_id: v.functionId, function_version_id: v.versionId }, n);
          }
        },
      });
    gauge(
      "callplane_deployment_instances_desired",
      "Instances a deployed function version asks for (per spec: minInstances, at least 1, at most maxInstances; summed)",
      (v) => v.desired,
    );
    gauge(
      "callplane_deployment_instances_ready",
      "Instances of a deployed function version that its compute agents report ACTIVE (pulling work)",
      (v) => v.ready,
    );
    gauge(
      "callplane_queue_depth",
      "Work messages of a function version no worker has taken yet (its JetStream consumer's pending count)",
      (v) => v.queue?.pending,
    );
    gauge(
      "callplane_queue_in_progress",
      "Work messages of a function version a worker has taken and not yet acknowledged",
      (v) => v.queue?.ackPending,
    );
    this.sampleErrors = new Counter({
      name: "callplane_plane_sample_errors_total",
      help: "Samples of the plane that failed, by part (store, queue)",
      labelNames: ["part"],
      registers: [registry],
    });
  }

  /** The current sample: the last one if it is fresh, else a new one (shared by concurrent scrapes). */
  current(): Promise<VersionSample[]> {
    const now = Date.now();
    if (!this.sample || now - this.sampledAt >= SAMPLE_MS) {
      this.sampledAt = now;
      this.sample = this.take().catch((err: unknown) => {
        this.sampleErrors.inc({ part: "store" });
        this.deps.logger.warn({ err: (err as Error).message }, "could not sample deployments for /metrics");
        return [];
      });
    }
    return this.sample;
  }

  private async take(): Promise<VersionSample[]> {
    const { store } = this.deps;
    const [deployments, instances] = await Promise.all([store.listDeployments(), store.listInstances()]);
    const ready = new Map<string, number>();
    for (const i of instances)
      if (i.status === "ACTIVE") ready.set(i.versionId, (ready.get(i.versionId) ?? 0) + 1);
    const out: VersionSample[] = deployments.map((d) => ({
      functionId: d.functionId,
      versionId: d.versionId,
      desired: d.specs.reduce((n, s) => n + desiredInstances(s), 0),
      ready: ready.get(d.versionId) ?? 0,
      queue: undefined,
    }));
    await this.readQueues(out);
    return out;
  }

  /** Reads each version's queue, a few at a time, until the deadline; the rest stay unread. */
  private async readQueues(versions: VersionSample[]): Promise<void> {
    const { queues, logger } = this.deps;
    if (!queues.queuesReadable || versions.length === 0) return;
    const deadline = Date.now() + QUEUE_DEADLINE_MS;
    let next = 0;
    let failed = 0;
    const worker = async () => {
      while (next < versions.length && Date.now() < deadline) {
        const v = versions[next++];
        try {
          v.queue = await queues.queueBacklog(v.versionId);
        } catch (err) {
          failed++;
          if (failed === 1)
            logger.warn(
              { versionId: v.versionId, err: (err as Error).message },
              "could not read a work queue for /metrics",
            );
        }
      }
    };
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.all(Array.from({ length: Math.min(QUEUE_READS, versions.length) }, worker)),
      new Promise<void>((r) => (timer = setTimeout(r, QUEUE_DEADLINE_MS))),
    ]);
    clearTimeout(timer);
    if (failed > 0) this.sampleErrors.inc({ part: "queue" }, failed);
  }
}
