// `npm run bench [-- --quick]`: every benchmark of the report, then bench/RESULTS.md (bench/report.ts)
// `npm run bench -- invoke [--seconds N] [--connections N] [--workers N] [--concurrency N] [--rounds N]`
// `npm run bench -- stream|sse|proxy|grpc|scale|pending|secrets|kubernetes|console [options]`: one benchmark alone
// `npm run bench -- stack [--seconds N] [--connections N] [--rounds N] [--mib N] [--idle-seconds N] [--log-level L]`:
//   the stack as `npm start` runs it (bench/stack.ts)
// `npm run bench -- tracing [--seconds N] [--connections N] [--workers N] [--concurrency N] [--rounds N]`:
//   throughput and CPU with tracing on (ratio 1.0) against off, in one run (bench/tracing.ts)
// `npm run bench -- console [--functions N] [--in-flight N] [--replicas N] [--samples N] [--live-seconds N]
//   [--live-clients 1,10]`: the operator console at 1,000 functions and 10,000 in flight (bench/console.ts)
// `npm run bench -- all [--quick] [--only invoke,proxy] [--out FILE]`: the report, or part of it
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { benchConsole } from "./console.js";
import { cleanup, stopAll } from "./harness.js";
import { benchGrpc } from "./grpc.js";
import { benchInvoke } from "./invoke.js";
import { benchKubernetes } from "./kubernetes.js";
import { benchPending } from "./pending.js";
import { benchProxy, type ProxyResult } from "./proxy.js";
import { PROFILES, reportMain } from "./report.js";
import { benchScale } from "./scale.js";
import { benchSecrets } from "./secrets.js";
import { benchSse } from "./sse.js";
import { benchStack, STACK_ROLES } from "./stack.js";
import { benchStream } from "./stream.js";
import { benchTracing } from "./tracing.js";

/** A command line no benchmark matches: said in one line, without a stack. */
class UsageError extends Error {}

function text(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  return i === -1 ? undefined : process.argv[i + 1];
}

function flag(name: string, def: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i === -1 ? def : Number(process.argv[i + 1]);
}

/** A comma-separated list of numbers: `--replicas 1,2,4`. */
function list(name: string, def: number[]): number[] {
  const i = process.argv.indexOf(`--${name}`);
  return i === -1 ? def : process.argv[i + 1].split(",").map(Number);
}

const which = process.argv[2] && !process.argv[2].startsWith("--") ? process.argv[2] : "all";

