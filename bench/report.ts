// `npm run bench` with no benchmark named: every benchmark of the report in one go, one after the
// other on this machine, then bench/RESULTS.md: the machine, the command of each benchmark, and one
// row per figure with its baseline measured in the same run and the ratio between them. Each
// benchmark returns its figures as JSON (kept whole in bench/results/all-<time>.json); the rows are
// read from them here. A benchmark that cannot run (a tool missing and not installable, a failure)
// gets a "not measured" line saying why; no figure is ever made up.
import { readFileSync, writeFileSync } from "node:fs";
import { cpus, loadavg, release, totalmem } from "node:os";
import { join } from "node:path";
import { natsServerBinary } from "../src/lib/nats/index.js";
import { benchConsole, CONSOLE_GOALS, type ConsoleBenchOptions } from "./console.js";
import { benchGrpc, type GrpcBenchOptions } from "./grpc.js";
import { median, stopAll } from "./harness.js";
import { benchInvoke, type InvokeBenchOptions } from "./invoke.js";
import { benchPending, type PendingBenchOptions } from "./pending.js";
import { benchProxy, type ProxyBenchOptions } from "./proxy.js";
import { benchScale, type ScaleBenchOptions } from "./scale.js";
import { benchSse, type SseBenchOptions } from "./sse.js";
import { benchStack, STACK_ROLES, type StackBenchOptions } from "./stack.js";
import { benchStream, type StreamBenchOptions } from "./stream.js";
import { benchTracing, type TracingBenchOptions } from "./tracing.js";
import { ensureTool, versionOf } from "./tools.js";

export interface Profile {
  name: "full" | "quick";
  invoke: InvokeBenchOptions;
  stack: StackBenchOptions;
  stream: StreamBenchOptions;
  sse: SseBenchOptions;
  proxy: ProxyBenchOptions;
  grpc: GrpcBenchOptions;
  scale: ScaleBenchOptions;
  pending: PendingBenchOptions;
  tracing: TracingBenchOptions;
  console: ConsoleBenchOptions;
}

const consoleDefaults = {
  functions: 1000,
  replicas: 2,
  liveClients: [1, 10],
  deployEvery: 50,
  auditEntries: 60,
};

const pendingDefaults = {
  perProcess: 15000,
  concurrency: 1024,
  pollSeconds: 900,
  inflight: 300,
  settleSeconds: 5,
  memoryFloorMiB: 6144,
};

/** The full report (about 20–25 minutes on two cores) and a quick one to try it (about 6–8). */
export const PROFILES: Record<"full" | "quick", Profile> = {
  full: {
    name: "full",
    invoke: { seconds: 5, connections: 32, workers: 1, concurrency: 128, rounds: 3 },
    stack: { seconds: 8, connections: 32, rounds: 3, mib: 1024, idleSeconds: 5 },
    stream: { mib: 1024, rounds: 3, chunked: true },
    sse: { mib: 256, rounds: 3, eventBytes: 1024 },
    proxy: { seconds: 5, connections: 50, largeBytes: 2 ** 20, rounds: 3 },
    grpc: { seconds: 5, streams: 32, connections: 8, perConnection: 8, streamMiB: 64, rounds: 3 },
    scale: { seconds: 5, connections: 32, rounds: 3, replicas: [1, 2, 4], workers: 1, concurrency: 128 },
    pending: { ...pendingDefaults, checkpoints: [10_000, 30_000, 100_000], rampTimeoutSeconds: 300 },
    tracing: { seconds: 5, connections: 32, workers: 1, concurrency: 128, rounds: 3 },
    console: { ...consoleDefaults, inFlight: 10_000, samples: 200, liveSeconds: 20, rampTimeoutSeconds: 300 },
  },
  quick: {
    name: "quick",
    invoke: { seconds: 3, connections: 32, workers: 1, concurrency: 128, rounds: 2 },
    stack: { seconds: 3, connections: 32, rounds: 2, mib: 64, idleSeconds: 3 },
    stream: { mib: 64, rounds: 2, chunked: true },
    sse: { mib: 16, rounds: 2, eventBytes: 1024 },
    proxy: { seconds: 2, connections: 50, largeBytes: 2 ** 20, rounds: 2 },
    grpc: { seconds: 2, streams: 32, connections: 8, perConnection: 8, streamMiB: 16, rounds: 2 },
    scale: { seconds: 3, connections: 32, rounds: 2, replicas: [1, 2, 4], workers: 1, concurrency: 128 },
    pending: { ...pendingDefaults, checkpoints: [2_000, 10_000], rampTimeoutSeconds: 120 },
    tracing: { seconds: 3, connections: 32, workers: 1, concurrency: 128, rounds: 2 },
    console: { ...consoleDefaults, inFlight: 2_000, samples: 30, liveSeconds: 8, rampTimeoutSeconds: 120 },
  },
};

/** The command that runs one benchmark of a profile alone. */
export function commandOf(name: keyof Omit<Profile, "name">, p: Profile): string {
  const o = p[name] as unknown as Record<string, unknown>;
  const flags: Record<string, Record<string, string>> = {
    invoke: {
      seconds: "seconds",
      connections: "connections",
      workers: "workers",
      concurrency: "concurrency",
      rounds: "rounds",
    },
    stack: {
      seconds: "seconds",
      connections: "connections",
      rounds: "rounds",
      mib: "mib",
      idleSeconds: "idle-seconds",
    },
    stream: { mib: "mib", rounds: "rounds" },
    sse: { mib: "mib", rounds: "rounds", eventBytes: "event-bytes" },
    proxy: { seconds: "seconds", connections: "connections", largeBytes: "large-bytes", rounds: "rounds" },
    grpc: {
      seconds: "seconds",
      streams: "streams",
      connections: "connections",
      perConnection: "per-connection",
      streamMiB: "stream-mib",
      rounds: "rounds",
    },
    scale: { seconds: "seconds", connections: "connections", rounds: "rounds", replicas: "replicas" },
    pending: {
      checkpoints: "checkpoints",
      rampTimeoutSeconds: "ramp-timeout",
      memoryFloorMiB: "memory-floor-mib",
    },
    tracing: {
      seconds: "seconds",
      connections: "connections",
      workers: "workers",
      concurrency: "concurrency",
      rounds: "rounds",
    },
    console: {
      functions: "functions",
      inFlight: "in-flight",
      replicas: "replicas",
      samples: "samples",
      liveSeconds: "live-seconds",
      liveClients: "live-clients",
    },
  };
  const args = Object.entries(flags[name]).map(([k, f]) => {
    const v = o[k];
    return `--${f} ${Array.isArray(v) ? v.join(",") : String(v)}`;
  });
  return `npm run bench -- ${name} ${args.join(" ")}`;
}

