// The worker's own metrics, registered in this order (the scrape lists them so).
import {
  Counter,
  Gauge,
  Histogram,
  LATENCY_BUCKETS,
  createRegistry,
  type LabelValues,
  type Registry,
} from "../../lib/metrics.js";

export interface WorkerMetrics {
  /** callplane_worker_requests_total, by outcome. */
  items: Counter;
  /** callplane_worker_busy_slots: the requests in progress (setting it runs the busy clock). */
  busy: Gauge;
  /** callplane_worker_request_seconds: from pull to ack. */
  duration: Histogram;
}

/**
 * The busy slots gauge, which also integrates busy slot-seconds over time: every change adds the
 * slots that were busy times the time since the last change, so
 * rate(callplane_worker_busy_seconds_total) / callplane_worker_slots is the share of the worker's
 * capacity in use, long requests included while they run (a histogram's sum only counts a request
 * when it ends).
 */
class BusySlots extends Gauge {
  private slots = 0;
  private since = performance.now();
  private seconds = 0;

  override set(labelsOrValue: number | LabelValues<string>, value?: number): void {
    // (the gauge has no labels: only the plain form is ever called)
    const n = typeof labelsOrValue === "number" ? labelsOrValue : (value ?? 0);
    this.advance();
    this.slots = n;
    super.set(n);
  }

  /** The busy slot-seconds so far, the current stretch included. */
  busySeconds(): number {
    this.advance();
    return this.seconds;
  }

  private advance(): void {
    const now = performance.now();
    this.seconds += (this.slots * (now - this.since)) / 1000;
    this.since = now;
  }
}

/** A worker serves one function version: every series it exposes is labelled with it. */
export function workerRegistry(cfg: { functionId: string; functionVersionId: string }): Registry {
  const registry = createRegistry("worker");
  registry.setDefaultLabels({
    service: "worker",
    function_id: cfg.functionId,
    function_version_id: cfg.functionVersionId,
  });
  return registry;
}

export function workerMetrics(registry: Registry, concurrency: number): WorkerMetrics {
  const items = new Counter({
    name: "callplane_worker_requests_total",
    help: "Work messages handled, by outcome",
    labelNames: ["outcome"],
    registers: [registry],
  });
  const busy = new BusySlots({
    name: "callplane_worker_busy_slots",
    help: "Requests in progress (of MAX_REQUEST_CONCURRENCY)",
    registers: [registry],
  });
  new Gauge({
    name: "callplane_worker_slots",
    help: "Requests the worker takes at once (MAX_REQUEST_CONCURRENCY)",
    registers: [registry],
  }).set(concurrency);
  let reported = 0;
  new Counter({
    name: "callplane_worker_busy_seconds_total",
    help: "Busy slot-seconds: the integral of callplane_worker_busy_slots over time",
    registers: [registry],
    collect() {
      const now = busy.busySeconds();
      this.inc(now - reported);
      reported = now;
    },
  });
  const duration = new Histogram({
    name: "callplane_worker_request_seconds",
    help: "From pull to ack",
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  return { items, busy, duration };
}