async function main(): Promise<void> {
  let result: Record<string, unknown>;
  if (which === "all") {
    await reportMain(process.argv.slice(2));
    return;
  } else if (which === "invoke") {
    result = await benchInvoke({
      seconds: flag("seconds", 10),
      connections: flag("connections", 32),
      workers: flag("workers", 1),
      concurrency: flag("concurrency", 128),
      rounds: flag("rounds", 1),
    });
    type Lat = { p50: number; p99: number };
    type Tp = {
      rps: number;
      p50: number;
      p99: number;
      errors: number;
      non2xx: number;
      cpuMsPerRequest: Record<string, number>;
    };
    const l = result.latency as Record<"direct" | "directCallbacks" | "viaProxy", Lat> & {
      addedP50ms: Record<string, number>;
    };
    const t = result.throughput as Record<"direct" | "directCallbacks" | "viaProxy", Tp> & {
      ratio: Record<string, number>;
    };
    console.log(`\ninvoke benchmark (1 KiB echo), ${String(result.machine)}`);
    for (const name of ["direct", "directCallbacks", "viaProxy"] as const) {
      const cpu = Object.entries(t[name].cpuMsPerRequest)
        .map(([k, v]) => `${k} ${v}`)
        .join(", ");
      console.log(
        `  ${name.padEnd(16)} 1 client: p50 ${l[name].p50} ms p99 ${l[name].p99} ms${name === "direct" ? "" : ` (added p50 ${l.addedP50ms[name]} ms)`} | ${flag("connections", 32)} clients: ${Math.round(t[name].rps)}/s p50 ${t[name].p50} ms p99 ${t[name].p99} ms${t[name].errors ? ` errors ${t[name].errors}` : ""}${name === "direct" ? "" : ` (${t.ratio[name]}x direct)`} | CPU ms/invocation: ${cpu}`,
      );
    }
  } else if (which === "tracing") {
    result = await benchTracing({
      seconds: flag("seconds", 10),
      connections: flag("connections", 32),
      workers: flag("workers", 1),
      concurrency: flag("concurrency", 128),
      rounds: flag("rounds", 3),
    });
    type M = { rps: number; p50: number; p99: number; cpuMsPerInvocation: Record<string, number> };
    const off = result.off as M;
    const on = result.on as M;
    const r = result.ratios as Record<string, number>;
    console.log(`\ntracing benchmark (1 KiB echo through the callback proxy), ${String(result.machine)}`);
    for (const [name, m] of [
      ["tracing off", off],
      ["tracing on (1.0)", on],
    ] as const)
      console.log(
        `  ${name.padEnd(17)} ${Math.round(m.rps)}/s p50 ${m.p50} ms p99 ${m.p99} ms | CPU ms/invocation: ${Object.entries(
          m.cpuMsPerInvocation,
        )
          .map(([k, v]) => `${k} ${v}`)
          .join(", ")}`,
      );
    console.log(
      `  on/off: throughput ${r.rps}x, p50 ${r.p50}x, CPU per invocation ${r.cpuPerInvocation}x; span file ${String(result.spanFileBytesPerInvocation)} bytes per invocation`,
    );
  } else if (which === "stack") {
    const logLevel = text("log-level");
    result = await benchStack({
      seconds: flag("seconds", 8),
      connections: flag("connections", 32),
      rounds: flag("rounds", 1),
      mib: flag("mib", 1024),
      idleSeconds: flag("idle-seconds", 5),
      ...(logLevel ? { logLevel } : {}),
    });
    type Run = {
      rps: number;
      p50: number;
      p99: number;
      errors: number;
      cpuMsPerInvocation: Record<string, number>;
      othersCpuMsPerInvocation: Record<string, number>;
    };
    type Shape = { direct: Run; stack: Run };
    const ratios = result.ratios as Record<string, number>;
    const line = (label: string, s: Shape, ratio: number) =>
      console.log(
        `  ${label.padEnd(16)} direct ${Math.round(s.direct.rps)}/s p50 ${s.direct.p50} ms p99 ${s.direct.p99} ms | stack ${Math.round(s.stack.rps)}/s p50 ${s.stack.p50} ms p99 ${s.stack.p99} ms${s.stack.errors ? ` errors ${s.stack.errors}` : ""} (${ratio}x direct)`,
      );
    const cpu = (x: Record<string, number>) =>
      [...STACK_ROLES, "total", "wrk"]
        .filter((k) => x[k] !== undefined)
        .map((k) => `${k} ${x[k]}`)
        .join(", ");
    const st = result.stack as { startSeconds: number; processes: Record<string, string[]> };
    console.log(
      `\nstack benchmark (npm start's stack${logLevel ? `, log.level ${logLevel}` : ""}; 1 KiB JSON echo of demo-echo, wrk), ${String(result.machine)}`,
    );
    console.log(`  started in ${st.startSeconds} s; processes: ${JSON.stringify(st.processes)}`);
    const one = result.oneConnection as Shape;
    const many = result.manyConnections as Shape;
    line("1 connection", one, ratios.oneConnection);
    console.log(`  added p50 (1 connection): ${String(result.addedP50ms)} ms`);
    line(`${flag("connections", 32)} connections`, many, ratios.manyConnections);
    console.log(
      `  CPU ms per invocation (${flag("connections", 32)} connections): ${cpu(many.stack.cpuMsPerInvocation)}; others: ${JSON.stringify(many.stack.othersCpuMsPerInvocation)}; direct echo ${many.direct.cpuMsPerInvocation.total}`,
    );
    console.log(`  CPU ms per invocation (1 connection): ${cpu(one.stack.cpuMsPerInvocation)}`);
    const idle = result.idleCpuMsPerSecond as Record<string, number> & {
      othersByProcess: Record<string, number>;
    };
    console.log(
      `  at rest, CPU ms per second: ${cpu(idle)}; others: ${JSON.stringify(idle.othersByProcess)}`,
    );
    const s = result.stream as {
      direct: { mbPerSecEachWay: number; peakGrowthMiB: number };
      stack: {
        mbPerSecEachWay: number;
        peakGrowthMiB: Record<string, number>;
        totalPeakGrowthMiB: number;
        cpuMsPerMiB: Record<string, number>;
      };
    };
    console.log(
      `  ${flag("mib", 1024)} MiB streamed each way (chunked, SHA-256 checked): direct ${s.direct.mbPerSecEachWay} MB/s | stack ${s.stack.mbPerSecEachWay} MB/s (${ratios.stream}x direct); stack peak RSS growth MiB ${JSON.stringify(s.stack.peakGrowthMiB)} (total +${s.stack.totalPeakGrowthMiB}); CPU ms/MiB ${JSON.stringify(s.stack.cpuMsPerMiB)}`,
    );
  } else if (which === "grpc") {
    result = await benchGrpc({
      seconds: flag("seconds", 8),
      streams: flag("streams", 32),
      connections: flag("connections", 8),
      perConnection: flag("per-connection", 8),
      streamMiB: flag("stream-mib", 64),
      rounds: flag("rounds", 1),
    });
    type Run = {
      rps: number;
      p50: number;
      p99: number;
      succeeded: number;
      failed: number;
      cpuMsPer1k?: Record<string, number>;
    };
    const u = result.unary as Record<string, Record<"direct" | "callplane" | "inCluster", Run>>;
    const ratio = result.ratio as Record<string, number>;
    console.log(
      `\ngRPC benchmark (unary 1 KiB, h2load; streaming 1 MiB messages, grpc-js), ${String(result.machine)}`,
    );
    const label: Record<string, string> = {
      oneAtATime: "one call at a time",
      oneConnection: `one connection, ${flag("streams", 32)} concurrent calls`,
      manyConnections: `${flag("connections", 8)} connections x ${flag("per-connection", 8)} calls`,
    };
    for (const shape of Object.keys(u)) {
      const d = u[shape].direct;
      const c = u[shape].callplane;
      const ic = u[shape].inCluster;
      const cpu = c.cpuMsPer1k
        ? Object.entries(c.cpuMsPer1k)
            .map(([k, v]) => `${k} ${v}`)
            .join(", ")
        : "";
      console.log(
        `  ${label[shape].padEnd(38)} direct ${Math.round(d.rps)}/s p50 ${d.p50} ms p99 ${d.p99} ms | callplane ${Math.round(c.rps)}/s p50 ${c.p50} ms p99 ${c.p99} ms${c.failed ? ` failed ${c.failed}` : ""} (${ratio[shape]}x direct) | in-cluster tunnel ${Math.round(ic.rps)}/s p50 ${ic.p50} ms p99 ${ic.p99} ms (${Math.round((ic.rps / d.rps) * 100) / 100}x) | callplane CPU ms per 1000 calls: ${cpu}`,
      );
    }
    console.log(`  added p50 with one call at a time: ${String(result.addedP50ms)} ms`);
    const st = result.streamingMBps as Record<
      "direct" | "callplane" | "inCluster",
      { up: number; down: number }
    >;
    console.log(
      `  streaming ${flag("stream-mib", 64)} MiB: up direct ${st.direct.up} MB/s, callplane ${st.callplane.up} MB/s, in-cluster ${st.inCluster.up} MB/s | down direct ${st.direct.down} MB/s, callplane ${st.callplane.down} MB/s, in-cluster ${st.inCluster.down} MB/s`,
    );
    const lu = result.largeUnary as Record<
      "direct" | "callplane" | "inCluster",
      { seconds: number; MBps: number }
    > & {
      mib: number;
    };
    console.log(
      `  unary, one ${lu.mib} MiB message each way: direct ${lu.direct.seconds} s, callplane ${lu.callplane.seconds} s (${Math.round((lu.callplane.seconds / lu.direct.seconds) * 100) / 100}x the direct time), in-cluster ${lu.inCluster.seconds} s`,
    );
    console.log(
      "  (callplane: workers tunnel through the callback proxy, TLS both legs, as npm start sets up; in-cluster: workers dial grpc-proxy's CONNECT listener, no TLS)",
    );
  } else if (which === "proxy") {
    result = await benchProxy({
      seconds: flag("seconds", 8),
      connections: flag("connections", 50),
      largeBytes: flag("large-bytes", 1024 * 1024),
      rounds: flag("rounds", 2),
    });
    const r = result.results as Record<string, Record<string, ProxyResult>>;
    const row = (scenario: string, metric: (x: ProxyResult) => string) =>
      r[scenario]
        ? ["direct", "haproxy", "callplane", "nodeTlsPipe"]
            .filter((k) => r[scenario][k])
            .map((k) => `${k} ${metric(r[scenario][k])}`)
            .join(" | ")
        : "(not run)";
    const cpuMs = (x: { cpuUsPerRequest?: number }) =>
      x.cpuUsPerRequest !== undefined ? ` cpu ${(x.cpuUsPerRequest / 1000).toFixed(1)} ms/req` : "";
    console.log(`\nproxy benchmark (TLS to the proxy, TLS to the pod), ${String(result.machine)}`);
    console.log(
      `  small callbacks (POST 100 B, ${flag("connections", 50)} connections): ${row("small", (x) => `${Math.round(x.rps)}/s p50 ${x.p50ms} ms p99 ${x.p99ms} ms${x.cpuUsPerRequest !== undefined ? ` cpu ${x.cpuUsPerRequest} us/req` : ""}${x.errors ? ` errors ${x.errors}` : ""}`)}`,
    );
    console.log(
      `  large responses (GET ${flag("large-bytes", 1024 * 1024)} B, 8 connections): ${row("largeDown", (x) => `${Math.round(x.mbPerSec)} MB/s${cpuMs(x)}${x.errors ? ` errors ${x.errors}` : ""}`)}`,
    );
    console.log(
      `  large uploads (POST ${flag("large-bytes", 1024 * 1024)} B, 8 connections): ${row("largeUp", (x) => `${Math.round((x.rps * flag("large-bytes", 1024 * 1024)) / 2 ** 20)} MB/s${cpuMs(x)}${x.errors ? ` errors ${x.errors}` : ""}`)}`,
    );
    console.log(
      "  (nodeTlsPipe: a bare node:tls byte pipe with no HTTP, no routing, no pooling: the ceiling for a proxy on Node's TLS)",
    );
    console.log(`  ratios vs HAProxy: ${JSON.stringify(result.ratios)}`);
  } else if (which === "stream") {
    result = await benchStream({
      mib: flag("mib", 1024),
      rounds: flag("rounds", 3),
      chunked: !process.argv.includes("--content-length"),
    });
    const r = result.results as Record<
      string,
      {
        mbPerSecEachWay: number;
        runs: number[];
        peakGrowthMiB: Record<string, number>;
        cpuMsPerMiB: Record<string, number>;
      }
    >;
    console.log(
      `\nstream benchmark (${flag("mib", 1024)} MiB echoed through the chain, curl), ${String(result.machine)}`,
    );
    for (const [name, x] of Object.entries(r)) {
      const peaks = Object.entries(x.peakGrowthMiB)
        .map(([k, v]) => `${k} +${v}`)
        .join(", ");
      const cpu = Object.entries(x.cpuMsPerMiB)
        .map(([k, v]) => `${k} ${v}`)
        .join(", ");
      console.log(
        `  ${name.padEnd(16)} ${x.mbPerSecEachWay} MB/s each way (runs ${x.runs.join(", ")}); peak RSS growth MiB: ${peaks}; CPU ms/MiB: ${cpu}`,
      );
    }
    console.log(`  ratios: ${JSON.stringify(result.ratios)}`);
  } else if (which === "sse") {
    result = await benchSse({
      mib: flag("mib", 256),
      rounds: flag("rounds", 3),
      eventBytes: flag("event-bytes", 1024),
    });
    console.log(JSON.stringify(result, null, 2));
  } else if (which === "scale") {
    result = await benchScale({
      seconds: flag("seconds", 5),
      connections: flag("connections", 32),
      rounds: flag("rounds", 3),
      replicas: list("replicas", [1, 2, 4]),
      workers: flag("workers", 1),
      concurrency: flag("concurrency", 128),
    });
    console.log(JSON.stringify(result.results, null, 2));
    console.log(`  ratios: ${JSON.stringify(result.ratios)}`);
  } else if (which === "pending") {
    const checkpoints = list("checkpoints", [1000]);
    result = await benchPending({
      checkpoints,
      perProcess: flag("per-process", 15000),
      concurrency: flag("concurrency", 1024),
      pollSeconds: flag("poll-seconds", 900),
      inflight: flag("inflight", 200),
      settleSeconds: flag("settle", 5),
      rampTimeoutSeconds: flag("ramp-timeout", 600),
      memoryFloorMiB: flag("memory-floor-mib", 6144),
    });
    console.log(JSON.stringify(result, null, 2));
  } else if (which === "kubernetes") {
    result = await benchKubernetes({ instances: flag("instances", 1000) });
    const p = result.provisioning as Record<string, unknown>;
    const a = result.adoption as Record<string, unknown>;
    const b = result.baseline as Record<string, number>;
    console.log(
      `\nkubernetes compute backend (kube-apiserver 1.20.2 + etcd on loopback, no kubelet), ${String(result.machine)}`,
    );
    console.log(
      `  provisioning ${String(result.instances)} instances (account, role, binding, 2 Secrets, pod each): every pod in ${String(p.seconds)} s (${String(p.podsPerSecond)} pods/s), every identity object owned by its pod in ${String(p.completeSeconds)} s, ${String(p.apiRequestsPerPod)} API requests per pod, agent peak RSS ${String(p.agentPeakRssMiB)} MiB; objects ${JSON.stringify(p.objects)}`,
    );
    console.log(
      `  baseline: ${String(result.instances)} bare pods straight to the API server (16 at a time): ${b.barePodsSeconds} s (${b.barePodsPerSecond} pods/s); callplane's provisioning at ${String(p.ratioToBarePods)}x that rate`,
    );
    console.log(
      `  adoption after a restart: ${String(a.seconds)} s to the first report of ${String(a.reported)} instances; pods ${String(a.podsBefore)} before, ${String(a.podsAfter)} after, ${String(a.sameUid)} with the same uid; agent peak RSS ${String(a.agentPeakRssMiB)} MiB`,
    );
  } else if (which === "secrets") {
    result = await benchSecrets({
      iterations: flag("iterations", 2000),
      valueBytes: flag("value-bytes", 256),
      functions: flag("functions", 200),
    });
    type Lat = { p50: number; p99: number; mean: number; n: number };
    const st = result.store as Record<"encryptWarm" | "encryptCold" | "decryptWarm" | "decryptCold", Lat>;
    const env = result.envelope as Record<"seal" | "open", Lat>;
    const ms = (l: Lat) => `p50 ${l.p50} ms  p99 ${l.p99} ms  (mean ${l.mean} ms, n ${l.n})`;
    console.log(
      `\nsecrets benchmark (${flag("value-bytes", 256)}-byte values, ${flag("functions", 200)} functions, SQLite file, file MEK provider), ${String(result.machine)}`,
    );
    console.log(`  encrypt, warm NEK cache   ${ms(st.encryptWarm)}`);
    console.log(`  encrypt, cold NEK cache   ${ms(st.encryptCold)}`);
    console.log(`  decrypt, warm NEK cache   ${ms(st.decryptWarm)}`);
    console.log(`  decrypt, cold NEK cache   ${ms(st.decryptCold)}`);
    console.log(`  envelope only: seal ${ms(env.seal)}; open ${ms(env.open)}`);
    console.log(`  (${String(result.notes)})`);
  } else if (which === "console") {
    const d = PROFILES.full.console;
    result = await benchConsole({
      ...d,
      functions: flag("functions", d.functions),
      inFlight: flag("in-flight", d.inFlight),
      replicas: flag("replicas", d.replicas),
      samples: flag("samples", d.samples),
      liveSeconds: flag("live-seconds", d.liveSeconds),
      liveClients: list("live-clients", d.liveClients),
    });
    type Lat = { p50: number; p99: number; n: number; bytes: number; errors: number };
    const setup = result.setup as Record<string, unknown>;
    const pages = result.pages as Record<string, Lat>;
    const checks = result.checks as Record<string, unknown>;
    console.log(
      `\nconsole benchmark (${String(setup.functions)} functions, ${String(setup.held)} of ${String(setup.target)} requests in flight on ${String(setup.replicas)} replicas), ${String(result.machine)}`,
    );
    for (const [k, l] of Object.entries(pages))
      console.log(
        `  ${k.padEnd(18)} p50 ${l.p50} ms  p99 ${l.p99} ms  (${l.n} requests, ${l.bytes} bytes${l.errors ? `, ${l.errors} not 200` : ""})`,
      );
    const runs = (result.live as { runs: Record<string, Record<string, unknown>> }).runs;
    for (const r of Object.values(runs))
      console.log(
        `  live page, ${String(r.clients)} client(s): added % of one core ${JSON.stringify(r.addedPercentOfCore)}; API + replicas in all ${JSON.stringify(r.totalPercentOfCore)}% of one core; ${String(r.eventsPerSecondPerClient)} events/s per client, ${String(r.bytesPerEvent)} bytes each`,
      );
    console.log(`  checks: ${JSON.stringify(checks)}`);
  } else {
    throw new UsageError(
      `unknown benchmark ${which}; use all (the default), invoke, stack, stream, sse, proxy, grpc, scale, pending, secrets, kubernetes or console`,
    );
  }
  const dir = join(import.meta.dirname, "..", "..", "bench", "results");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${which}-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
  writeFileSync(
    file,
    `${JSON.stringify({ command: `npm run bench -- ${process.argv.slice(2).join(" ")}`.trim(), at: new Date().toISOString(), ...result }, null, 2)}\n`,
  );
  console.log(`  recorded in ${file}`);
}

main()
  .then(async () => {
    await stopAll();
    process.exit(0);
  })
  .catch((err: unknown) => {
    // a wrong command line is told in one line; anything else with its stack
    console.error(err instanceof UsageError ? `error: ${err.message}` : err);
    cleanup();
    process.exit(1);
  });