export interface MachineInfo {
  cpu: string;
  cores: number;
  ramGiB: number;
  os: string;
  kernel: string;
  node: string;
  natsServer: string;
  haproxy: string;
  wrk: string;
  h2load: string;
  curl: string;
  loadavgAtStart: number[];
  loadavgAtEnd?: number[];
}

function machineInfo(): MachineInfo {
  const os = (() => {
    try {
      return /^PRETTY_NAME="?([^"\n]+)"?/m.exec(readFileSync("/etc/os-release", "utf8"))?.[1] ?? "unknown";
    } catch {
      return "unknown";
    }
  })();
  const tool = (t: "haproxy" | "wrk" | "h2load" | "curl", args: string[], re: RegExp) => {
    const path = ensureTool(t);
    if (path instanceof Error) return `missing (${path.message})`;
    return versionOf(path, args, re) ?? "unknown version";
  };
  const nats = (() => {
    try {
      return versionOf(natsServerBinary(), ["--version"], /(v\d+\.\d+\.\d+)/) ?? "unknown version";
    } catch (err) {
      return `missing (${(err as Error).message})`;
    }
  })();
  return {
    cpu: cpus()[0]?.model ?? "unknown",
    cores: cpus().length,
    ramGiB: Math.round(totalmem() / 2 ** 30),
    os,
    kernel: release(),
    node: process.version,
    natsServer: nats,
    haproxy: tool("haproxy", ["-v"], /HAProxy version (\S+)/),
    wrk: tool("wrk", ["-v"], /^(wrk \S+)/m),
    h2load: tool("h2load", ["--version"], /(nghttp2\/\S+)/),
    curl: tool("curl", ["--version"], /^curl (\S+)/m),
    loadavgAtStart: loadavg().map((x) => Math.round(x * 100) / 100),
  };
}

type Result = Record<string, unknown>;
type Outcome = { ok: true; result: Result; seconds: number } | { ok: false; error: string; seconds: number };

export interface Row {
  /** What is measured (the path and the shape of the load). */
  name: string;
  metric: string;
  /** callplane's figure, or the figure of the thing under test in this row. */
  value: number | undefined;
  unit: string;
  baselineName: string;
  baseline: number | undefined;
  /** value / baseline: the median of the rounds' ratios where there are rounds. */
  ratio: number | undefined;
  runs: number;
}

// ----- reading the figures out of each benchmark's JSON -----

const num = (x: unknown): number | undefined => (typeof x === "number" && Number.isFinite(x) ? x : undefined);
const get = (o: unknown, path: string): unknown =>
  path
    .split(".")
    .reduce<unknown>(
      (x, k) => (x && typeof x === "object" ? (x as Record<string, unknown>)[k] : undefined),
      o,
    );
/** The median over the rounds of a / b (each round measured both back to back). */
function roundRatio(rounds: unknown, a: string, b: string): number | undefined {
  if (!Array.isArray(rounds)) return undefined;
  const xs = rounds.map((r) => {
    const x = num(get(r, a));
    const y = num(get(r, b));
    return x !== undefined && y ? x / y : NaN;
  });
  const m = median(xs);
  return Number.isFinite(m) ? m : undefined;
}
const plainRatio = (a: number | undefined, b: number | undefined) =>
  a !== undefined && b ? a / b : undefined;

function rowsInvoke(r: Result, o: InvokeBenchOptions): Row[] {
  const rounds = r.rounds;
  const n = Array.isArray(rounds) ? rounds.length : 1;
  const rows: Row[] = [];
  const paths: Array<[string, string]> = [
    ["viaProxy", "callplane, callbacks through the proxy"],
    ["directCallbacks", "callplane, in-cluster callbacks (no proxy)"],
  ];
  for (const [p, label] of paths) {
    for (const [metric, field, unit] of [
      ["invocations/s", "rps", "/s"],
      ["p50 under load", "p50", "ms"],
      ["p99 under load", "p99", "ms"],
    ] as const)
      rows.push({
        name: `1 KiB echo, ${o.connections} connections (wrk): ${label}`,
        metric,
        value: num(get(r, `throughput.${p}.${field}`)),
        unit,
        baselineName: "direct to the echo server",
        baseline: num(get(r, `throughput.direct.${field}`)),
        ratio: roundRatio(rounds, `throughput.${p}.${field}`, `throughput.direct.${field}`),
        runs: n,
      });
    for (const [metric, field] of [
      ["p50, one client at a time", "p50"],
      ["p99, one client at a time", "p99"],
    ] as const)
      rows.push({
        name: `1 KiB echo, sequential: ${label}`,
        metric,
        value: num(get(r, `latency.${p}.${field}`)),
        unit: "ms",
        baselineName: "direct to the echo server",
        baseline: num(get(r, `latency.direct.${field}`)),
        ratio: roundRatio(rounds, `latency.${p}.${field}`, `latency.direct.${field}`),
        runs: n,
      });
  }
  return rows;
}

function rowsTracing(r: Result, o: TracingBenchOptions): Row[] {
  const rounds = r.rounds;
  const n = Array.isArray(rounds) ? rounds.length : 1;
  const name = `1 KiB echo through the proxy, ${o.connections} connections: tracing on (ratio 1.0, spans to a file)`;
  const rows: Row[] = [];
  for (const [metric, field, unit] of [
    ["invocations/s", "rps", "/s"],
    ["p50 under load", "p50", "ms"],
    ["p99 under load", "p99", "ms"],
    ["CPU ms per invocation", "cpuMsPerInvocation.total", "ms"],
  ] as const)
    rows.push({
      name,
      metric,
      value: num(get(r, `on.${field}`)),
      unit,
      baselineName: "the same chain with tracing off",
      baseline: num(get(r, `off.${field}`)),
      ratio: roundRatio(rounds, `on.${field}`, `off.${field}`),
      runs: n,
    });
  return rows;
}

function rssRows(name: string, results: unknown, path: string, runs: number): Row[] {
  const peaks = get(results, `${path}.peakRssMiB`) as Record<string, number> | undefined;
  const growth = get(results, `${path}.peakGrowthMiB`) as Record<string, number> | undefined;
  if (!peaks) return [];
  return Object.entries(peaks).map(([role, peak]) => {
    const before = growth?.[role] !== undefined ? peak - growth[role] : undefined;
    return {
      name: `${name}: ${role}`,
      metric: "peak RSS",
      value: peak,
      unit: "MiB",
      baselineName: before !== undefined ? "same process before the transfer" : "—",
      baseline: before,
      ratio: plainRatio(peak, before),
      runs,
    };
  });
}

