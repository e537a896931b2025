// What every console page works with: the API's own dependencies (store, auth, worker trust) and
// where the replicas' reports come from.
import type { ApiDeps } from "../routes/deps.js";
import type { ProbeCache } from "./probe-cache.js";
import type { ReportsSource } from "./reports.js";

/** Where a request's spans are read from (request-trace.ts); undefined while tracing is off. */
export type TraceSource = { file: string } | { queryUrl: string } | undefined;

export interface ConsoleDeps {
  api: ApiDeps;
  reports: ReportsSource;
  /** When this API process started (the health page's api row). */
  startedAt: Date;
  /** How long a page waits for the replicas to answer (ReplicaReports.snapshot's waitMs). */
  replicaWaitMs: number;
  /** Certificate files the API can read (the stack CA, ...): the health page shows their expiry. */
  certificateFiles: ReadonlyArray<{ name: string; file: string }>;
  /**
   * Where the callback proxy's /health is (workerCallbackProxy.healthUrl or metricsListen), or why
   * the API cannot ask it; undefined while the proxy is off (no row).
   */
  callbackProxy: { url: string } | { why: string } | undefined;
  /** The health page's probes of other parts, kept a few seconds. */
  probes: ProbeCache;
  /** How long one probe may take. */
  probeTimeoutMs: number;
  /** Where a request's spans are read from (request-trace.ts); undefined: tracing off. */
  traces: TraceSource;
}

export const PAGE_SIZE = 50;

/** A page number from the query (1 when absent or not a positive integer). */
export function pageNumber(raw: string | null): number {
  const n = Number(raw);
  return Number.isInteger(n) && n >= 1 && n <= 1_000_000 ? n : 1;
}

export function formatAge(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 120) return `${s.toFixed(1)} s`;
  const m = s / 60;
  if (m < 120) return `${m.toFixed(0)} min`;
  return `${(m / 60).toFixed(1)} h`;
}

export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v < 10 ? v.toFixed(1) : v.toFixed(0)} ${units[i]}`;
}
