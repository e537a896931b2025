// Network namespaces for tests that need two networks: a namespace joined to the root namespace by
// one veth pair, with addresses from 198.18.0.0/15 (RFC 2544, set aside for network tests). From
// inside, the only addresses reachable are the namespace's own and the host end of the link, so a
// process started in it (`ip netns exec`) reaches exactly what the test binds to that host address.
// Creating namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN); netnsSupport() says why not.
//
// Everything is named after this process (cpw-<pid>-<random>), and removed when the test ends, even
// when it fails midway: the processes still inside are killed, then the namespace is deleted, which
// takes the veth pair with it. Namespaces left by a test process that no longer exists (killed
// before its cleanup ran) are removed when the next one is created.
import { execFile, execFileSync } from "node:child_process";
import { randomBytes, randomInt } from "node:crypto";
import type { TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

type Ctx = Pick<TestContext, "after">;

const PREFIX = "cpw-";

export interface ExecResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(cmd: string, args: string[], timeoutMs = 15_000): Promise<ExecResult> {
  return new Promise((resolve) => {
    execFile(cmd, args, { timeout: timeoutMs, encoding: "utf8" }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === "number" ? err.code : null) : 0;
      resolve({ code, stdout, stderr: stderr || (err && code === null ? err.message : "") });
    });
  });
}