function rowsStream(r: Result, o: StreamBenchOptions): Row[] {
  const runs = o.rounds;
  const size = o.mib >= 1024 ? `${o.mib / 1024} GiB` : `${o.mib} MiB`;
  const rows: Row[] = [];
  for (const [p, label] of [
    ["viaProxy", "callplane, callbacks through the proxy"],
    ["directCallbacks", "callplane, in-cluster callbacks"],
  ] as const)
    rows.push({
      name: `${size} streamed body, echoed (curl, chunked): ${label}`,
      metric: "MB/s each way",
      value: num(get(r, `results.${p}.mbPerSecEachWay`)),
      unit: "MB/s",
      baselineName: "direct to the echo server",
      baseline: num(get(r, "results.echo.mbPerSecEachWay")),
      ratio: num(get(r, p === "viaProxy" ? "ratios.viaProxyVsEcho" : "ratios.directCallbacksVsEcho")),
      runs,
    });
  rows.push(...rssRows(`${size} body through callplane (proxy on)`, r.results, "viaProxy", runs));
  rows.push(...rssRows(`${size} body direct`, r.results, "echo", runs));
  return rows;
}

function rowsStack(r: Result, o: StackBenchOptions): Row[] {
  const rounds = r.rounds;
  const runs = Array.isArray(rounds) ? rounds.length : o.rounds;
  const rows: Row[] = [];
  for (const [shape, label] of [
    ["oneConnection", "1 connection"],
    ["manyConnections", `${o.connections} connections`],
  ] as const)
    for (const [field, metric, unit] of [
      ["rps", "invocations/s", "/s"],
      ["p50", "p50", "ms"],
      ["p99", "p99", "ms"],
    ] as const)
      rows.push({
        name: `1 KiB echo through \`npm start\`'s stack (demo-echo), ${label} (wrk)`,
        metric,
        value: num(get(r, `${shape}.stack.${field}`)),
        unit,
        baselineName: "direct to a plain Node echo server",
        baseline: num(get(r, `${shape}.direct.${field}`)),
        ratio: roundRatio(rounds, `${shape}.stack.${field}`, `${shape}.direct.${field}`),
        runs,
      });
  rows.push({
    name: "1 KiB echo through `npm start`'s stack (demo-echo), 1 connection (wrk)",
    metric: "added p50",
    value: num(r.addedP50ms),
    unit: "ms",
    baselineName: "—",
    baseline: undefined,
    ratio: undefined,
    runs,
  });
  for (const role of [...STACK_ROLES, "total"]) {
    const value = num(get(r, `manyConnections.stack.cpuMsPerInvocation.${role}`));
    if (value === undefined) continue;
    const total = role === "total";
    rows.push({
      name: `CPU per invocation through \`npm start\`'s stack, ${o.connections} connections: ${total ? "all its processes" : role}`,
      metric: "CPU ms per invocation",
      value,
      unit: "ms",
      baselineName: total ? "the plain echo server, per request" : "—",
      baseline: total ? num(get(r, "manyConnections.direct.cpuMsPerInvocation.total")) : undefined,
      ratio: total
        ? roundRatio(
            rounds,
            "manyConnections.stack.cpuMsPerInvocation.total",
            "manyConnections.direct.cpuMsPerInvocation.total",
          )
        : undefined,
      runs,
    });
  }
  for (const role of [...STACK_ROLES, "total"]) {
    const value = num(get(r, `idleCpuMsPerSecond.${role}`));
    if (value === undefined) continue;
    rows.push({
      name: `\`npm start\`'s stack at rest (${o.idleSeconds} s, nothing invoked): ${role === "total" ? "all its processes" : role}`,
      metric: "CPU ms per second",
      value,
      unit: "ms/s",
      baselineName: "—",
      baseline: undefined,
      ratio: undefined,
      runs: 1,
    });
  }
  const size = o.mib >= 1024 ? `${o.mib / 1024} GiB` : `${o.mib} MiB`;
  rows.push({
    name: `${size} streamed body through \`npm start\`'s stack, echoed (chunked, SHA-256 checked)`,
    metric: "MB/s each way",
    value: num(get(r, "stream.stack.mbPerSecEachWay")),
    unit: "MB/s",
    baselineName: "direct to the plain Node echo server",
    baseline: num(get(r, "stream.direct.mbPerSecEachWay")),
    ratio: roundRatio(rounds, "stream.stack.mbPerSecEachWay", "stream.direct.mbPerSecEachWay"),
    runs,
  });
  rows.push({
    name: `${size} streamed body through \`npm start\`'s stack: all its processes`,
    metric: "peak RSS growth (sum)",
    value: num(get(r, "stream.stack.totalPeakGrowthMiB")),
    unit: "MiB",
    baselineName: "the plain echo server, same body",
    baseline: num(get(r, "stream.direct.peakGrowthMiB")),
    ratio: undefined,
    runs,
  });
  rows.push(...rssRows(`${size} body through \`npm start\`'s stack`, r.stream, "stack", runs));
  return rows;
}

function rowsSse(r: Result, o: SseBenchOptions): Row[] {
  const rows: Row[] = [];
  for (const [p, label] of [
    ["viaProxy", "callplane, callbacks through the proxy"],
    ["directCallbacks", "callplane, in-cluster callbacks"],
  ] as const)
    rows.push({
      name: `SSE, ${o.mib} MiB of ${o.eventBytes} B events as fast as read (curl): ${label}`,
      metric: "MB/s",
      value: num(get(r, `results.${p}.mbPerSec`)),
      unit: "MB/s",
      baselineName: "direct to the example server",
      baseline: num(get(r, "results.echo.mbPerSec")),
      ratio: num(get(r, p === "viaProxy" ? "ratios.viaProxyVsEcho" : "ratios.directCallbacksVsEcho")),
      runs: o.rounds,
    });
  rows.push(...rssRows("SSE through callplane (proxy on)", r.results, "viaProxy", o.rounds));
  rows.push(...rssRows("SSE direct", r.results, "echo", o.rounds));
  return rows;
}

