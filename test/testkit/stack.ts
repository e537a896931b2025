// The whole local stack as a user runs it (`node dist/src/stack/main.js --config <yaml>`), for
// end-to-end tests: an environment file with the test's own addresses and data folder and nothing
// else (every other key takes its default), the run stopped when the test ends with every process
// it left behind killed by pid, and what a process of it was given (its environment, from /proc).
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync, readdirSync, readlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { distRoot } from "./paths.js";
import { freePort } from "./plane.js";
import { running } from "./proc.js";

type Ctx = Pick<TestContext, "after">;

export const stackMain = join(distRoot, "src", "stack", "main.js");

/** What the stack writes into <dataDir>/stack.json once it is ready (the fields tests read). */
export interface StackJson {
  api: string;
  issuer: string;
  issuerCredentialFile: string;
  nats: string;
  compute: string;
  invocation: string[];
  grpc: string[];
  proxy?: string;
  workerDomain?: string;
  ca?: string;
  workerAuth: string;
  dataDir: string;
  logs: string;
  pid: number;
  demo: {
    apiKey: string;
    httpFunctionId: string;
    httpFunctionVersionId: string;
    httpFunctionName: string;
    sseFunctionId: string;
    sseFunctionVersionId: string;
    slowFunctionId: string;
    grpcFunctionId: string;
  };
}

export interface StackAddresses {
  /** The services' loopback address (127.0.x.1). */
  host: string;
  /** invocation.podNetwork: a loopback /24 or smaller of its own. */
  podNetwork: string;
  /** grpcproxy.podNetwork */
  grpcNetwork: string;
  /** compute.instanceNetwork */
  instanceNetwork: string;
}

/** The ports writeStackConfig picked for the services on `host`. */
export interface StackPorts {
  nats: number;
  api: number;
  issuer: number;
  compute: number;
  proxy: number;
}

/** What a caller other than the tests (the stack benchmark) may change in the environment file. */
export interface StackConfigOptions {
  /**
   * Leave the compute sync at its default (2 s) rather than the tests' 0.5 s, so that the stack
   * idles as a user's `npm start` does.
   */
  userDefaults?: boolean;
  /** More top-level sections, as YAML lines (none of the sections written here). */
  extraYaml?: string[];
}

/**
 * Writes an environment file that sets only where things are (addresses, the data folder) and a
 * short compute sync, so every other key, nats.workerAuth included, is the stack's default.
 * Returns its path, the data folder and the ports it chose.
 */
export async function writeStackConfig(
  dir: string,
  a: StackAddresses,
  o: StackConfigOptions = {},
): Promise<{ file: string; dataDir: string; ports: StackPorts }> {
  const port = () => freePort(a.host);
  const [nats, api, issuer, compute, proxy, proxyMetrics] = [
    await port(),
    await port(),
    await port(),
    await port(),
    await port(),
    await port(),
  ];
  const file = join(dir, "callplane.yaml");
  writeFileSync(
    file,
    [
      "global:",
      `  dataDir: ${join(dir, "data")}`,
      "nats:",
      `  url: tls://${a.host}:${nats}`,
      "  server:",
      `    listen: ${a.host}:${nats}`,
      "api:",
      `  listen: ${a.host}:${api}`,
      "adminIssuerProxy:",
      `  listen: ${a.host}:${issuer}`,
      "invocation:",
      `  podNetwork: ${a.podNetwork}`,
      "  shutdownGraceSeconds: 10",
      "grpcproxy:",
      `  podNetwork: ${a.grpcNetwork}`,
      "  shutdownGraceSeconds: 5",
      "workerCallbackProxy:",
      `  listen: ${a.host}:${proxy}`,
      `  metricsListen: ${a.host}:${proxyMetrics}`,
      `  podNetworks: [${a.podNetwork}, ${a.grpcNetwork}]`,
      "compute:",
      `  listen: ${a.host}:${compute}`,
      `  instanceNetwork: ${a.instanceNetwork}`,
      ...(o.userDefaults ? [] : ["  syncIntervalSeconds: 0.5"]),
      "  stopGraceSeconds: 5",
      ...(o.extraYaml ?? []),
      "",
    ].join("\n"),
  );
  return { file, dataDir: join(dir, "data"), ports: { nats, api, issuer, compute, proxy } };
}

/** A process's environment, as the kernel holds it (/proc/<pid>/environ). */
export function environOf(pid: number): Record<string, string> {
  const env: Record<string, string> = {};
  for (const kv of readFileSync(`/proc/${pid}/environ`, "utf8").split("\0")) {
    const eq = kv.indexOf("=");
    if (eq > 0) env[kv.slice(0, eq)] = kv.slice(eq + 1);
  }
  return env;
}

/**
 * Every live process that belongs to a stack run from `dir`: its working folder is `dir` (the
 * stack's children and the compute agent's instances inherit it) or its command line or
 * environment mentions `dir` (nats-server's config, the services' data folder).
 */
export function stackProcesses(dir: string): Array<{ pid: number; cmdline: string }> {
  const out: Array<{ pid: number; cmdline: string }> = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    try {
      const cmdline = readFileSync(`/proc/${name}/cmdline`, "utf8").replaceAll("\0", " ");
      const cwd = readlinkSync(`/proc/${name}/cwd`);
      const environ = readFileSync(`/proc/${name}/environ`, "utf8");
      if (
        (cwd === dir || cwd.startsWith(`${dir}/`) || cmdline.includes(dir) || environ.includes(dir)) &&
        running(Number(name))
      )
        out.push({ pid: Number(name), cmdline: cmdline.trim() });
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return out;
}

export interface StackRun {
  child: ChildProcess;
  output(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * Runs the stack from `cwd` with the test runner's environment minus its CALLPLANE settings.
 * Whatever happens in the test, it is stopped afterwards, and any process it left behind (found by
 * `stackProcesses(cwd)`) is killed by its pid.
 */
export function runStack(
  t: Ctx,
  cwd: string,
  configFile: string,
  /** Variables set over the inherited ones. */
  extraEnv: Record<string, string> = {},
): StackRun {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env))
    if (!k.startsWith("CALLPLANE__") && k !== "CALLPLANE_CONFIG") env[k] = v;
  // the tests do not need the path warmed for speed (and each stack start would take seconds more)
  env.CALLPLANE_STACK_WARMUP ??= "0";
  Object.assign(env, extraEnv);
  const child = spawn(process.execPath, [stackMain, "--config", configFile], {
    cwd,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.on("data", (d: Buffer) => (output += d.toString()));
  child.stderr.on("data", (d: Buffer) => (output += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) =>
    child.once("exit", (code, signal) => r({ code, signal })),
  );
  t.after(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      await Promise.race([exited, sleep(20_000)]);
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    }
    for (const p of stackProcesses(cwd)) {
      try {
        process.kill(p.pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
  });
  return { child, output: () => output, exited };
}

/** Waits for stack.json; fails with the stack's output if the stack exits first or takes over 90 s. */
export async function waitStackReady(run: StackRun, dataDir: string): Promise<StackJson> {
  const file = join(dataDir, "stack.json");
  const deadline = Date.now() + 90_000;
  while (!existsSync(file)) {
    if (run.child.exitCode !== null || run.child.signalCode !== null)
      throw new Error(`the stack exited before it was ready:\n${run.output()}`);
    if (Date.now() > deadline) throw new Error(`the stack was not ready within 90 s:\n${run.output()}`);
    await sleep(100);
  }
  return JSON.parse(readFileSync(file, "utf8")) as StackJson;
}
