// Benchmark: a 1 KiB echo invocation through callplane (client → invocation service → JetStream →
// worker agent → echo server → worker → invocation service → client) against the same request
// sent straight to the echo server, measured in one run on this machine. Two callplane paths: with
// workers calling back through the callback proxy (what `npm start` sets up) and with workers
// calling the replica's pod address directly (in-cluster). Prints throughput with many concurrent
// clients, latency with one client at a time, CPU per invocation per process, and the ratios.
// With several rounds, each round measures every path back to back; the figures are the medians
// over the rounds, and each ratio the median of the rounds' ratios.
import { join } from "node:path";
import { startChain } from "./chain.js";
import { cpuMs, load, loadOnce, machine, medianOf, sequential, type LoadResult } from "./harness.js";

export interface InvokeBenchOptions {
  seconds: number;
  connections: number;
  workers: number;
  concurrency: number;
  rounds: number;
}

const round3 = (x: number) => Math.round(x * 1000) / 1000;

type Throughput = LoadResult & { loadgen: string; cpuMsPerRequest: Record<string, number> };

export async function benchInvoke(o: InvokeBenchOptions): Promise<Record<string, unknown>> {
  const chain = await startChain({ workers: o.workers, concurrency: o.concurrency });
  try {
    const body = Buffer.alloc(1024, "x");
    const headers = { "content-type": "application/octet-stream", authorization: `Bearer ${chain.key}` };
    const paths = {
      direct: { url: `${chain.echo.url}/echo`, headers: { "content-type": "application/octet-stream" } },
      directCallbacks: { url: chain.direct.url, headers },
      viaProxy: { url: chain.viaProxy.url, headers },
    };
    // warm up every path (JIT, connection pools, the auth cache)
    for (const p of Object.values(paths)) await load({ ...p, connections: 8, seconds: 2, body });

    const roles = (name: keyof typeof paths): Record<string, number[]> =>
      name === "direct" ? { echo: [chain.echo.proc.pid!] } : chain.roles(name);
    const throughput = async (name: keyof typeof paths): Promise<Throughput> => {
      const target = paths[name];
      const pids = roles(name);
      // the roles list every process (the callback proxy's HAProxy processes beside its keeper)
      const cpu = (ps: number[]) => ps.reduce((s, p) => s + cpuMs(p), 0);
      const before = Object.fromEntries(Object.entries(pids).map(([k, ps]) => [k, cpu(ps)]));
      const r = await loadOnce({
        ...target,
        body,
        seconds: o.seconds,
        connections: o.connections,
        scriptFile: join(chain.dir, `load-${name}.lua`),
      });
      const per = (ms: number) => Math.round((ms / Math.max(1, r.requests)) * 1000) / 1000;
      return {
        ...r,
        cpuMsPerRequest: {
          loadgen: per(r.loadgenCpuMs),
          ...Object.fromEntries(Object.entries(pids).map(([k, ps]) => [k, per(cpu(ps) - before[k])])),
        },
      };
    };
    const rounds = [];
    for (let r = 0; r < Math.max(1, o.rounds); r++) {
      const latency = {
        direct: await sequential({ ...paths.direct, seconds: o.seconds, body }),
        directCallbacks: await sequential({ ...paths.directCallbacks, seconds: o.seconds, body }),
        viaProxy: await sequential({ ...paths.viaProxy, seconds: o.seconds, body }),
      };
      const tp = {
        direct: await throughput("direct"),
        directCallbacks: await throughput("directCallbacks"),
        viaProxy: await throughput("viaProxy"),
      };
      rounds.push({
        latency,
        throughput: tp,
        addedP50ms: {
          directCallbacks: latency.directCallbacks.p50 - latency.direct.p50,
          viaProxy: latency.viaProxy.p50 - latency.direct.p50,
        },
        ratio: {
          directCallbacks: tp.directCallbacks.rps / tp.direct.rps,
          viaProxy: tp.viaProxy.rps / tp.direct.rps,
          p99: {
            directCallbacks: tp.directCallbacks.p99 / tp.direct.p99,
            viaProxy: tp.viaProxy.p99 / tp.direct.p99,
          },
          latencyP50: {
            directCallbacks: latency.directCallbacks.p50 / latency.direct.p50,
            viaProxy: latency.viaProxy.p50 / latency.direct.p50,
          },
        },
      });
    }
    const m = medianOf(rounds);
    const r3 = (x: Record<string, number>) =>
      Object.fromEntries(Object.entries(x).map(([k, v]) => [k, round3(v)]));
    return {
      benchmark: "invoke",
      machine: machine(),
      options: o,
      latency: { ...m.latency, addedP50ms: r3(m.addedP50ms) },
      throughput: {
        ...m.throughput,
        ratio: { directCallbacks: round3(m.ratio.directCallbacks), viaProxy: round3(m.ratio.viaProxy) },
      },
      ratios: m.ratio,
      rounds,
    };
  } finally {
    chain.close();
  }
}