function rowsProxy(r: Result, o: ProxyBenchOptions): Row[] {
  const rounds = r.rounds;
  const runs = Array.isArray(rounds) ? rounds.length : o.rounds;
  const rows: Row[] = [];
  const mib = o.largeBytes / 2 ** 20;
  const scenarios = [
    ["small", `small callbacks (POST 100 B, ${o.connections} connections, wrk)`, "rps", "callbacks/s", "/s"],
    ["small", `small callbacks (POST 100 B, ${o.connections} connections, wrk)`, "p99ms", "p99", "ms"],
    [
      "small",
      `small callbacks (POST 100 B, ${o.connections} connections, wrk)`,
      "cpuUsPerRequest",
      "proxy CPU per callback",
      "µs",
    ],
    ["largeDown", `large responses (GET ${mib} MiB, 8 connections)`, "mbPerSec", "MB/s", "MB/s"],
    ["largeUp", `large uploads (POST ${mib} MiB, 8 connections)`, "rps", "MiB/s (uploads/s × size)", "MiB/s"],
  ] as const;
  for (const [sc, label, field, metric, unit] of scenarios) {
    const factor = sc === "largeUp" ? mib : 1;
    const value = (p: string) => {
      const v = num(get(r, `results.${sc}.${p}.${field}`));
      return v === undefined ? undefined : v * factor;
    };
    rows.push({
      name: `callback proxy, ${label}: callplane (HAProxy, callplane's configuration)`,
      metric,
      value: value("callplane"),
      unit,
      baselineName: "HAProxy, same job and certificates",
      baseline: value("haproxy"),
      ratio: roundRatio(rounds, `${sc}.callplane.${field}`, `${sc}.haproxy.${field}`),
      runs,
    });
    // not a proxy: a bare node:tls byte pipe (bench/tls-pipe.ts), the ceiling for any proxy on Node's TLS
    rows.push({
      name: `callback proxy, ${label}: Node TLS pipe (no HTTP, the node:tls ceiling)`,
      metric,
      value: value("nodeTlsPipe"),
      unit,
      baselineName: "HAProxy, same job and certificates",
      baseline: value("haproxy"),
      ratio: roundRatio(rounds, `${sc}.nodeTlsPipe.${field}`, `${sc}.haproxy.${field}`),
      runs,
    });
    if (field === "cpuUsPerRequest") continue;
    for (const p of ["callplane", "haproxy"])
      rows.push({
        name: `callback proxy, ${label}: ${p === "haproxy" ? "HAProxy" : "callplane"}`,
        metric,
        value: value(p),
        unit,
        baselineName: "direct to the pod (TLS)",
        baseline: value("direct"),
        ratio: roundRatio(rounds, `${sc}.${p}.${field}`, `${sc}.direct.${field}`),
        runs,
      });
  }
  return rows;
}

function rowsGrpc(r: Result, o: GrpcBenchOptions): Row[] {
  const rounds = r.rounds;
  const runs = Array.isArray(rounds) ? rounds.length : o.rounds;
  const rows: Row[] = [];
  const shapes = [
    ["oneAtATime", "one call at a time"],
    ["oneConnection", `one connection, ${o.streams} concurrent calls`],
    ["manyConnections", `${o.connections} connections × ${o.perConnection} calls`],
  ] as const;
  for (const [p, label] of [
    ["callplane", "callplane (tunnel through the callback proxy)"],
    ["inCluster", "callplane, in-cluster tunnel"],
  ] as const) {
    for (const [shape, shapeLabel] of shapes)
      for (const [field, metric, unit] of [
        ["rps", "calls/s", "/s"],
        ["p50", "p50", "ms"],
        ["p99", "p99", "ms"],
      ] as const) {
        if (shape !== "oneAtATime" && field === "p50" && p === "inCluster") continue;
        rows.push({
          name: `gRPC unary 1 KiB (h2load), ${shapeLabel}: ${label}`,
          metric,
          value: num(get(r, `unary.${shape}.${p}.${field}`)),
          unit,
          baselineName: "direct to the gRPC server",
          baseline: num(get(r, `unary.${shape}.direct.${field}`)),
          ratio: roundRatio(rounds, `unary.${shape}.${p}.${field}`, `unary.${shape}.direct.${field}`),
          runs,
        });
      }
    for (const [way, label2] of [
      ["up", "ClientStream up"],
      ["down", "ServerStream down"],
    ] as const)
      rows.push({
        name: `gRPC streaming, ${o.streamMiB} × 1 MiB messages, ${label2} (grpc-js): ${label}`,
        metric: "MB/s",
        value: num(get(r, `streamingMBps.${p}.${way}`)),
        unit: "MB/s",
        baselineName: "direct to the gRPC server",
        baseline: num(get(r, `streamingMBps.direct.${way}`)),
        ratio: roundRatio(rounds, `streamingMBps.${p}.${way}`, `streamingMBps.direct.${way}`),
        runs,
      });
    // one unary call carrying a large message each way: seconds per call (value ÷ baseline, as for
    // the latencies: lower is better)
    const mib = num(get(r, "largeUnary.mib")) ?? 32;
    rows.push({
      name: `gRPC unary, one ${mib} MiB message each way (grpc-js, 4 MiB client window): ${label}`,
      metric: "seconds per call",
      value: num(get(r, `largeUnary.${p}.seconds`)),
      unit: "s",
      baselineName: "direct to the gRPC server",
      baseline: num(get(r, "largeUnary.direct.seconds")),
      ratio: roundRatio(rounds, `largeUnary.${p}.seconds`, "largeUnary.direct.seconds"),
      runs,
    });
  }
  return rows;
}

function rowsScale(r: Result, o: ScaleBenchOptions): Row[] {
  const rounds = r.rounds;
  const runs = Array.isArray(rounds) ? rounds.length : o.rounds;
  const rows: Row[] = [];
  const first = Math.min(...o.replicas);
  for (const n of o.replicas)
    for (const [field, metric, unit] of [
      ["rps", "invocations/s", "/s"],
      ["p50", "p50 under load", "ms"],
      ["p99", "p99 under load (worst replica)", "ms"],
    ] as const) {
      const vsDirect = n === first && field === "rps";
      const base = vsDirect ? "direct" : `replicas${first}`;
      if (n === first && !vsDirect) continue;
      rows.push({
        name: `scale, 1 KiB echo, ${o.connections} connections over ${n} invocation replica${n > 1 ? "s" : ""} (proxy on)`,
        metric,
        value: num(get(r, `results.replicas${n}.${field}`)),
        unit,
        baselineName: vsDirect ? "direct to the echo server" : `${first} replica, same run`,
        baseline: num(get(r, `results.${base}.${field}`)),
        ratio: roundRatio(rounds, `replicas${n}.${field}`, `${base}.${field}`),
        runs,
      });
    }
  // the one-replica latency, against the direct path
  for (const [field, metric] of [
    ["p50", "p50 under load"],
    ["p99", "p99 under load"],
  ] as const)
    rows.push({
      name: `scale, 1 KiB echo, ${o.connections} connections over ${first} invocation replica (proxy on)`,
      metric,
      value: num(get(r, `results.replicas${first}.${field}`)),
      unit: "ms",
      baselineName: "direct to the echo server",
      baseline: num(get(r, `results.direct.${field}`)),
      ratio: roundRatio(rounds, `replicas${first}.${field}`, `direct.${field}`),
      runs,
    });
  return rows;
}

