// The worker's own metrics, registered in this order (the scrape lists them so).
import { Counter, Gauge, Histogram, LATENCY_BUCKETS, type Registry } from "../../lib/metrics.js";

export interface WorkerMetrics {
  /** callplane_worker_requests_total, by outcome. */
  items: Counter;
  /** callplane_worker_busy_slots: the requests in progress. */
  busy: Gauge;
  /** callplane_worker_request_seconds: from pull to ack. */
  duration: Histogram;
}

export function workerMetrics(registry: Registry): WorkerMetrics {
  const items = new Counter({
    name: "callplane_worker_requests_total",
    help: "Work messages handled, by outcome",
    labelNames: ["outcome"],
    registers: [registry],
  });
  const busy = new Gauge({
    name: "callplane_worker_busy_slots",
    help: "Requests in progress (of MAX_REQUEST_CONCURRENCY)",
    registers: [registry],
  });
  const duration = new Histogram({
    name: "callplane_worker_request_seconds",
    help: "From pull to ack",
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  return { items, busy, duration };
}
