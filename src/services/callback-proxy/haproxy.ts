// Running HAProxy for the callback proxy: finding the binary, starting it in master-worker mode as
// a child that dies with this process, reading its log lines, and its runtime API (certificate
// updates without a reload, the drain).
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { connect as netConnect } from "node:net";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { checkoutRoot } from "../../lib/paths.js";
import type { Logger } from "../../lib/log.js";

/** The HAProxy binary: CALLPLANE_HAPROXY, the PATH, /usr/sbin, or the one the bootstrap fetched. */
export function haproxyBinary(configured?: string): string {
  // .tools/ in the checkout is where scripts/ensure-haproxy.sh puts the one it fetches
  const local = join(checkoutRoot, ".tools", "haproxy", "haproxy");
  const candidates = [
    configured,
    process.env.CALLPLANE_HAPROXY,
    "haproxy",
    "/usr/sbin/haproxy",
    local,
  ].filter((x): x is string => !!x);
  for (const bin of candidates) {
    const r = spawnSync(bin, ["-v"], { encoding: "utf8" });
    if (r.status !== 0 || r.error) continue;
    const m = /version (\d+)\.(\d+)/.exec(r.stdout);
    if (m && (Number(m[1]) > 2 || (Number(m[1]) === 2 && Number(m[2]) >= 6))) return bin;
  }
  throw new Error(
    "no HAProxy 2.6 or newer found for the callback proxy: run `npm start` or `npm test` (they fetch Debian's package into .tools/haproxy/), install Debian's haproxy package, or set CALLPLANE_HAPROXY",
  );
}

// The kernel ends HAProxy's master when this process dies however it dies (setpriv's
// PR_SET_PDEATHSIG); the master's workers follow their master. Without it, a supervisor killed
// with SIGKILL would leave an HAProxy holding the worker port.
const SETPRIV = ["/usr/bin/setpriv", "/bin/setpriv"].find((p) => existsSync(p));

export interface HaproxyProcess {
  child: ChildProcess;
  /** Resolves with HAProxy's exit code (or signal) once the master has ended. */
  exited: Promise<string>;
}

/**
 * Starts `haproxy -W -db -f <config>`. Each line HAProxy logs on standard output (the access log)
 * goes to `onLog`, or, without it, straight to this process's standard output: HAProxy writes the
 * lines itself, and the keeper does not read and write again each callback's line (a third of
 * its CPU under load). Its own messages (standard error) go to `onMessage`.
 */
export function startHaproxy(opts: {
  binary: string;
  configFile: string;
  onLog?: ((line: string) => void) | undefined;
  onMessage: (line: string) => void;
}): HaproxyProcess {
  const args = ["-W", "-db", "-f", opts.configFile];
  const stdio: ["ignore", "pipe" | "inherit", "pipe"] = ["ignore", opts.onLog ? "pipe" : "inherit", "pipe"];
  const child = SETPRIV
    ? spawn(SETPRIV, ["--pdeathsig", "SIGTERM", "--", opts.binary, ...args], { stdio })
    : spawn(opts.binary, args, { stdio });
  if (opts.onLog && child.stdout) createInterface({ input: child.stdout }).on("line", opts.onLog);
  createInterface({ input: child.stderr! }).on("line", opts.onMessage);
  const exited = new Promise<string>((resolve) =>
    child.once("exit", (code, signal) => resolve(signal ?? `exit code ${code}`)),
  );
  return { child, exited };
}

/** Checks a configuration with `haproxy -c`; the messages of a failed check, or undefined. */
export function checkHaproxyConfig(binary: string, configFile: string): string | undefined {
  const r = spawnSync(binary, ["-c", "-f", configFile], { encoding: "utf8" });
  if (r.status === 0) return undefined;
  return (r.stderr || r.stdout || r.error?.message || `exit ${r.status}`).trim();
}

/**
 * HAProxy's runtime API as the callback proxy uses it: certificates and CA bundles replaced in
 * place (new TLS sessions use them, live ones keep theirs; nothing is reloaded or dropped), and
 * readiness withdrawn for a drain. Updates run one at a time, so two never interleave.
 */
export class HaproxyRuntime {
  private queue: Promise<unknown> = Promise.resolve();

  constructor(
    readonly socketPath: string,
    private readonly logger: Logger,
  ) {}

  /** Replaces the certificate HAProxy loaded from `file` (`pem`: certificate, chain and key). */
  replaceCertificate(file: string, pem: string): Promise<void> {
    return this.update(`certificate ${file}`, "cert", file, pem);
  }

  /** Replaces the CA bundle HAProxy loaded from `file`. */
  replaceCa(file: string, pem: string): Promise<void> {
    return this.update(`CA bundle ${file}`, "ca-file", file, pem);
  }

  /** Disables the server that stands for readiness: /health answers 503 from now on. */
  async withdrawReadiness(server: string): Promise<void> {
    const out = await haproxyCommand(this.socketPath, `disable server ${server}`);
    if (out) throw new Error(`disable server ${server}: ${out}`);
  }

  private update(what: string, kind: "cert" | "ca-file", file: string, pem: string): Promise<void> {
    const run = async () => {
      const set = await haproxyCommand(this.socketPath, `set ssl ${kind} ${file}`, pem);
      if (!/transaction (created|updated)/i.test(set)) throw new Error(`${what}: ${set}`);
      const commit = await haproxyCommand(this.socketPath, `commit ssl ${kind} ${file}`);
      if (!/success/i.test(commit)) throw new Error(`${what}: ${commit}`);
      this.logger.info({ what }, "callback proxy certificate replaced");
    };
    const next = this.queue.then(run);
    // the caller hears of a failure (its reloader logs and counts it); the queue goes on
    this.queue = next.catch(() => undefined);
    return next;
  }
}

/**
 * One command on HAProxy's runtime API (its admin socket); its answer. `payload` is sent after the
 * command as a multi-line argument (`<<`), as certificate updates take their PEM.
 */
export function haproxyCommand(socketPath: string, command: string, payload?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = netConnect(socketPath);
    let out = "";
    s.setEncoding("utf8");
    s.setTimeout(10_000, () => s.destroy(new Error(`HAProxy's runtime API did not answer: ${command}`)));
    s.on("data", (d: string) => (out += d));
    s.on("error", reject);
    s.on("close", () => resolve(out.trim()));
    s.end(payload === undefined ? `${command}\n` : `${command} <<\n${payload.trim()}\n\n`);
  });
}