function rowsPending(r: Result): Row[] {
  // the figures of a step that did not reach its target are not per-request figures (workers
  // added for it count at their resting size, the step's ramp is still under way): only the steps
  // that held what they were asked to are rows; the section's lines say where a ramp stopped
  const cps = ((r.checkpoints as Array<Record<string, unknown>> | undefined) ?? []).filter(
    (c) => c.reachedTarget !== false,
  );
  if (!cps.length) return [];
  const first = cps[0];
  const last = cps[cps.length - 1];
  const held = num(last.held) ?? 0;
  const rows: Row[] = [];
  const parts = [
    ["replicasAndWorkers", "replicas + workers (what holds a pending request)"],
    ["replicas", "invocation replicas"],
    ["workers", "worker agents"],
    ["nats", "nats-server"],
    ["proxy", "callback proxy"],
    ["inferenceServers", "example inference servers (the open /slow calls)"],
  ] as const;
  for (const [k, label] of parts)
    rows.push({
      name: `memory per pending (polled) request, ${held.toLocaleString("en-US")} pending: ${label}`,
      metric: "RSS growth per pending request",
      value: num(get(last, `perPendingKiB.${k}`)),
      unit: "KiB",
      baselineName: cps.length > 1 ? `same, ${(num(first.held) ?? 0).toLocaleString("en-US")} pending` : "—",
      baseline: cps.length > 1 ? num(get(first, `perPendingKiB.${k}`)) : undefined,
      ratio:
        cps.length > 1
          ? plainRatio(num(get(last, `perPendingKiB.${k}`)), num(get(first, `perPendingKiB.${k}`)))
          : undefined,
      runs: 1,
    });
  return rows;
}

/** The console's pages as the rows name them, in the order they are measured. */
const CONSOLE_PAGES: Array<[string, (o: ConsoleBenchOptions) => string]> = [
  ["health", () => "GET /console/health"],
  ["functions", (o) => `GET /console/functions (page 1 of ${Math.ceil(o.functions / 50)})`],
  ["functionsFiltered", () => "GET /console/functions?q=fn-00 (a name filter, 100 match)"],
  ["functionsLastPage", (o) => `GET /console/functions?page=${Math.ceil(o.functions / 50)} (the last page)`],
  ["function", () => "GET /console/functions/ID (the function holding the requests)"],
  ["live", () => "GET /console/live (the page, 200 rows)"],
  ["audit", () => `GET /console/audit (page 1)`],
  ["request", () => "GET /console/requests/ID (a request in flight)"],
];

function rowsConsole(r: Result, o: ConsoleBenchOptions): Row[] {
  const held = num(get(r, "setup.held")) ?? 0;
  const at = `${o.functions.toLocaleString("en-US")} functions, ${held.toLocaleString("en-US")} in flight`;
  const rows: Row[] = [];
  for (const [key, label] of CONSOLE_PAGES)
    for (const [field, metric] of [
      ["p50", "p50, one request at a time"],
      ["p99", "p99, one request at a time"],
    ] as const) {
      const value = num(get(r, `pages.${key}.${field}`));
      const baseline = num(get(r, `pages.apiFunctionList.${field}`));
      rows.push({
        name: `console at ${at}: ${label(o)}`,
        metric,
        value,
        unit: "ms",
        baselineName: "GET /v2/nvcf/functions (the API's JSON list of the same functions), same token",
        baseline,
        ratio: plainRatio(value, baseline),
        runs: 1,
      });
    }
  const runs = (get(r, "live.runs") as Record<string, Record<string, unknown>> | undefined) ?? {};
  for (const run of Object.values(runs)) {
    const k = num(run.clients) ?? 0;
    const clients = `${k} client${k === 1 ? "" : "s"}`;
    for (const [p, label] of [
      ["api", "API"],
      ["replicas", "invocation replicas (all)"],
      ["nats", "nats-server"],
    ] as const) {
      const busy = num(get(run, `cpuMsPerSecond.${p}`));
      const quiet = num(get(run, `quietCpuMsPerSecond.${p}`));
      const value = busy === undefined ? undefined : busy / 10;
      const baseline = quiet === undefined ? undefined : quiet / 10;
      rows.push({
        name: `the live page's updates (${o.liveSeconds} s, ${clients} on /console/live/events), ${at}: ${label}`,
        metric: "CPU, % of one core",
        value,
        unit: "%",
        baselineName: "the same process, no live client (intervals just before and after)",
        baseline,
        ratio: plainRatio(value, baseline),
        runs: 1,
      });
    }
    const total = num(get(run, "totalPercentOfCore.apiAndReplicas"));
    const quietTotal =
      (num(get(run, "quietCpuMsPerSecond.api")) ?? NaN) / 10 +
      (num(get(run, "quietCpuMsPerSecond.replicas")) ?? NaN) / 10;
    rows.push({
      name: `the live page's updates (${o.liveSeconds} s, ${clients}), ${at}: API + replicas, everything they did (their work at rest included)`,
      metric: "CPU, % of one core",
      value: total,
      unit: "%",
      baselineName: "the same processes, no live client (intervals just before and after)",
      baseline: Number.isFinite(quietTotal) ? quietTotal : undefined,
      ratio: plainRatio(total, Number.isFinite(quietTotal) ? quietTotal : undefined),
      runs: 1,
    });
    rows.push({
      name: `the live page's updates, ${clients}, ${at}: API + replicas`,
      metric: `added CPU, % of one core (goal < ${CONSOLE_GOALS.livePercentOfCore})`,
      value: num(get(run, "addedPercentOfCore.apiAndReplicas")),
      unit: "%",
      baselineName: "—",
      baseline: undefined,
      ratio: undefined,
      runs: 1,
    });
  }
  return rows;
}

// ----- rendering -----

function fmt(x: number | undefined, unit: string): string {
  if (x === undefined) return "—";
  const digits = Math.abs(x) >= 100 ? 0 : Math.abs(x) >= 10 ? 1 : Math.abs(x) >= 1 ? 2 : 3;
  const s = x.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
  return unit === "/s" ? `${s}/s` : `${s} ${unit}`;
}
const fmtRatio = (x: number | undefined) =>
  x === undefined ? "—" : `${x.toFixed(x < 0.1 ? 3 : x >= 100 ? 0 : 2)}×`;

