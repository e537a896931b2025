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
import type { PodTlsServer } from "./haproxy-backends.js";

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

  /**
   * Makes `pem` the CA bundle the pods' certificates are verified against (first loaded from
   * `file`). HAProxy 2.6's `commit ssl ca-file` reaches bind lines but not server lines: after it, a
   * pod certificate from the new CA still fails verification on a new connection. So the bundle
   * goes into HAProxy's store under a new name (`<file>.<n>`), each TLS server to pods gets a
   * successor that verifies against it (`add server <backend>/<name>-<n>`, its settings otherwise
   * the same) and is enabled, and the servers before it are put in maintenance: requests from now
   * on go to the successor, on new connections verified against the new bundle; connections in
   * use finish on the old ones, which are deleted once nothing uses them. Nothing is reloaded or
   * dropped. The generation is read from HAProxy, so a keeper that restarted goes on from it.
   */
  replaceCa(file: string, pem: string, servers: readonly PodTlsServer[]): Promise<void> {
    const run = async () => {
      // the servers in use now (retired ones in maintenance are already on their way out) and the
      // highest generation HAProxy has, retired or not
      const current = new Map<PodTlsServer, string[]>();
      let n = 0;
      for (const s of servers) {
        const found = await this.serversOf(s.backend, s.name);
        current.set(
          s,
          found.filter((x) => !x.maintenance).map((x) => x.name),
        );
        for (const x of found) n = Math.max(n, generation(s.name, x.name));
      }
      n++;
      const bundleOf = (s: PodTlsServer, server: string) => {
        const g = generation(s.name, server);
        return g === 0 ? file : `${file}.${g}`;
      };
      const caFile = `${file}.${n}`;
      // (one left by a rotation that failed after this step is reused)
      await this.expect(`new ssl ca-file ${caFile}`, /created|already exists/i);
      await this.expect(`set ssl ca-file ${caFile}`, /transaction (created|updated)/i, pem);
      await this.expect(`commit ssl ca-file ${caFile}`, /success/i);
      // each bundle being retired, and how many retired servers verify against it
      const retired = new Map<string, { servers: number }>();
      for (const [s, names] of current)
        for (const old of names) {
          const r = retired.get(bundleOf(s, old)) ?? { servers: 0 };
          r.servers++;
          retired.set(bundleOf(s, old), r);
        }
      for (const s of servers) {
        const next = `${s.backend}/${s.name}-${n}`;
        await this.expect(`add server ${next} ${s.settings(caFile)}`, /registered/i);
        await this.expect(`enable server ${next}`, /^$/);
        for (const old of current.get(s)!) {
          await this.expect(`disable server ${s.backend}/${old}`, /^$/);
          this.deleteWhenUnused(`${s.backend}/${old}`, bundleOf(s, old), retired.get(bundleOf(s, old))!);
        }
      }
      this.logger.info({ what: `CA bundle ${file}`, as: caFile }, "callback proxy CA bundle replaced");
    };
    return this.serialize(run);
  }

  /** Runs `run` after every update before it (two never interleave); the caller hears of its failure. */
  private serialize(run: () => Promise<void>): Promise<void> {
    const next = this.queue.then(run);
    // the caller hears of a failure (its reloader logs and counts it); the queue goes on
    this.queue = next.catch(() => undefined);
    return next;
  }

  /** The servers of `backend` that are `name` or one of its successors, and which are retired. */
  private async serversOf(
    backend: string,
    name: string,
  ): Promise<Array<{ name: string; maintenance: boolean }>> {
    const out = await haproxyCommand(this.socketPath, `show servers state ${backend}`);
    // a version line, a header (# be_id be_name srv_id srv_name srv_addr srv_op_state
    // srv_admin_state ...), then one line per server; admin state bit 1: maintenance
    return out
      .split("\n")
      .filter((l) => l && !l.startsWith("#") && l.includes(" "))
      .map((l) => l.split(" "))
      .map((f) => ({ name: f[3] ?? "", maintenance: (Number(f[6]) & 1) === 1 }))
      .filter((x) => generation(name, x.name) >= 0);
  }

  /**
   * Deletes a server in maintenance once no connection uses it (tried every 5 s, for an hour), and
   * the CA bundle it verified against once no retired server does (`uses`: how many still do).
   */
  private deleteWhenUnused(server: string, caFile: string, uses: { servers: number }, tries = 720): void {
    const timer = setTimeout(() => {
      haproxyCommand(this.socketPath, `del server ${server}`).then(
        async (out) => {
          if (!/deleted/i.test(out)) {
            // still in use (or gone already: nothing more to do)
            if (tries > 1 && !/no such|not found/i.test(out))
              this.deleteWhenUnused(server, caFile, uses, tries - 1);
            return;
          }
          this.logger.debug({ server }, "callback proxy: retired server deleted");
          if (--uses.servers === 0) await haproxyCommand(this.socketPath, `del ssl ca-file ${caFile}`);
        },
        () => undefined,
      );
    }, 5000);
    timer.unref();
  }

  /** Runs a runtime API command; fails with HAProxy's answer unless it matches `ok`. */
  private async expect(command: string, ok: RegExp, payload?: string): Promise<void> {
    const out = await haproxyCommand(this.socketPath, command, payload);
    if (!ok.test(out)) throw new Error(`HAProxy refused \`${command}\`: ${out || "(no answer)"}`);
  }

  /** Disables the server that stands for readiness: /health answers 503 from now on. */
  async withdrawReadiness(server: string): Promise<void> {
    const out = await haproxyCommand(this.socketPath, `disable server ${server}`);
    if (out) throw new Error(`disable server ${server}: ${out}`);
  }

  private update(what: string, kind: "cert", file: string, pem: string): Promise<void> {
    const run = async () => {
      const set = await haproxyCommand(this.socketPath, `set ssl ${kind} ${file}`, pem);
      if (!/transaction (created|updated)/i.test(set)) throw new Error(`${what}: ${set}`);
      const commit = await haproxyCommand(this.socketPath, `commit ssl ${kind} ${file}`);
      if (!/success/i.test(commit)) throw new Error(`${what}: ${commit}`);
      this.logger.info({ what }, "callback proxy certificate replaced");
    };
    return this.serialize(run);
  }
}

/** `name`'s generation in `server`: 0 for `name` itself, n for `name-n`, -1 for another server. */
function generation(name: string, server: string): number {
  if (server === name) return 0;
  const m = new RegExp(`^${name}-(\\d+)$`).exec(server);
  return m ? Number(m[1]) : -1;
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
