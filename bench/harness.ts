// Shared pieces of the benchmarks: free ports, child processes that are always stopped, CPU time
// read from /proc, and the load generator (autocannon, in this process, while the services under
// test run as separate processes).
import autocannon from "autocannon";
import { Client } from "undici";
import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, openSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { cpus, totalmem } from "node:os";
import { ensureTool } from "./tools.js";

export const procs: ChildProcess[] = [];
const leftovers: string[] = [];

/**
 * Removes a benchmark's folder now if it can, else once its processes are stopped (a nats-server
 * still writing its store makes the removal fail); a failed cleanup never fails a benchmark.
 */
export function removeLater(dir: string): void {
  try {
    rmSync(dir, { recursive: true, force: true, maxRetries: 2 });
  } catch {
    leftovers.push(dir);
  }
}

export function cleanup(): void {
  for (const p of procs) if (p.exitCode === null) p.kill("SIGKILL");
}

/**
 * Stops every child politely (so that profilers can write their files), then kills what is left.
 * Profiled services get longer: a replica's stop waits out its drain delay before it exits, and a
 * killed process writes no profile.
 */
export async function stopAll(
  graceMs = process.env.CALLPLANE_BENCH_NODE_ARGS ? 40_000 : 3000,
): Promise<void> {
  const alive = procs.filter((p) => p.exitCode === null && p.signalCode === null);
  // the list is emptied: a run of several benchmarks stops each one's processes before the next
  procs.length = 0;
  await Promise.all(
    alive.map(
      (p) =>
        new Promise<void>((resolve) => {
          const t = setTimeout(() => {
            p.kill("SIGKILL");
            resolve();
          }, graceMs);
          p.once("exit", () => {
            clearTimeout(t);
            resolve();
          });
          p.kill("SIGTERM");
        }),
    ),
  );
  for (const dir of leftovers.splice(0)) rmSync(dir, { recursive: true, force: true, maxRetries: 3 });
}
process.on("exit", cleanup);
process.on("SIGINT", () => process.exit(130));

export function freePort(host = "127.0.0.1"): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, host, () => {
      const a = s.address();
      s.close(() => resolve(typeof a === "object" && a ? a.port : 0));
    });
  });
}

/** Starts a child; for callplane services waits for their `ready` message on the control channel. */
export function start(
  name: string,
  command: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  opts: { ipc?: boolean; logFile?: string; uid?: number } = {},
): Promise<ChildProcess> {
  return new Promise((resolve, reject) => {
    // CALLPLANE_BENCH_NODE_ARGS="--cpu-prof --cpu-prof-dir=/tmp/prof" profiles the services under test
    const extra =
      command === process.execPath && process.env.CALLPLANE_BENCH_NODE_ARGS
        ? process.env.CALLPLANE_BENCH_NODE_ARGS.split(" ")
        : [];
    const out = opts.logFile ? openSync(opts.logFile, "a") : "ignore";
    const child = spawn(command, [...extra, ...args], {
      env: { ...process.env, ...env },
      stdio: opts.ipc ? ["ignore", out, "inherit", "ipc"] : ["ignore", out, "inherit"],
      ...(opts.uid !== undefined ? { uid: opts.uid, gid: opts.uid } : {}),
    });
    if (typeof out === "number") closeSync(out);
    procs.push(child);
    child.once("error", reject);
    child.once("exit", (code) => reject(new Error(`${name} exited with ${code}`)));
    if (!opts.ipc) {
      child.once("spawn", () => resolve(child));
      return;
    }
    child.on("message", (m: { type?: string; message?: string }) => {
      if (m.type === "ready") resolve(child);
      if (m.type === "failed") reject(new Error(`${name}: ${m.message}`));
    });
  });
}

export async function waitHttp(url: string, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const r = await fetch(url);
      if (r.ok) return;
    } catch {
      // not up yet
    }
    if (Date.now() > deadline) throw new Error(`${url} did not come up`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** utime + stime of a process, in milliseconds. */
/** Every process below `root`, from /proc's parent links (read once, so a snapshot). */
export function descendantsOf(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const list = children.get(ppid) ?? [];
      list.push(Number(name));
      children.set(ppid, list);
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  const walk = (pid: number) => {
    for (const c of children.get(pid) ?? []) {
      out.push(c);
      walk(c);
    }
  };
  walk(root);
  return out;
}

/** The CPU time of a process and every process below it (a service that runs a helper, as the
 * callback proxy runs HAProxy), in ms. */
export function treeCpuMs(pid: number): number {
  return [pid, ...descendantsOf(pid)].reduce((sum, p) => {
    try {
      return sum + cpuMs(p);
    } catch {
      return sum; // gone meanwhile
    }
  }, 0);
}

export function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const ticks = Number(fields[11]) + Number(fields[12]);
  return (ticks * 1000) / 100;
}