function table(rows: Row[]): string {
  const lines = [
    "| measured | metric | value | baseline | baseline value | ratio | runs |",
    "| --- | --- | --- | --- | --- | --- | --- |",
  ];
  for (const r of rows)
    lines.push(
      `| ${r.name} | ${r.metric} | ${fmt(r.value, r.unit)} | ${r.baselineName} | ${fmt(r.baseline, r.unit)} | ${fmtRatio(r.ratio)} | ${r.runs} |`,
    );
  return lines.join("\n");
}

interface Section {
  key: keyof Omit<Profile, "name">;
  title: string;
  how: string;
  run: (p: Profile) => Promise<Result>;
  rows: (r: Result, p: Profile) => Row[];
  extra?: (r: Result) => string;
}

const SECTIONS: Section[] = [
  {
    key: "invoke",
    title: "HTTP: a 1 KiB echo through callplane vs. straight to the echo server",
    how: "Client → invocation replica → JetStream → worker agent → echo server, and the answer back through the callback proxy (TLS both legs, as `npm start` sets up) or straight to the replica's pod address (in-cluster). Throughput and latency under load from wrk; latency one at a time from an undici client on one keep-alive connection. Each round measures every path back to back.",
    run: (p) => benchInvoke(p.invoke),
    rows: (r, p) => rowsInvoke(r, p.invoke),
  },
  {
    key: "tracing",
    title: "Tracing on (ratio 1.0) vs. off",
    how: "Two of the HTTP section's chains side by side, the same but for tracing: off (nothing of OpenTelemetry loaded), and on at ratio 1.0 (`observability.tracing` on, every request recorded, every service and worker appending its spans to a span file: the most tracing costs; `npm start` records only 1% of the requests that come without a sampled `traceparent`). wrk loads the 1 KiB echo through the callback proxy on each in turn within every round (which goes first alternates). CPU per invocation is every process of the chain over the invocations completed. The issue's goal: at most 5% less throughput with tracing on.",
    run: (p) => benchTracing(p.tracing),
    rows: (r, p) => rowsTracing(r, p.tracing),
    extra: (r) =>
      typeof r.spanFileBytesPerInvocation === "number"
        ? `- the span file grew by ${r.spanFileBytesPerInvocation} bytes per traced invocation`
        : "",
  },
  {
    key: "stack",
    title: "The plane as `npm start` runs it: the whole local stack vs. a plain Node echo server",
    how: "A whole stack started as `npm start` starts it (`node dist/src/stack/main.js --config <file>`; the file sets only addresses and the data folder, every other key is the default: two invocation replicas, the demo's five instances (two of demo-echo), the callback proxy, NATS with TLS and auth, logging at info), beside a plain Node echo server started in the same run (the baseline of `../shared/checks/S-speed.sh`). wrk sends S-speed.sh's 1 KiB JSON POST to demo-echo on the first replica, at 1 and at N connections. CPU per invocation is utime + stime from /proc over the load, for every process of the stack (the tree below the stack's process), by role, over the invocations completed; at rest is the same with nothing invoked. The streamed body is random bytes written in 64 KiB pieces without a length (chunked) from a Node client, echoed by demo-echo, SHA-256 compared; peak RSS is each process's VmHWM during the transfer (reset just before), and the sum of every process's growth. Compare with the HTTP section above: the bench's own chain (one replica, one worker, no idle services, services at log level warn).",
    run: (p) => benchStack(p.stack),
    rows: (r, p) => rowsStack(r, p.stack),
  },
  {
    key: "stream",
    title: "A large streamed body, echoed through the chain",
    how: "curl uploads the body from a pipe (chunked, no length) and counts what comes back: client → replica → worker → echo server and back, through the proxy or with in-cluster callbacks, vs. straight to the echo server. Peak RSS is each process's VmHWM during the transfer (reset just before), the most over the rounds; the baseline is the same process just before.",
    run: (p) => benchStream(p.stream),
    rows: (r, p) => rowsStream(r, p.stream),
  },
  {
    key: "sse",
    title: "Server-sent events as fast as the client reads",
    how: "The example server's /sse in burst mode (writes until its socket is full, then waits), read by curl with `Accept: text/event-stream`, through callplane vs. straight to the server. Peak RSS as above (the baseline: the same process just before the transfer).",
    run: (p) => benchSse(p.sse),
    rows: (r, p) => rowsSse(r, p.sse),
  },
  {
    key: "proxy",
    title: "The worker callback proxy (HAProxy, callplane's configuration) vs. a minimal HAProxy vs. direct",
    how: "The callback proxy is HAProxy: callplane's row runs it as `npm start` does (the `callback-proxy` keeper starting Debian's `haproxy`, one thread, with the configuration callplane writes: every check on the target, the JSON access log, problem answers). The baseline is the same HAProxy with the least configuration for the same job (`nbthread 1`, from `../shared/reference/baselines/haproxy-callback-proxy.cfg`: TLS termination with the same `*.<workerDomain>` certificate, only the callback path and pod-addressed hosts admitted, TLS to the pod verified against the same CA and the pod name, connection reuse, no log). The ratio is the price of callplane's checks and log. wrk sends absolute-form forward-proxy requests; the pod is a small TLS server. CPU per request is the proxy's CPU time (the keeper and its HAProxy processes) over the requests it served. The Node TLS pipe row is kept as the ceiling a Node proxy would have had.",
    run: (p) => benchProxy(p.proxy),
    rows: (r, p) => rowsProxy(r, p.proxy),
  },
  {
    key: "grpc",
    title: "gRPC: unary and streaming through callplane vs. straight to the server",
    how: "h2load → grpc-proxy → the worker's tunnel (through the callback proxy with TLS both legs, or in-cluster straight to grpc-proxy's CONNECT listener) → worker agent → the example gRPC server (`@grpc/grpc-js`), vs. h2load straight to that server. Unary: 1 KiB messages; latency percentiles from h2load's per-request log. Streaming: grpc-js, one connection, 1 MiB messages each way.",
    run: (p) => benchGrpc(p.grpc),
    rows: (r, p) => rowsGrpc(r, p.grpc),
  },
  {
    key: "scale",
    title: "Scale: 1, 2 and 4 invocation replicas",
    how: "One chain with four invocation replicas (proxy on) and one worker; each measurement loads the first N replicas at once with one wrk per replica, the connections split evenly (clients spread over replicas as by a Service). Throughput is the sum; p50 the median of the generators' p50s; p99 the worst generator's p99. On two cores every replica shares them with everything else: this shows what replicas cost more than what they add.",
    run: (p) => benchScale(p.scale),
    rows: (r, p) => rowsScale(r, p.scale),
  },
  {
    key: "console",
    title: "The operator console at 1,000 functions and 10,000 requests in flight",
    how: `The bench chain (nats-server, the API, two invocation replicas whose workers call back through the callback proxy and one in-cluster replica, one worker), with the replicas' relay on as \`npm start\` runs several replicas (they register, so the console waits for exactly their answers). Through the API's own routes: functions up to the count (every 50th deployed; no instance starts, the bench has no compute agent), 60 confirmed scale actions posted to the console (the audit page), 200 answered echo invocations (the replicas' last-minute stats). Then the requests in flight: POSTs to a deployed function no worker serves, with \`NVCF-POLL-SECONDS: 3600\`, one per raw keep-alive socket from the bench's process, spread over the two replicas; how many are held is read from the console's own health page (each replica's report). Each page is then fetched one request at a time on one keep-alive connection with an admin Bearer token (pages in turn, after a warm-up), beside the API's JSON list of the same functions (\`GET /v2/nvcf/functions\`, the row baseline) and \`GET /v1/info\`. The live page's cost: CPU time (utime + stime, /proc) of the API, every replica and nats-server over an interval with K clients on \`/console/live/events\`, against the mean of the same interval with none just before and just after. The issue's goals: every page within ${CONSOLE_GOALS.pageMs} ms, the live page's updates under ${CONSOLE_GOALS.livePercentOfCore}% of a core for the replicas and the API.`,
    run: (p) => benchConsole(p.console),
    rows: (r, p) => rowsConsole(r, p.console),
    extra: (r) => {
      const s = (r.setup ?? {}) as {
        held?: number;
        target?: number;
        heldByReplica?: Record<string, number>;
        heldAfterPages?: number;
        rampSeconds?: number;
        stoppedBecause?: string;
        openFileLimit?: number;
      };
      const c = (r.checks as Record<string, unknown> | undefined) ?? {};
      const info = get(r, "pages.apiInfo") as { p50?: number; p99?: number } | undefined;
      const refused = Object.entries((r.pages as Record<string, { errors?: number }> | undefined) ?? {})
        .filter(([, l]) => l.errors)
        .map(([k, l]) => `${k} ${String(l.errors)}`);
      return [
        ...(refused.length
          ? [`- answers other than 200 (counted in the figures): ${refused.join(", ")}`]
          : []),
        `- ${String(s.held)} of ${String(s.target)} requests held (${JSON.stringify(s.heldByReplica)} by replica, ${String(s.heldAfterPages)} still after the pages), reached in ${String(s.rampSeconds)} s${s.stoppedBecause ? `; stopped short: ${s.stoppedBecause}` : ""}; open-file limit ${String(s.openFileLimit)} per process`,
        `- GET /v1/info (no work, the HTTP floor): p50 ${String(info?.p50)} ms, p99 ${String(info?.p99)} ms`,
        `- every page's p99 under ${CONSOLE_GOALS.pageMs} ms: ${c.everyPageP99Under300ms ? "yes" : "no"} (slowest: ${String(c.slowestPage)}, p99 ${String(c.slowestP99Ms)} ms)`,
        `- the live page's updates under ${CONSOLE_GOALS.livePercentOfCore}% of a core (API + replicas, the most over the client counts): ${c.liveUnder5PercentOfCore ? "yes" : "no"} (added at most ${String(c.liveAddedPercentOfCoreMost)}%; everything the API and the replicas did with the clients connected, their work at rest included, at most ${String(c.liveTotalPercentOfCoreMost)}%). An added figure below zero means the cost is smaller than how much the processes' CPU at rest varies between intervals`,
      ].join("\n");
    },
  },
  {
    key: "pending",
    title: "Memory per pending (polled) request",
    how: "Requests that got their 202 (NVCF-POLL-SECONDS: 1) to the example server's /slow told to take two hours, each with a client long-polling `GET /status/{id}` on its own connection (raw sockets, client processes of their own). Each process's RSS is read at rest, then at each checkpoint once that many requests are held; per pending request = growth ÷ count. Requests are spread over replicas, inference servers and clients of at most 15,000 each (the machine's 20,000 open files per process) and workers of 1,024 slots each. A step that would leave the machine less than the memory floor is cut short, and says so. Rows come from the steps that held what they were asked to; a step whose ramp stopped short is in the lines below the table, with why. One ramp (runs = 1); the baseline is the same figure at the first checkpoint (a ratio near 1 means linear).",
    run: (p) => benchPending(p.pending),
    rows: (r) => rowsPending(r),
    extra: (r) => {
      const cps = (r.checkpoints as Array<Record<string, unknown>> | undefined) ?? [];
      const lines = cps.map(
        (c) =>
          `- ${String(c.held)} of ${String(c.target)} held${c.reachedTarget ? "" : " (target not reached)"}, ${String(c.workers)} workers, ramp ${String(c.rampSeconds)} s; RSS MiB ${JSON.stringify(c.rssMiB)}; CPU ms/s at rest ${JSON.stringify(c.cpuMsPerSecond)}; errors ${String(c.errors)}, POSTs timed out (504, not held, replaced) ${typeof c.postTimeouts === "number" ? c.postTimeouts : 0}`,
      );
      if (typeof r.stoppedBecause === "string") lines.push(`- stopped early: ${r.stoppedBecause}`);
      return lines.join("\n");
    },
  },
];

