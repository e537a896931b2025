// Benchmark: what tracing costs. Two chains (bench/chain.ts) run side by side on this machine, the
// same but for tracing: one with it off (nothing of OpenTelemetry is loaded), one with it on as
// `npm start` runs it (observability.tracing on, ratio 1.0: every request recorded, spans appended
// to a span file; the workers the same through CALLPLANE_TRACING_*). A 1 KiB echo invocation,
// callbacks through the callback proxy, is loaded on each in turn within every round (which goes
// first alternates); the figures are the medians over the rounds, the ratio (on ÷ off) the median
// of the rounds' ratios. Issue 23's goal: at most 5% less throughput at ratio 1.0.
import { statSync } from "node:fs";
import { join } from "node:path";
import { startChain, type Chain } from "./chain.js";
import { cpuMs, loadOnce, machine, medianOf } from "./harness.js";

export interface TracingBenchOptions {
  seconds: number;
  connections: number;
  workers: number;
  concurrency: number;
  rounds: number;
}

const round3 = (x: number) => Math.round(x * 1000) / 1000;

interface Measured {
  requests: number;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
  loadgen: string;
  /** CPU per invocation by role (invocation replica, workers, proxy, nats-server, ...), ms. */
  cpuMsPerInvocation: Record<string, number>;
}

async function measure(chain: Chain, o: TracingBenchOptions, label: string): Promise<Measured> {
  const body = Buffer.alloc(1024, "x");
  const headers = { "content-type": "application/octet-stream", authorization: `Bearer ${chain.key}` };
  const pids = chain.roles("viaProxy");
  const cpu = (ps: number[]) => ps.reduce((s, p) => s + cpuMs(p), 0);
  const before = Object.fromEntries(Object.entries(pids).map(([k, ps]) => [k, cpu(ps)]));
  const r = await loadOnce({
    url: chain.viaProxy.url,
    headers,
    body,
    seconds: o.seconds,
    connections: o.connections,
    scriptFile: join(chain.dir, `load-${label}.lua`),
  });
  const per = (ms: number) => round3(ms / Math.max(1, r.requests));
  const byRole = Object.fromEntries(Object.entries(pids).map(([k, ps]) => [k, per(cpu(ps) - before[k])]));
  const total = round3(Object.values(byRole).reduce((s, x) => s + x, 0));
  return {
    requests: r.requests,
    rps: r.rps,
    p50: r.p50,
    p99: r.p99,
    errors: r.errors,
    loadgen: r.loadgen,
    cpuMsPerInvocation: { ...byRole, total },
  };
}

export async function benchTracing(o: TracingBenchOptions): Promise<Record<string, unknown>> {
  const off = await startChain({ workers: o.workers, concurrency: o.concurrency });
  let on: Chain | undefined;
  try {
    const spanFile = join(off.dir, "traces-on", "spans.jsonl");
    on = await startChain({
      workers: o.workers,
      concurrency: o.concurrency,
      serviceEnv: {
        CALLPLANE__OBSERVABILITY__TRACING__ENABLED: "true",
        CALLPLANE__OBSERVABILITY__TRACING__SAMPLE_RATIO: "1",
        CALLPLANE__OBSERVABILITY__TRACING__FILE: spanFile,
      },
      workerEnv: { CALLPLANE_TRACING_FILE: spanFile, CALLPLANE_TRACING_SAMPLE_RATIO: "1" },
    });
    const chains = { off, on };
    // warm up both (JIT, pools, the auth cache)
    for (const c of [off, on]) await measure(c, { ...o, seconds: 2, connections: 8 }, "warm");
    const rounds = [];
    const spanBytes: number[] = [];
    // the file and the one it rotated to: a drop means a rotation dropped the one before
    const written = () => sizeOf(spanFile) + sizeOf(`${spanFile}.1`);
    for (let i = 0; i < Math.max(1, o.rounds); i++) {
      const order: Array<"off" | "on"> = i % 2 === 0 ? ["off", "on"] : ["on", "off"];
      const got: Partial<Record<"off" | "on", Measured>> = {};
      for (const k of order) {
        const b0 = written();
        got[k] = await measure(chains[k], o, k);
        const grew = written() - b0;
        if (k === "on" && grew > 0 && got.on!.requests > 0) spanBytes.push(grew / got.on!.requests);
      }
      rounds.push({
        off: got.off!,
        on: got.on!,
        ratio: {
          rps: got.on!.rps / got.off!.rps,
          p50: got.on!.p50 / got.off!.p50,
          cpuPerInvocation: got.on!.cpuMsPerInvocation.total / got.off!.cpuMsPerInvocation.total,
        },
      });
    }
    const m = medianOf(rounds);
    return {
      benchmark: "tracing",
      machine: machine(),
      options: o,
      off: m.off,
      on: m.on,
      ratios: {
        rps: round3(m.ratio.rps),
        p50: round3(m.ratio.p50),
        cpuPerInvocation: round3(m.ratio.cpuPerInvocation),
      },
      // the span file's growth per traced invocation (rounds where it rotated left out)
      spanFileBytesPerInvocation: spanBytes.length
        ? Math.round(spanBytes.sort((a, b) => a - b)[Math.floor(spanBytes.length / 2)])
        : undefined,
      rounds,
    };
  } finally {
    on?.close();
    off.close();
  }
}

function sizeOf(file: string): number {
  try {
    return statSync(file).size;
  } catch {
    return 0;
  }
}