export interface LoadResult {
  requests: number;
  rps: number;
  p50: number;
  p99: number;
  errors: number;
  non2xx: number;
  durationS: number;
}

export async function load(opts: {
  url: string;
  connections: number;
  seconds: number;
  body: Buffer;
  headers: Record<string, string>;
  method?: "POST" | "GET";
}): Promise<LoadResult> {
  const r = await autocannon({
    url: opts.url,
    method: opts.method ?? "POST",
    connections: opts.connections,
    duration: opts.seconds,
    body: opts.body,
    headers: opts.headers,
    pipelining: 1,
  });
  return {
    requests: r.requests.total,
    rps: r.requests.average,
    p50: r.latency.p50,
    p99: r.latency.p99,
    errors: r.errors + r.timeouts,
    non2xx: r.non2xx,
    durationS: r.duration,
  };
}

/**
 * Latency with one client at a time: sequential requests on one keep-alive connection, timed with
 * the high-resolution clock (autocannon rounds percentiles to whole milliseconds).
 */
export async function sequential(opts: {
  url: string;
  seconds: number;
  body: Buffer;
  headers: Record<string, string>;
}): Promise<{ requests: number; p50: number; p90: number; p99: number; mean: number; errors: number }> {
  const u = new URL(opts.url);
  const client = new Client(u.origin, { keepAliveTimeout: 30_000 });
  const times: number[] = [];
  let errors = 0;
  const end = performance.now() + opts.seconds * 1000;
  try {
    while (performance.now() < end) {
      const t0 = performance.now();
      const r = await client.request({
        method: "POST",
        path: u.pathname + u.search,
        headers: opts.headers,
        body: opts.body,
      });
      await r.body.arrayBuffer();
      if (r.statusCode !== 200) errors++;
      times.push(performance.now() - t0);
    }
  } finally {
    await client.close();
  }
  times.sort((a, b) => a - b);
  const q = (p: number) =>
    Math.round(times[Math.min(times.length - 1, Math.floor(times.length * p))] * 1000) / 1000;
  return {
    requests: times.length,
    p50: q(0.5),
    p90: q(0.9),
    p99: q(0.99),
    mean: Math.round((times.reduce((s, x) => s + x, 0) / times.length) * 1000) / 1000,
    errors,
  };
}

export interface WrkResult {
  requests: number;
  rps: number;
  p50ms: number;
  p99ms: number;
  mbPerSec: number;
  errors: number;
  /** CPU time wrk itself used (user + system). */
  cpuMs: number;
}

function parseLatency(text: string, pct: string): number {
  const m = new RegExp(`^\\s*${pct}%\\s+([\\d.]+)(us|ms|s)`, "m").exec(text);
  if (!m) return NaN;
  const v = Number(m[1]);
  return m[2] === "us" ? v / 1000 : m[2] === "s" ? v * 1000 : v;
}

/** Runs wrk (C, cheap on CPU) with a Lua script; also reports the CPU time wrk itself used. */
export function wrk(
  url: string,
  script: string,
  o: { seconds: number; connections: number },
): Promise<WrkResult> {
  return new Promise((resolve, reject) => {
    // `times` prints the CPU time of the shell's children (wrk) once it has exited
    const p = spawn(
      "bash",
      [
        "-c",
        'wrk -t1 -c"$1" -d"$2"s --latency -s "$3" "$4"; times',
        "bash",
        String(o.connections),
        String(o.seconds),
        script,
        url,
      ],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    let out = "";
    p.stdout.on("data", (d: Buffer) => (out += d.toString()));
    p.stderr.on("data", (d: Buffer) => (out += d.toString()));
    p.on("error", reject);
    p.on("close", () => {
      const requests = Number(/(\d+) requests in/.exec(out)?.[1] ?? 0);
      const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? 0);
      const transfer = /Transfer\/sec:\s+([\d.]+)(B|KB|MB|GB)/.exec(out);
      const unit = { B: 1 / 2 ** 20, KB: 1 / 1024, MB: 1, GB: 1024 }[transfer?.[2] ?? "MB"] ?? 1;
      const errs = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
      const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0);
      const times = [...out.matchAll(/(\d+)m([\d.]+)s (\d+)m([\d.]+)s/g)].at(-1);
      const cpuMs = times
        ? (Number(times[1]) * 60 + Number(times[2]) + Number(times[3]) * 60 + Number(times[4])) * 1000
        : NaN;
      resolve({
        cpuMs,
        requests,
        rps,
        p50ms: parseLatency(out, "50"),
        p99ms: parseLatency(out, "99"),
        mbPerSec: Number(transfer?.[1] ?? 0) * unit,
        errors: non2xx + (errs ? Number(errs[1]) + Number(errs[2]) + Number(errs[3]) + Number(errs[4]) : 0),
      });
    });
  });
}