export async function runAll(profile: Profile, only?: string[]): Promise<{ markdown: string; json: Result }> {
  const t0 = Date.now();
  const machine = machineInfo();
  const outcomes: Record<string, Outcome> = {};
  for (const s of SECTIONS) {
    if (only && !only.includes(s.key)) continue;
    const s0 = Date.now();
    console.log(`\n== ${s.key}: ${commandOf(s.key, profile)}`);
    try {
      const result = await s.run(profile);
      outcomes[s.key] = { ok: true, result, seconds: Math.round((Date.now() - s0) / 1000) };
    } catch (err) {
      const msg = (err as Error).message ?? String(err);
      console.error(`  ${s.key} failed: ${msg}`);
      outcomes[s.key] = { ok: false, error: msg, seconds: Math.round((Date.now() - s0) / 1000) };
    }
    // every process of this benchmark is stopped before the next one starts
    await stopAll();
    console.log(`  ${s.key}: ${outcomes[s.key].seconds} s`);
  }
  machine.loadavgAtEnd = loadavg().map((x) => Math.round(x * 100) / 100);
  const totalS = Math.round((Date.now() - t0) / 1000);
  const md = render(profile, machine, outcomes, totalS);
  return { markdown: md, json: { profile, machine, totalSeconds: totalS, outcomes } };
}

