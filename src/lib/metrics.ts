import { Registry, collectDefaultMetrics, Counter, Histogram, Gauge } from "prom-client";

export { Counter, Histogram, Gauge, Registry };
export type { LabelValues } from "prom-client";

/** Each service instance has its own registry, so several can live in one test process. */
export function createRegistry(service: string, opts: { defaultMetrics?: boolean } = {}): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ service });
  if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: registry });
  return registry;
}

/** Buckets for request latency in seconds, from 0.5 ms to 1 min. */
export const LATENCY_BUCKETS = [
  0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
];