async function ip(...args: string[]): Promise<string> {
  const r = await run("ip", args);
  if (r.code !== 0) throw new Error(`ip ${args.join(" ")} failed (${r.code}): ${r.stderr.trim()}`);
  return r.stdout;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

function namespaces(): string[] {
  try {
    return execFileSync("ip", ["netns", "list"], { encoding: "utf8" })
      .split("\n")
      .map((l) => l.trim().split(/\s+/)[0])
      .filter((n): n is string => !!n);
  } catch {
    return [];
  }
}

/** Why this process cannot create network namespaces, or undefined when it can. */
export function netnsSupport(): string | undefined {
  if (process.platform !== "linux") return `network namespaces are Linux only (this is ${process.platform})`;
  if (process.getuid?.() !== 0)
    return `creating network namespaces needs root; this test runs as uid ${process.getuid?.()} (CI runs it as root)`;
  const probe = `${PREFIX}${process.pid}-probe-${randomBytes(3).toString("hex")}`;
  try {
    execFileSync("ip", ["netns", "add", probe], { stdio: ["ignore", "ignore", "pipe"] });
  } catch (err) {
    const e = err as NodeJS.ErrnoException & { stderr?: Buffer };
    const why =
      e.code === "ENOENT" ? "the ip command (iproute2) is not installed" : String(e.stderr ?? e.message);
    return `cannot create a network namespace: ${why.trim()}`;
  }
  try {
    execFileSync("ip", ["netns", "del", probe], { stdio: "ignore" });
  } catch {
    // it was created, so it can be deleted; a leftover is removed by the next createNetns
  }
  return undefined;
}

export interface Netns {
  name: string;
  /** The veth end in the root namespace, and its address (what the namespace can reach). */
  hostIf: string;
  hostIp: string;
  /** The veth end inside the namespace, and its address. */
  nsIf: string;
  nsIp: string;
  /** The link's network, `a.b.c.d/30`. */
  network: string;
  /** A command prefix that runs its argument inside the namespace (execs it: same pid, same fds). */
  prefix: string[];
  /** Runs a command inside the namespace to completion. */
  exec(args: string[], timeoutMs?: number): Promise<ExecResult>;
  /** Pids of the processes inside the namespace. */
  pids(): Promise<number[]>;
  /** Kills what runs inside, deletes the namespace (and with it the veth pair). Never throws. */
  destroy(): Promise<void>;
}

/** The addresses the host holds now, to keep a new link's network clear of them. */
async function hostIpv4s(): Promise<string[]> {
  const out = await ip("-o", "-4", "addr", "show");
  return [...out.matchAll(/inet (\d+\.\d+\.\d+\.\d+)\//g)].map((m) => m[1]);
}

function ipOf(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join(".");
}

function intOf(ip: string): number {
  return ip.split(".").reduce((acc, o) => acc * 256 + Number(o), 0);
}

/** A random /30 inside 198.18.0.0/15 that no address of the host falls into. */
async function pickNetwork(): Promise<{ hostIp: string; nsIp: string; network: string }> {
  const base = intOf("198.18.0.0");
  const taken = new Set((await hostIpv4s()).map((a) => intOf(a) - (intOf(a) % 4)));
  for (let attempt = 0; attempt < 100; attempt++) {
    const net = base + randomInt(0, 2 ** 17 / 4) * 4;
    if (!taken.has(net)) return { hostIp: ipOf(net + 1), nsIp: ipOf(net + 2), network: `${ipOf(net)}/30` };
  }
  throw new Error("no free /30 in 198.18.0.0/15 after 100 tries");
}

/** Removes namespaces this helper created in test processes that no longer exist. */
async function removeOrphans(): Promise<void> {
  for (const name of namespaces()) {
    const m = new RegExp(`^${PREFIX}(\\d+)-`).exec(name);
    if (!m || Number(m[1]) === process.pid || processAlive(Number(m[1]))) continue;
    await destroyNamespace(name);
  }
}

async function namespacePids(name: string): Promise<number[]> {
  const r = await run("ip", ["netns", "pids", name]);
  if (r.code !== 0) return [];
  return r.stdout
    .split(/\s+/)
    .filter(Boolean)
    .map(Number)
    .filter((n) => Number.isInteger(n) && n > 0);
}

async function destroyNamespace(name: string): Promise<void> {
  // a namespace with processes in it outlives its name: kill them (all were started by the test
  // that made the namespace), then delete it
  for (let round = 0; round < 50; round++) {
    const pids = await namespacePids(name);
    if (pids.length === 0) break;
    for (const pid of pids) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    await sleep(100);
  }
  await run("ip", ["netns", "del", name]);
}

/**
 * Creates a namespace with `lo` up and one veth pair to the root namespace, addressed from a random
 * /30 in 198.18.0.0/15: `.1` on the host end, `.2` inside. Removed when the test ends.
 */
export async function createNetns(t: Ctx): Promise<Netns> {
  await removeOrphans();
  const tag = randomBytes(3).toString("hex");
  const name = `${PREFIX}${process.pid}-${tag}`;
  // interface names are at most 15 characters
  const hostIf = `cpw${tag}h`;
  const nsIf = `cpw${tag}n`;
  const { hostIp, nsIp, network } = await pickNetwork();
  const ns: Netns = {
    name,
    hostIf,
    hostIp,
    nsIf,
    nsIp,
    network,
    prefix: ["ip", "netns", "exec", name],
    exec: (args, timeoutMs) => run("ip", ["netns", "exec", name, ...args], timeoutMs),
    pids: () => namespacePids(name),
    async destroy() {
      await destroyNamespace(name);
      // normally gone with the namespace; a host end left over by a half-done setup is removed here
      await run("ip", ["link", "del", hostIf]);
    },
  };
  t.after(() => ns.destroy());
  await ip("netns", "add", name);
  await ip("link", "add", hostIf, "type", "veth", "peer", "name", nsIf);
  await ip("link", "set", nsIf, "netns", name);
  await ip("addr", "add", `${hostIp}/30`, "dev", hostIf);
  await ip("link", "set", hostIf, "up");
  await ip("-n", name, "addr", "add", `${nsIp}/30`, "dev", nsIf);
  await ip("-n", name, "link", "set", nsIf, "up");
  await ip("-n", name, "link", "set", "lo", "up");
  return ns;
}

export interface ConnectResult {
  ok: boolean;
  /** The error code when the connection failed (ECONNREFUSED, ENETUNREACH, TIMEOUT, ...). */
  code?: string;
}

const CONNECT_PROBE = `
const [host, port, ms] = process.argv.slice(1);
const s = require("node:net").connect(Number(port), host);
const done = (r) => { console.log(JSON.stringify(r)); s.destroy(); process.exit(0); };
s.setTimeout(Number(ms), () => done({ ok: false, code: "TIMEOUT" }));
s.once("connect", () => done({ ok: true }));
s.once("error", (e) => done({ ok: false, code: e.code || e.message }));
`;

/** Opens (and closes) a TCP connection to host:port from inside the namespace. */
export async function tcpConnectFrom(
  ns: Netns,
  host: string,
  port: number,
  timeoutMs = 2000,
): Promise<ConnectResult> {
  const r = await ns.exec(
    [process.execPath, "-e", CONNECT_PROBE, host, String(port), String(timeoutMs)],
    timeoutMs + 10_000,
  );
  try {
    return JSON.parse(r.stdout.trim()) as ConnectResult;
  } catch {
    return { ok: false, code: `probe failed (${r.code}): ${r.stderr.trim()}` };
  }
}