/** The rows the issue asks for first, one or a few per benchmark, in the summary at the top. */
const HEADLINE: Record<string, (r: Row) => boolean> = {
  invoke: (r) => r.name.includes("wrk): callplane, callbacks through the proxy"),
  stack: (r) =>
    (r.name.startsWith("1 KiB echo") && (r.metric === "invocations/s" || r.metric === "added p50")) ||
    (r.metric === "CPU ms per invocation" && r.name.endsWith("all its processes")) ||
    r.metric === "MB/s each way" ||
    r.metric === "peak RSS growth (sum)",
  stream: (r) =>
    (r.metric.startsWith("MB/s") && r.name.includes("through the proxy")) ||
    (r.metric === "peak RSS" &&
      r.name.includes("through callplane") &&
      /: (invocation|proxy|worker)$/.test(r.name)),
  sse: (r) => r.metric === "MB/s" && r.name.includes("through the proxy"),
  proxy: (r) => r.baselineName.startsWith("HAProxy") && r.metric !== "p99" && r.name.endsWith(": callplane"),
  grpc: (r) =>
    r.name.includes(": callplane (tunnel") &&
    (r.metric === "calls/s" ||
      r.metric === "MB/s" ||
      (r.metric === "p50" && r.name.includes("one call at a time"))),
  scale: (r) => r.metric === "invocations/s",
  pending: (r) => r.name.includes("replicas + workers") || r.name.includes("nats-server"),
  tracing: (r) => r.metric === "invocations/s" || r.metric === "CPU ms per invocation",
  console: (r) =>
    r.metric.startsWith("p99") || r.metric.startsWith("added CPU") || r.name.includes("everything they did"),
};

function render(profile: Profile, m: MachineInfo, outcomes: Record<string, Outcome>, totalS: number): string {
  const at = new Date().toISOString().replace(/\.\d+Z$/, "Z");
  const out: string[] = [];
  out.push("# Benchmark results", "");
  out.push(
    `Written by \`npm run bench${profile.name === "quick" ? " -- --quick" : ""}\` (bench/report.ts) on ${at}, in ${Math.round(totalS / 60)} min (${totalS} s). Profile: **${profile.name}**${profile.name === "quick" ? " (fewer seconds and rounds, smaller bodies, fewer pending requests: for trying the report out, not for quoting)" : ""}.`,
    "",
  );
  // the 1-minute load when the run began: other work; the load at the end is mostly the report's
  // own last benchmark (thousands of pending clients)
  const busiest = m.loadavgAtStart[0];
  if (profile.name === "quick" || busiest > m.cores)
    out.push(
      `> **${[profile.name === "quick" ? "Quick profile" : "", busiest > m.cores ? `noisy machine (1-minute load average ${busiest} on ${m.cores} cores when the run began: other work shared the CPUs)` : ""].filter(Boolean).join(", ")}.** These figures show the report works; do not quote them. Run \`npm run bench\` on a quiet machine for figures to quote.`,
      "",
    );
  out.push(
    "Every row's baseline was measured in the same run, on the same machine, right next to it. **ratio** = value ÷ baseline value, the median over the rounds of each round's ratio where the benchmark has rounds (so it may differ slightly from the ratio of the two medians shown); for throughput higher is better, for latency, CPU and memory lower is better. **runs**: how many rounds each figure is the median of (peak RSS: the highest over the rounds).",
    "",
  );
  out.push("## Machine", "");
  out.push(
    `- CPU: ${m.cpu}, ${m.cores} cores`,
    `- RAM: ${m.ramGiB} GiB`,
    `- OS: ${m.os}, Linux ${m.kernel}`,
    `- Node.js ${m.node}; nats-server ${m.natsServer}; HAProxy ${m.haproxy}; ${m.wrk.startsWith("wrk") ? m.wrk : `wrk ${m.wrk}`}; h2load ${m.h2load}; curl ${m.curl}`,
    `- load average (1, 5, 15 min) at the start ${m.loadavgAtStart.join(", ")}, at the end ${(m.loadavgAtEnd ?? []).join(", ")}: other work on the machine shows there`,
    "",
  );
  const summary: Row[] = [];
  const missing: string[] = [];
  for (const sec of SECTIONS) {
    const o = outcomes[sec.key];
    if (o?.ok) summary.push(...sec.rows(o.result, profile).filter(HEADLINE[sec.key]));
    else
      missing.push(
        `- ${sec.key}: ${o ? (o.error.startsWith("not measured") ? o.error : `not measured: ${o.error}`).split("\n")[0] : "not measured: not run in this invocation"}`,
      );
  }
  out.push("## Summary", "", "The headline rows of each section below.", "", table(summary), "");
  if (missing.length) out.push(...missing, "");
  out.push("## Commands", "", "Each benchmark, run alone with this profile's settings:", "", "```sh");
  for (const s of SECTIONS) out.push(commandOf(s.key, profile));
  out.push("```", "");
  for (const s of SECTIONS) {
    const o = outcomes[s.key];
    out.push(
      `## ${s.title}`,
      "",
      `\`${commandOf(s.key, profile)}\`${o ? ` (${o.seconds} s)` : ""}`,
      "",
      s.how,
      "",
    );
    if (!o) {
      out.push(`not measured: not run in this invocation`, "");
      continue;
    }
    if (!o.ok) {
      const msg = o.error.startsWith("not measured") ? o.error : `not measured: ${o.error}`;
      out.push(msg.split("\n")[0], "");
      continue;
    }
    out.push(table(s.rows(o.result, profile)), "");
    const extra = s.extra?.(o.result);
    if (extra) out.push(extra, "");
  }
  return out.join("\n");
}

export async function reportMain(argv: string[]): Promise<void> {
  const quick = argv.includes("--quick");
  const base = PROFILES[quick ? "quick" : "full"];
  const fi = argv.indexOf("--memory-floor-mib");
  // the pending benchmark keeps this much memory available for the machine's other users
  const profile: Profile =
    fi === -1 ? base : { ...base, pending: { ...base.pending, memoryFloorMiB: Number(argv[fi + 1]) } };
  const i = argv.indexOf("--only");
  const only = i === -1 ? undefined : argv[i + 1].split(",");
  const oi = argv.indexOf("--out");
  const root = join(import.meta.dirname, "..", "..");
  const outFile = oi === -1 ? join(root, "bench", "RESULTS.md") : argv[oi + 1];
  const { markdown, json } = await runAll(profile, only);
  writeFileSync(outFile, markdown);
  const jsonFile = join(
    root,
    "bench",
    "results",
    `all-${new Date().toISOString().replace(/[:.]/g, "-")}.json`,
  );
  writeFileSync(jsonFile, `${JSON.stringify(json, null, 2)}\n`);
  console.log(`\n${markdown}\nwritten to ${outFile}; every figure in ${jsonFile}`);
}
