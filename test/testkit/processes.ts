// Child processes for end-to-end tests: callplane services started as `node dist/.../main.js` with
// environment overrides (they report `ready` or `failed` on the IPC control channel), the example
// inference server, and their memory read from /proc. Every process is stopped in t.after: SIGTERM,
// then SIGKILL after a grace period. A plane's parts are stopped in reverse start order, so services
// stop while nats-server is still there to drain to.
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { parseChildMessage } from "../../src/lib/process/index.js";
import { startNats, type Nats } from "./nats.js";
import { distRoot } from "./paths.js";
import { reverseScope, tmpDir } from "./scope.js";
import { startApi, type ApiFixture } from "./services.js";
// Scope and reverseScope moved to scope.ts; many tests import them from here
export { Scope, reverseScope } from "./scope.js";
import { deployFunction, workerEnv, type DeployedFunction } from "./plane.js";

type Ctx = Pick<TestContext, "after">;

export const scripts = {
  invocation: join(distRoot, "src", "services", "invocation", "main.js"),
  worker: join(distRoot, "src", "services", "worker", "main.js"),
  exampleServer: join(distRoot, "examples", "inference-server.js"),
  callbackProxy: join(distRoot, "src", "services", "callback-proxy", "main.js"),
  grpcProxy: join(distRoot, "src", "services", "grpc-proxy", "main.js"),
  grpcExampleServer: join(distRoot, "examples", "grpc-server.js"),
} as const;

export interface ProcessExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export interface ChildHandle {
  readonly name: string;
  readonly child: ChildProcess;
  readonly pid: number;
  /** What the service reported with `ready` (empty for processes without a control channel). */
  readonly urls: Record<string, string>;
  /** Settles when the process has exited. */
  readonly exited: Promise<ProcessExit>;
  readonly running: boolean;
  /** The last 64 KiB of its stdout and stderr, for failure messages. */
  output(): string;
  /** SIGTERM, then SIGKILL after graceMs. Resolves with how it exited. */
  stop(graceMs?: number): Promise<ProcessExit>;
  /** Sends a signal and resolves once the process has exited. */
  kill(signal?: NodeJS.Signals): Promise<ProcessExit>;
}

const OUTPUT_TAIL = 64 * 1024;

/** The test runner's environment without what would change a child's behaviour behind its back. */
function baseEnv(): NodeJS.ProcessEnv {
  // no drain delay unless a test asks for one: nothing balances these processes, and every stop
  // would wait it out
  const env: NodeJS.ProcessEnv = {
    CALLPLANE__INVOCATION__DRAIN_DELAY_SECONDS: "0",
    CALLPLANE__GRPCPROXY__DRAIN_DELAY_SECONDS: "0",
    CALLPLANE__WORKER_CALLBACK_PROXY__DRAIN_DELAY_SECONDS: "0",
  };
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith("CALLPLANE__") || k === "CALLPLANE_CONFIG" || k === "NODE_TEST_CONTEXT") continue;
    if (k === "NODE_OPTIONS") continue;
    env[k] = v;
  }
  return env;
}

/** How a child is started, beyond its script and environment. */
export interface SpawnExtras {
  /**
   * A command that node runs under, for example `["ip", "netns", "exec", "<namespace>"]`. It must
   * exec node in its own place (as `ip netns exec` does), so the pid, the signals and the IPC
   * channel are node's.
   */
  prefix?: string[];
  /** Called with each line the process writes to stdout or stderr (all of them, not only the tail). */
  onLine?: (line: string) => void;
}

function spawnChild(
  t: Ctx,
  name: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  ipc: boolean,
  extras: SpawnExtras = {},
): { handle: ChildHandle; onLine: (fn: (line: string) => void) => void } {
  const prefix = extras.prefix ?? [];
  const command = prefix.length ? prefix[0] : process.execPath;
  const argv = prefix.length ? [...prefix.slice(1), process.execPath, ...args] : args;
  const child = spawn(command, argv, {
    env: { ...baseEnv(), ...env },
    stdio: ipc ? ["ignore", "pipe", "pipe", "ipc"] : ["ignore", "pipe", "pipe"],
    serialization: "json",
  });
  let tail = "";
  let partial = "";
  const lineListeners: Array<(line: string) => void> = extras.onLine ? [extras.onLine] : [];
  const collect = (d: Buffer) => {
    const s = d.toString();
    tail = (tail + s).slice(-OUTPUT_TAIL);
    partial += s;
    let nl: number;
    while ((nl = partial.indexOf("\n")) !== -1) {
      const line = partial.slice(0, nl);
      partial = partial.slice(nl + 1);
      for (const f of lineListeners) f(line);
    }
    if (partial.length > OUTPUT_TAIL) partial = partial.slice(-OUTPUT_TAIL);
  };
  child.stdout!.on("data", collect);
  child.stderr!.on("data", collect);
  const exited = new Promise<ProcessExit>((resolve) => {
    child.once("exit", (code, signal) => resolve({ code, signal }));
    // a spawn failure never reaches "exit"
    child.once("error", () => resolve({ code: null, signal: null }));
  });
  const running = () => child.exitCode === null && child.signalCode === null && child.pid !== undefined;
  const handle: ChildHandle = {
    name,
    child,
    pid: child.pid ?? -1,
    urls: {},
    exited,
    get running() {
      return running();
    },
    output: () => tail,
    async kill(signal = "SIGKILL") {
      if (running()) child.kill(signal);
      return exited;
    },
    async stop(graceMs = 5000) {
      if (!running()) return exited;
      child.kill("SIGTERM");
      const killer = setTimeout(() => child.kill("SIGKILL"), graceMs);
      const r = await exited;
      clearTimeout(killer);
      return r;
    },
  };
  t.after(() => handle.stop().then(() => undefined));
  return { handle, onLine: (fn) => lineListeners.push(fn) };
}

