// Benchmark: the plane as `npm start` runs it. A whole stack is started the way a user starts one
// (`node dist/src/stack/main.js --config <file>`, the environment file setting only where things
// are: addresses and the data folder; every other key is the stack's default: two invocation
// replicas, the demo's five instances, the callback proxy, NATS with TLS and auth, logging at
// info), beside a plain Node echo server started in the same run (the baseline of
// ../shared/checks/S-speed.sh). Measured: 1 KiB echo invocations of demo-echo with wrk at one and
// at N connections, the CPU every process of the stack spends per invocation (grouped by role), the
// CPU the stack spends at rest, and a large body streamed through it both ways (chunked, checksum
// checked) with the peak RSS growth of its processes. The stack and everything it started are
// stopped afterwards.
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import {
  environOf,
  runStack,
  stackProcesses,
  waitStackReady,
  writeStackConfig,
  type StackJson,
} from "../test/testkit/stack.js";
import {
  cpuMs,
  descendantsOf,
  freePort,
  machine,
  medianOf,
  removeLater,
  start,
  waitHttp,
  wrk,
} from "./harness.js";
import { withFootprint } from "./stream.js";
import { requireTools } from "./tools.js";

export interface StackBenchOptions {
  /** Seconds of wrk per measurement. */
  seconds: number;
  /** Connections of the loaded measurement (the other is one connection). */
  connections: number;
  rounds: number;
  /** The body streamed through the stack each way, in MiB. */
  mib: number;
  /** Seconds the stack is left at rest while its CPU is read. */
  idleSeconds: number;
  /** log.level in the environment file; unset: the stack's default (info), as `npm start` runs. */
  logLevel?: string;
}

/** The stack's processes' roles, in the order the rows list them. */
export const STACK_ROLES = [
  "invocation replicas",
  "demo-echo workers",
  "callback proxy",
  "nats-server",
  "demo-echo servers",
  "api",
  "other workers (idle functions)",
  "other inference servers (idle functions)",
  "others",
] as const;

interface StackProc {
  pid: number;
  role: string;
  /** What it is, for the per-process breakdown of "others" (compute, grpc-proxy, ...). */
  name: string;
}

const round3 = (x: number) => Math.round(x * 1000) / 1000;

function cmdlineOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ").trim();
  } catch {
    return "";
  }
}

/**
 * The stack's processes by role: the tree below the stack's own process (the inference servers
 * run as another user, in folders of their own, so only the tree finds them) and whatever else
 * names the stack's folder. Any `haproxy` process, or callplane's own callback-proxy service, is the
 * callback proxy, whichever of the two the stack runs.
 */
function stackRoles(stackPid: number, dir: string, demo: StackJson["demo"], notOurs: number[]): StackProc[] {
  const pids = new Set([stackPid, ...descendantsOf(stackPid), ...stackProcesses(dir).map((p) => p.pid)]);
  // the baseline echo server's command line names the folder too
  for (const pid of notOurs) pids.delete(pid);
  const procs = [...pids].map((pid) => ({ pid, cmd: cmdlineOf(pid) })).filter((p) => p.cmd);
  const env = (pid: number) => {
    try {
      return environOf(pid);
    } catch {
      return {};
    }
  };
  // the demo-echo instances' inference servers listen on the address their workers call
  const echoHosts = new Set(
    procs
      .filter((p) => p.cmd.includes("/services/worker/"))
      .map((p) => env(p.pid))
      .filter((e) => e.FUNCTION_ID === demo.httpFunctionId)
      .map((e) => e.INFERENCE_HOST),
  );
  return procs.map(({ pid, cmd }) => {
    const argv0 = cmd.split(" ")[0];
    const service = /\/services\/([\w-]+)\/main\.js/.exec(cmd)?.[1];
    let role = "others";
    let name = service ?? argv0.split("/").at(-1) ?? "?";
    if (/nats-server/.test(argv0)) role = "nats-server";
    else if (/haproxy/.test(argv0) || service === "callback-proxy") {
      role = "callback proxy";
      name = /haproxy/.test(argv0) ? "haproxy" : "callback-proxy";
    } else if (service === "invocation") role = "invocation replicas";
    else if (service === "api") role = "api";
    else if (service === "worker")
      role =
        env(pid).FUNCTION_ID === demo.httpFunctionId ? "demo-echo workers" : "other workers (idle functions)";
    else if (/examples\/(inference|grpc)-server\.js/.test(cmd)) {
      const host = /--listen (\S+):\d+/.exec(cmd)?.[1];
      role = host && echoHosts.has(host) ? "demo-echo servers" : "other inference servers (idle functions)";
      name = /grpc-server/.test(cmd) ? "grpc-server" : "inference-server";
    } else if (cmd.includes("stack/main.js")) name = "stack";
    return { pid, role, name };
  });
}

