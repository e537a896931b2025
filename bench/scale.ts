// Benchmark: throughput and latency of the 1 KiB echo with 1, 2 and 4 invocation replicas. One
// chain with four replicas, all with workers calling back through the callback proxy (what
// `npm start` sets up), the same worker (one process) serving them all; each measurement loads the
// first N replicas at once, one load generator per replica (as clients spread by a Service would),
// the connections split evenly. Throughput is the sum over the generators; p50 is the median of
// theirs and p99 the worst of theirs. Baselines in the same run: straight to the echo server, and
// the one-replica figure for two and four. On a machine with few cores the replicas share them with
// everything else, so more replicas show what the extra processes cost as much as what they add.
import { join } from "node:path";
import { startChain } from "./chain.js";
import { hasWrk, load, machine, median, medianOf, wrk, wrkScript } from "./harness.js";

export interface ScaleBenchOptions {
  seconds: number;
  /** Client connections in all, split over the replicas under load. */
  connections: number;
  rounds: number;
  /** Replica counts to measure (at most 4). */
  replicas: number[];
  workers: number;
  concurrency: number;
}

interface ScaleRun {
  rps: number;
  p50: number;
  p99: number;
  errors: number;
  requests: number;
}

export async function benchScale(o: ScaleBenchOptions): Promise<Record<string, unknown>> {
  const most = Math.max(...o.replicas);
  const chain = await startChain({ workers: o.workers, concurrency: o.concurrency, replicas: most });
  try {
    const body = Buffer.alloc(1024, "x");
    const headers = { "content-type": "application/octet-stream", authorization: `Bearer ${chain.key}` };
    const useWrk = hasWrk();
    const one = async (url: string, h: Record<string, string>, connections: number): Promise<ScaleRun> => {
      if (useWrk) {
        const u = new URL(url);
        const script = wrkScript(
          join(chain.dir, `scale-${u.hostname}.lua`),
          "POST",
          u.pathname,
          h,
          body.length,
        );
        const w = await wrk(u.origin, script, { seconds: o.seconds, connections });
        return { rps: w.rps, p50: w.p50ms, p99: w.p99ms, errors: w.errors, requests: w.requests };
      }
      const r = await load({ url, headers: h, connections, seconds: o.seconds, body });
      return { rps: r.rps, p50: r.p50, p99: r.p99, errors: r.errors + r.non2xx, requests: r.requests };
    };
    const many = async (n: number): Promise<ScaleRun> => {
      const each = Math.max(1, Math.round(o.connections / n));
      const runs = await Promise.all(chain.replicas.slice(0, n).map((r) => one(r.url, headers, each)));
      return {
        rps: Math.round(runs.reduce((s, r) => s + r.rps, 0)),
        p50: median(runs.map((r) => r.p50)),
        p99: Math.max(...runs.map((r) => r.p99)),
        errors: runs.reduce((s, r) => s + r.errors, 0),
        requests: runs.reduce((s, r) => s + r.requests, 0),
      };
    };
    const directUrl = `${chain.echo.url}/echo`;
    const directHeaders = { "content-type": "application/octet-stream" };
    // warm up every replica (JIT, the auth cache, the worker's connections to each)
    await one(directUrl, directHeaders, 8);
    await many(chain.replicas.length);
    const rounds: Array<Record<string, ScaleRun>> = [];
    for (let round = 0; round < Math.max(1, o.rounds); round++) {
      const r: Record<string, ScaleRun> = { direct: await one(directUrl, directHeaders, o.connections) };
      for (const n of o.replicas) r[`replicas${n}`] = await many(n);
      rounds.push(r);
    }
    const results = medianOf(rounds);
    const ratio = (a: string, b: string, metric: "rps" | "p50" | "p99") =>
      Math.round(median(rounds.map((r) => r[a][metric] / r[b][metric])) * 100) / 100;
    const base = `replicas${Math.min(...o.replicas)}`;
    return {
      benchmark: "scale",
      machine: machine(),
      options: o,
      loadgen: useWrk ? "wrk" : "autocannon",
      results,
      ratios: Object.fromEntries(
        o.replicas.map((n) => [
          `replicas${n}`,
          {
            rpsVsDirect: ratio(`replicas${n}`, "direct", "rps"),
            rpsVsOneReplica: ratio(`replicas${n}`, base, "rps"),
            p50VsOneReplica: ratio(`replicas${n}`, base, "p50"),
            p99VsOneReplica: ratio(`replicas${n}`, base, "p99"),
          },
        ]),
      ),
      rounds,
    };
  } finally {
    chain.close();
  }
}