/**
 * Starts `node <script>` as a callplane service: waits for `ready` on the control channel (and its
 * URLs), and fails with the child's output on `failed`, an early exit or a timeout.
 */
export async function startService(
  t: Ctx,
  name: string,
  script: string,
  env: NodeJS.ProcessEnv,
  opts: { args?: string[]; readyTimeoutMs?: number } & SpawnExtras = {},
): Promise<ChildHandle> {
  const { handle } = spawnChild(t, name, [script, ...(opts.args ?? [])], env, true, {
    prefix: opts.prefix,
    onLine: opts.onLine,
  });
  const { child } = handle;
  const timeoutMs = opts.readyTimeoutMs ?? 20_000;
  const urls = await new Promise<Record<string, string>>((resolve, reject) => {
    let settled = false;
    const fail = (why: string) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      child.kill("SIGKILL");
      reject(new Error(`${name} ${why}\n--- output ---\n${handle.output()}`));
    };
    const timer = setTimeout(() => fail(`did not report ready within ${timeoutMs} ms`), timeoutMs);
    child.on("message", (raw) => {
      const msg = parseChildMessage(raw);
      if ("invalid" in msg || settled) return;
      if (msg.type === "ready") {
        settled = true;
        clearTimeout(timer);
        resolve(msg.urls);
      } else if (msg.type === "failed") {
        fail(`failed to start (${msg.code}): ${msg.message}`);
      }
    });
    void handle.exited.then((e) => fail(`exited during start (${e.signal ?? `code ${e.code}`})`));
  });
  Object.assign(handle.urls, urls);
  return handle;
}

/**
 * Starts the example inference server (or, with `grpc`, the example gRPC server) as a child on
 * 127.0.0.1 and a port the kernel picks (or on `listen`, under `prefix`).
 */
export async function startExampleProcess(
  t: Ctx,
  opts: { listen?: { host: string; port: number }; prefix?: string[]; grpc?: boolean } = {},
): Promise<{ process: ChildHandle; port: number; url: string }> {
  const listen = opts.listen ?? { host: "127.0.0.1", port: 0 };
  const listening = opts.grpc ? "example gRPC server listening" : "example inference server listening";
  const { handle, onLine } = spawnChild(
    t,
    "inference-server",
    [
      opts.grpc ? scripts.grpcExampleServer : scripts.exampleServer,
      "--listen",
      `${listen.host}:${listen.port}`,
    ],
    {},
    false,
    { prefix: opts.prefix },
  );
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`the example server did not start\n${handle.output()}`)),
      10_000,
    );
    onLine((line) => {
      try {
        const m = JSON.parse(line) as { msg?: string; port?: number };
        if (m.msg === listening && m.port) {
          clearTimeout(timer);
          resolve(m.port);
        }
      } catch {
        // not a JSON line
      }
    });
    void handle.exited.then((e) => {
      clearTimeout(timer);
      reject(new Error(`the example server exited (${e.signal ?? e.code})\n${handle.output()}`));
    });
  });
  return { process: handle, port, url: `http://${listen.host}:${port}` };
}

/** Resident memory of a process in bytes (VmRSS in /proc/<pid>/status). */
export function rssBytes(pid: number): number {
  const m = /^VmRSS:\s+(\d+)\s+kB$/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  if (!m) throw new Error(`no VmRSS for process ${pid}`);
  return Number(m[1]) * 1024;
}

export interface RssPeak {
  baseline: number;
  peak: number;
  /** peak - baseline */
  growth: number;
  samples: number;
}