/** CPU ms of each process now; a process that is gone reads as undefined. */
function cpuOf(procs: StackProc[]): Map<number, number | undefined> {
  return new Map(
    procs.map((p) => {
      try {
        return [p.pid, cpuMs(p.pid)];
      } catch {
        return [p.pid, undefined];
      }
    }),
  );
}

/** CPU used between two readings, summed by role and, for "others", by process name. */
function cpuUsed(
  procs: StackProc[],
  before: Map<number, number | undefined>,
  after: Map<number, number | undefined>,
): { byRole: Record<string, number>; others: Record<string, number>; total: number } {
  const byRole: Record<string, number> = {};
  const others: Record<string, number> = {};
  let total = 0;
  for (const p of procs) {
    const a = before.get(p.pid);
    const b = after.get(p.pid);
    const used = a !== undefined && b !== undefined ? b - a : 0;
    byRole[p.role] = (byRole[p.role] ?? 0) + used;
    if (p.role === "others") others[p.name] = (others[p.name] ?? 0) + used;
    total += used;
  }
  return { byRole, others, total };
}

/** The plain Node echo server of S-speed.sh (a 1 KiB body is read whole, answered with its length); a
 * body without a length (chunked) is streamed back as it comes, so that 1 GiB is not held. */
const ECHO_SERVER = `
const http = require("http");
http.createServer((q, r) => {
  if (q.headers["content-length"] === undefined) {
    r.writeHead(200, { "content-type": "application/octet-stream" });
    q.pipe(r);
    return;
  }
  const c = [];
  q.on("data", (d) => c.push(d));
  q.on("end", () => {
    const b = Buffer.concat(c);
    r.writeHead(200, { "content-type": "application/json", "content-length": b.length });
    r.end(b);
  });
}).listen(Number(process.argv[2]), "127.0.0.1");
`;

export interface StreamTransfer {
  status: number;
  bytes: number;
  seconds: number;
  mbPerSecEachWay: number;
  checksumMatches: boolean;
}

/**
 * Streams `mib` MiB of random bytes (64 KiB writes, chunked: no Content-Length) to `url`, honouring
 * backpressure, and reads the echo as it comes, hashing both sides: the body came back whole and
 * in order when the two SHA-256 sums agree.
 */
export function streamEcho(
  url: string,
  headers: Record<string, string>,
  mib: number,
): Promise<StreamTransfer> {
  const total = mib * 2 ** 20;
  const piece = 64 * 1024;
  const pattern = randomBytes(2 ** 20);
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const sent = createHash("sha256");
    const got = createHash("sha256");
    let received = 0;
    const req = request(url, { method: "POST", headers, agent: false });
    req.on("error", reject);
    req.on("response", (res) => {
      res.on("data", (d: Buffer) => {
        received += d.length;
        got.update(d);
      });
      res.on("error", reject);
      res.on("end", () => {
        const seconds = (performance.now() - t0) / 1000;
        resolve({
          status: res.statusCode ?? 0,
          bytes: received,
          seconds: round3(seconds),
          mbPerSecEachWay: Math.round((received / 1e6 / seconds) * 10) / 10,
          checksumMatches: received === total && sent.digest("hex") === got.digest("hex"),
        });
      });
    });
    let offset = 0;
    let n = 0;
    const write = () => {
      while (offset < total) {
        // each piece differs (its number in its first bytes), so a piece repeated or lost shows
        const b = Buffer.allocUnsafe(Math.min(piece, total - offset));
        pattern.copy(b, 0, offset % pattern.length);
        b.writeUInt32BE(n++ >>> 0, 0);
        sent.update(b);
        offset += b.length;
        if (!req.write(b)) {
          req.once("drain", write);
          return;
        }
      }
      req.end();
    };
    write();
  });
}