/** wrk is there (installed from Debian's package when missing and possible). */
export const hasWrk = (): boolean => !(ensureTool("wrk") instanceof Error);

/** A wrk script for one request shape. */
export function wrkScript(
  file: string,
  method: string,
  path: string,
  headers: Record<string, string>,
  bodyBytes: number,
): string {
  writeFileSync(
    file,
    `wrk.method = "${method}"\nwrk.path = "${path}"\n${Object.entries(headers)
      .map(([k, v]) => `wrk.headers["${k}"] = "${v}"`)
      .join("\n")}\n${bodyBytes ? `wrk.body = string.rep("x", ${bodyBytes})` : ""}\n`,
  );
  return file;
}

/** One load run: wrk (C) when installed, since a Node load generator would take a large share of two cores; else autocannon. */
export async function loadOnce(o: {
  url: string;
  headers: Record<string, string>;
  body: Buffer;
  seconds: number;
  connections: number;
  /** Where wrk's script is written. */
  scriptFile: string;
}): Promise<LoadResult & { loadgen: "wrk" | "autocannon"; loadgenCpuMs: number }> {
  if (hasWrk()) {
    const u = new URL(o.url);
    const script = wrkScript(o.scriptFile, "POST", u.pathname, o.headers, o.body.length);
    const w = await wrk(u.origin, script, { seconds: o.seconds, connections: o.connections });
    return {
      requests: w.requests,
      rps: w.rps,
      p50: w.p50ms,
      p99: w.p99ms,
      errors: w.errors,
      non2xx: 0,
      durationS: o.seconds,
      loadgen: "wrk",
      loadgenCpuMs: w.cpuMs,
    };
  }
  const lg0 = process.cpuUsage();
  const r = await load({
    url: o.url,
    headers: o.headers,
    connections: o.connections,
    seconds: o.seconds,
    body: o.body,
  });
  const u = process.cpuUsage(lg0);
  return { ...r, loadgen: "autocannon", loadgenCpuMs: (u.user + u.system) / 1000 };
}

/** A process's resident memory now (VmRSS) or at its peak (VmHWM), in KiB. */
export function rssKiB(pid: number, field: "VmRSS" | "VmHWM" = "VmRSS"): number {
  const m = new RegExp(`^${field}:\\s+(\\d+)`, "m").exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) : NaN;
}

/** Resets the kernel's peak-RSS mark of a process (root, or the process's owner). */
export function resetPeak(pid: number): void {
  writeFileSync(`/proc/${pid}/clear_refs`, "5");
}

/** The 1, 5 and 15 minute load averages (runnable and waiting processes, whoever runs them). */
export function loadavg(): [number, number, number] {
  const [a, b, c] = readFileSync("/proc/loadavg", "utf8").split(" ").map(Number);
  return [a, b, c];
}

export const median = (xs: number[]): number => {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!s.length) return NaN;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** The median of each numeric field over the rounds (nested one level for per-process maps). */
export function medianOf<T extends object>(runs: T[]): T {
  const first = runs[0] as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(first)) {
    if (typeof v === "number") out[k] = median(runs.map((r) => (r as Record<string, number>)[k]));
    else if (v && typeof v === "object" && !Array.isArray(v))
      out[k] = medianOf(runs.map((r) => (r as Record<string, object>)[k]));
    else out[k] = v;
  }
  return out as T;
}

export function machine(): string {
  const c = cpus();
  return `${c.length} x ${c[0]?.model ?? "cpu"}, ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}, ${process.platform}`;
}