/** Samples the RSS of some processes every intervalMs until stop(); returns baseline and peak of each. */
export function sampleRss(
  pids: Record<string, number>,
  intervalMs = 100,
): { stop(): Record<string, RssPeak> } {
  const stats: Record<string, RssPeak> = {};
  const sample = () => {
    for (const [name, pid] of Object.entries(pids)) {
      let rss: number;
      try {
        rss = rssBytes(pid);
      } catch {
        continue; // exited
      }
      const s = (stats[name] ??= { baseline: rss, peak: rss, growth: 0, samples: 0 });
      s.peak = Math.max(s.peak, rss);
      s.growth = s.peak - s.baseline;
      s.samples++;
    }
  };
  sample();
  const timer = setInterval(sample, intervalMs);
  return {
    stop() {
      clearInterval(timer);
      sample();
      return stats;
    },
  };
}

export interface ProcessPlane {
  nats: Nats;
  api: ApiFixture;
  fn: DeployedFunction;
  inference: { process: ChildHandle; port: number; url: string };
  invocation: ChildHandle;
  /** The invocation replica's client-facing origin. */
  invocationUrl: string;
  workers: ChildHandle[];
  invokeUrl(query?: string): string;
  addWorker(env?: Record<string, string>): Promise<ChildHandle>;
}

export interface ProcessPlaneOptions {
  inferenceUrl?: string;
  workers?: number;
  /** MAX_REQUEST_CONCURRENCY of each worker (and the deployment's). */
  concurrency?: number;
  /** JetStream ack wait, given to both the invocation service and the workers. */
  ackWaitSeconds?: number;
  invocationEnv?: Record<string, string>;
  workerEnv?: Record<string, string>;
}

/**
 * nats-server and the API (in this process), a deployed function, and as child processes: the
 * example inference server, one invocation replica (POD_IP=127.0.0.1, port 0) and worker agents.
 */
export async function startProcessPlane(t: Ctx, opts: ProcessPlaneOptions = {}): Promise<ProcessPlane> {
  const scope = reverseScope(t);
  const dir = tmpDir(scope, "callplane-e2e-");
  const nats = await startNats(scope);
  // the API creates the queue: its consumer's ack wait is the plane's
  const api = await startApi(scope, { nats, queue: { ackWaitSeconds: opts.ackWaitSeconds ?? 30 } });
  const concurrency = opts.concurrency ?? 4;
  const fn = await deployFunction(api, `e2e-${Math.random().toString(36).slice(2, 10)}`, {
    inferenceUrl: opts.inferenceUrl ?? "/echo",
    concurrency,
  });
  const inference = await startExampleProcess(scope);
  const ackWait = String(opts.ackWaitSeconds ?? 30);
  const invocation = await startService(scope, "invocation", scripts.invocation, {
    POD_IP: "127.0.0.1",
    CALLPLANE__GLOBAL__DATA_DIR: dir,
    CALLPLANE__GLOBAL__REGION: "test",
    CALLPLANE__LOG__LEVEL: "warn",
    ...nats.serviceEnv(),
    CALLPLANE__NATS__CONSUMER__ACK_WAIT_SECONDS: ackWait,
    CALLPLANE__API__URL: api.url,
    CALLPLANE__AUTH__SERVICE_TOKEN_DIR: api.serviceTokenDir,
    CALLPLANE__INVOCATION__PORT: "0",
    // workers here call the replica straight at its pod address; the proxy has its own tests
    CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "false",
    ...opts.invocationEnv,
  });
  const invocationUrl = invocation.urls.invocation;
  if (!invocationUrl)
    throw new Error(`the invocation service reported no URL: ${JSON.stringify(invocation.urls)}`);
  const workers: ChildHandle[] = [];
  const plane: ProcessPlane = {
    nats,
    api,
    fn,
    inference,
    invocation,
    invocationUrl,
    workers,
    invokeUrl: (query = "") => `${invocationUrl}/v2/nvcf/pexec/functions/${fn.functionId}${query}`,
    async addWorker(env = {}) {
      const i = workers.length;
      const w = await startService(
        scope,
        `worker-${i}`,
        scripts.worker,
        workerEnv(plane, join(dir, `responses-${i}`), {
          NVCF_REGION: "test",
          INSTANCE_ID: `e2e-${i}`,
          MAX_REQUEST_CONCURRENCY: String(concurrency),
          CALLPLANE_ACK_WAIT_SECONDS: ackWait,
          CALLPLANE_LOG_LEVEL: "warn",
          ...opts.workerEnv,
          ...env,
        }),
      );
      workers.push(w);
      return w;
    },
  };
  for (let i = 0; i < (opts.workers ?? 1); i++) await plane.addWorker();
  return plane;
}