interface WrkRow {
  requests: number;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
}

export async function benchStack(o: StackBenchOptions): Promise<Record<string, unknown>> {
  requireTools("wrk");
  const dir = mkdtempSync(join(tmpdir(), "callplane-bench-stack-"));
  const undo: Array<() => unknown> = [];
  try {
    // the direct baseline: a plain Node echo server, as S-speed.sh starts one
    const echoPort = await freePort();
    writeFileSync(join(dir, "echo.cjs"), ECHO_SERVER);
    const echo = await start("direct-echo", process.execPath, [join(dir, "echo.cjs"), String(echoPort)], {});
    await waitHttp(`http://127.0.0.1:${echoPort}/`);
    const direct = `http://127.0.0.1:${echoPort}/`;

    // the stack, as `npm start` runs it: addresses of its own (so it never meets a user's stack
    // or a test's), every other setting the default
    const cfg = await writeStackConfig(
      dir,
      {
        host: "127.0.90.1",
        podNetwork: "127.0.91.0/24",
        grpcNetwork: "127.0.93.0/24",
        instanceNetwork: "127.0.92.0/24",
      },
      { userDefaults: true, extraYaml: o.logLevel ? ["log:", `  level: ${o.logLevel}`] : [] },
    );
    const t0 = Date.now();
    // warmed as npm start warms it (the tests' stacks are not)
    const run = runStack({ after: (fn) => void (fn && undo.push(fn as () => unknown)) }, dir, cfg.file, {
      CALLPLANE_STACK_WARMUP: "3000",
    });
    const info = await waitStackReady(run, cfg.dataDir);
    const startSeconds = Math.round((Date.now() - t0) / 100) / 10;
    const procs = stackRoles(run.child.pid!, dir, info.demo, [echo.pid!]);
    const url = `${info.invocation[0]}/v2/nvcf/pexec/functions/${info.demo.httpFunctionId}`;

    // S-speed.sh's request: a 1 KiB JSON body with the demo's key
    const lua = (file: string, auth: boolean) => {
      writeFileSync(
        join(dir, file),
        [
          'wrk.method = "POST"',
          `wrk.body = '{"p":"' .. string.rep("x", 1016) .. '"}'`,
          'wrk.headers["Content-Type"] = "application/json"',
          ...(auth ? [`wrk.headers["Authorization"] = "Bearer ${info.demo.apiKey}"`] : []),
          "",
        ].join("\n"),
      );
      return join(dir, file);
    };
    const scripts = { direct: lua("direct.lua", false), stack: lua("stack.lua", true) };
    const targets = { direct, stack: url };
    const load = async (which: "direct" | "stack", connections: number, seconds: number) => {
      const pids = which === "stack" ? procs : [{ pid: echo.pid!, role: "direct echo", name: "echo" }];
      const before = cpuOf(pids);
      const w = await wrk(targets[which], scripts[which], { seconds, connections });
      const used = cpuUsed(pids, before, cpuOf(pids));
      const done = Math.max(1, w.requests - w.errors);
      const per = (ms: number) => round3(ms / done);
      const row: WrkRow = { requests: w.requests, rps: w.rps, p50: w.p50ms, p99: w.p99ms, errors: w.errors };
      return {
        ...row,
        cpuMsPerInvocation: {
          ...Object.fromEntries(Object.entries(used.byRole).map(([k, v]) => [k, per(v)])),
          total: per(used.total),
          wrk: per(w.cpuMs),
        },
        othersCpuMsPerInvocation: Object.fromEntries(
          Object.entries(used.others).map(([k, v]) => [k, per(v)]),
        ),
      };
    };

    // warm up both paths (JIT, the key cache, the pools), then let the stack settle
    await load("direct", 8, 2);
    await load("stack", 8, 2);
    await sleep(1000);

    // at rest: what the stack costs while nothing is invoked (timers, heartbeats, pulls, syncs)
    const rest0 = cpuOf(procs);
    await sleep(o.idleSeconds * 1000);
    const rest = cpuUsed(procs, rest0, cpuOf(procs));
    const perSecond = (ms: number) => round3(ms / o.idleSeconds);
    const idleCpuMsPerSecond = {
      ...Object.fromEntries(Object.entries(rest.byRole).map(([k, v]) => [k, perSecond(v)])),
      total: perSecond(rest.total),
      othersByProcess: Object.fromEntries(Object.entries(rest.others).map(([k, v]) => [k, perSecond(v)])),
    };

    const headers = {
      authorization: `Bearer ${info.demo.apiKey}`,
      "content-type": "application/octet-stream",
      // a long body must not turn into a 202 and a poll half way
      "nvcf-poll-seconds": "3600",
    };
    const roles: Record<string, number[]> = {};
    for (const p of procs) (roles[p.role] ??= []).push(p.pid);

    const rounds = [];
    for (let r = 0; r < Math.max(1, o.rounds); r++) {
      const one = { direct: await load("direct", 1, o.seconds), stack: await load("stack", 1, o.seconds) };
      const many = {
        direct: await load("direct", o.connections, o.seconds),
        stack: await load("stack", o.connections, o.seconds),
      };
      const streamDirect = await withFootprint({ echo: [echo.pid!] }, () =>
        streamEcho(direct, { "content-type": "application/octet-stream" }, o.mib),
      );
      const streamStack = await withFootprint(roles, () => streamEcho(url, headers, o.mib));
      for (const [name, s] of [
        ["direct", streamDirect.result],
        ["stack", streamStack.result],
      ] as const)
        if (s.status !== 200 || !s.checksumMatches)
          throw new Error(
            `${o.mib} MiB ${name}: status ${s.status}, ${s.bytes} of ${o.mib * 2 ** 20} bytes came back${s.checksumMatches ? "" : ", checksum differs"}`,
          );
      const growth = streamStack.footprint.peakGrowthMiB;
      rounds.push({
        oneConnection: one,
        manyConnections: many,
        addedP50ms: round3(one.stack.p50 - one.direct.p50),
        ratio: {
          oneConnection: one.stack.rps / one.direct.rps,
          manyConnections: many.stack.rps / many.direct.rps,
          stream: streamStack.result.mbPerSecEachWay / streamDirect.result.mbPerSecEachWay,
        },
        stream: {
          direct: { ...streamDirect.result, peakGrowthMiB: streamDirect.footprint.peakGrowthMiB.echo },
          stack: {
            ...streamStack.result,
            peakRssMiB: streamStack.footprint.peakRssMiB,
            peakGrowthMiB: growth,
            // each role's processes' growth added up: what the stack as a whole took on
            totalPeakGrowthMiB: Object.values(growth).reduce((s, x) => s + x, 0),
            cpuMsPerMiB: Object.fromEntries(
              Object.entries(streamStack.footprint.cpuMs).map(([k, v]) => [k, round3(v / o.mib)]),
            ),
          },
        },
      });
    }
    const m = medianOf(rounds);
    return {
      benchmark: "stack",
      machine: machine(),
      options: o,
      stack: {
        startSeconds,
        config: readFileSync(cfg.file, "utf8"),
        processes: Object.fromEntries(
          STACK_ROLES.map((role) => [
            role,
            procs.filter((p) => p.role === role).map((p) => `${p.name} (pid ${p.pid})`),
          ]),
        ),
      },
      idleCpuMsPerSecond,
      oneConnection: m.oneConnection,
      manyConnections: m.manyConnections,
      addedP50ms: m.addedP50ms,
      ratios: {
        oneConnection: round3(m.ratio.oneConnection),
        manyConnections: round3(m.ratio.manyConnections),
        stream: round3(m.ratio.stream),
      },
      stream: {
        direct: m.stream.direct,
        stack: {
          ...m.stream.stack,
          // memory: the most over the rounds, not the median
          peakRssMiB: maxOver(rounds.map((x) => x.stream.stack.peakRssMiB)),
          peakGrowthMiB: maxOver(rounds.map((x) => x.stream.stack.peakGrowthMiB)),
          totalPeakGrowthMiB: Math.max(...rounds.map((x) => x.stream.stack.totalPeakGrowthMiB)),
        },
      },
      rounds,
    };
  } finally {
    for (const f of undo.reverse()) await f();
    if (process.env.CALLPLANE_BENCH_KEEP) console.log(`  kept ${dir}`);
    else removeLater(dir);
  }
}

function maxOver(xs: Array<Record<string, number>>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const x of xs) for (const [k, v] of Object.entries(x)) out[k] = Math.max(out[k] ?? 0, v);
  return out;
}
