// The worker callback proxy: HAProxy, configured from callplane's settings (haproxy-config.ts) and
// kept by this process. This shell writes HAProxy's files (configuration, frontend PEM, pod CA)
// into a private folder, starts HAProxy, hands its access-log lines on, replaces certificates
// through the runtime API (no reload, no connection dropped), and drains and stops it.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { connect as netConnect, createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { writeFileAtomic } from "../../lib/fs.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import type { HostPort } from "../../lib/net/index.js";
import { formatHostPort } from "../../lib/net/index.js";
import type { TlsMaterial } from "../../lib/tls/index.js";
import { podTlsServers } from "./haproxy-backends.js";
import { haproxyConfig, READY_SERVER } from "./haproxy-config.js";
import type { HaproxyConfigOptions } from "./haproxy-options.js";
import { haproxyErrorFiles } from "./haproxy-parser-errors.js";
import {
  checkHaproxyConfig,
  haproxyBinary,
  HaproxyRuntime,
  startHaproxy,
  type HaproxyProcess,
} from "./haproxy.js";

export interface CallbackProxyOptions extends Omit<HaproxyConfigOptions, "files"> {
  /** Frontend certificate (with its chain) and key, for *.<workerDomain>. */
  frontend: { cert: string; key: string };
  /** CA bundle that pod certificates must chain to. */
  podCa: string;
  /** The HAProxy binary (default: haproxyBinary()). */
  binary?: string;
  logger?: Logger;
  /** Each access-log line, as HAProxy writes it (one JSON object); default: standard output. */
  onAccessLog?: (line: string) => void;
}

/** How long the stop waits past the grace for HAProxy to end before killing it. */
const KILL_AFTER_MS = 5000;

export function frontendPem(cert: string, key: string): string {
  return `${cert.trim()}\n${key.trim()}\n`;
}

function waitListening(addr: HostPort, proc: HaproxyProcess, messages: string[]): Promise<void> {
  const deadline = Date.now() + 15_000;
  return new Promise((resolve, reject) => {
    let exited = false;
    void proc.exited.then((why) => {
      exited = true;
      reject(new Error(`HAProxy ended at start (${why}): ${messages.slice(-5).join(" | ")}`));
    });
    const attempt = () => {
      if (exited) return;
      const s = netConnect(addr.port, addr.host);
      s.once("connect", () => {
        s.destroy();
        resolve();
      });
      s.once("error", () => {
        s.destroy();
        if (Date.now() > deadline)
          reject(new Error(`HAProxy did not listen on ${formatHostPort(addr)} within 15 s`));
        else setTimeout(attempt, 50);
      });
    };
    attempt();
  });
}

/**
 * A concrete port for an address that asks for any (port 0): HAProxy binds the port its
 * configuration names and cannot report one it picked, so one free now is chosen for it.
 */
function concretePort(addr: HostPort): Promise<HostPort> {
  if (addr.port !== 0) return Promise.resolve(addr);
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, addr.host, () => {
      const port = (s.address() as AddressInfo).port;
      s.close(() => resolve({ ...addr, port }));
    });
  });
}

/** The callback proxy, once the ports it listens on are known. */
export async function createCallbackProxy(opts: CallbackProxyOptions) {
  return callbackProxy({
    ...opts,
    listen: await concretePort(opts.listen),
    metricsListen: await concretePort(opts.metricsListen),
  });
}

function callbackProxy(opts: CallbackProxyOptions) {
  const logger = opts.logger ?? silentLogger();
  const binary = opts.binary ?? haproxyBinary();
  const dir = mkdtempSync(join(tmpdir(), "callplane-haproxy-"));
  const files = {
    frontendPem: join(dir, "frontend.pem"),
    podCa: join(dir, "pod-ca.crt"),
    adminSocket: join(dir, "admin.sock"),
    errorDir: join(dir, "errors"),
  };
  mkdirSync(files.errorDir);
  const configFile = join(dir, "haproxy.cfg");
  writeFileAtomic(files.frontendPem, frontendPem(opts.frontend.cert, opts.frontend.key), 0o600);
  writeFileAtomic(files.podCa, opts.podCa, 0o644);
  for (const [path, text] of Object.entries(haproxyErrorFiles({ ...opts, files })))
    writeFileAtomic(path, text, 0o644);
  writeFileAtomic(configFile, haproxyConfig({ ...opts, files }), 0o644);
  const problem = checkHaproxyConfig(binary, configFile);
  if (problem) {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`the callback proxy's HAProxy configuration (${configFile}) is refused: ${problem}`);
  }

  let proc: HaproxyProcess | undefined;
  let draining = false;
  const messages: string[] = [];
  const onAccessLog = opts.onAccessLog;
  const runtime = new HaproxyRuntime(files.adminSocket, logger);
  return {
    /** The folder of HAProxy's files (configuration, certificates, admin socket). */
    dir,
    configFile,
    adminSocket: files.adminSocket,
    get pid(): number | undefined {
      return proc?.child.pid;
    },
    async listen(): Promise<{ proxy: URL; metrics: URL }> {
      proc = startHaproxy({
        binary,
        configFile,
        // HAProxy's own notices share its log stream (a reload's "Proxy ... stopped"): only the
        // JSON lines are callbacks. Without a hook the lines go straight to standard output.
        onLog: onAccessLog
          ? (line) => (line.startsWith("{") ? onAccessLog(line) : logger.info({ haproxy: line }, "haproxy"))
          : undefined,
        onMessage: (line) => {
          messages.push(line);
          if (messages.length > 50) messages.shift();
          if (/ALERT|WARNING/.test(line)) logger.warn({ haproxy: line }, "haproxy");
          else logger.debug({ haproxy: line }, "haproxy");
        },
      });
      void proc.exited.then((why) => {
        if (!draining) logger.error({ why, messages: messages.slice(-5) }, "haproxy ended unexpectedly");
      });
      await waitListening(opts.listen, proc, messages);
      await waitListening(opts.metricsListen, proc, messages);
      const proxy = new URL(`https://${formatHostPort(opts.listen)}`);
      const metrics = new URL(`http://${formatHostPort(opts.metricsListen)}`);
      logger.info(
        {
          url: proxy.origin,
          metrics: metrics.origin,
          haproxy: binary,
          pid: proc.child.pid,
          config: configFile,
          podNetworks: opts.podNetworks,
          upstreamTls: opts.upstreamTls,
          grpcPodPort: opts.grpcPodPort,
        },
        "callback proxy listening",
      );
      return { proxy, metrics };
    },
    /** New frontend certificate: new TLS sessions use it, live ones keep theirs. */
    setFrontend(m: TlsMaterial): Promise<void> {
      const pem = frontendPem(m.cert!, m.key!);
      writeFileAtomic(files.frontendPem, pem, 0o600);
      return runtime.replaceCertificate(files.frontendPem, pem);
    },
    /** New CA bundle for pod certificates: new connections to pods verify against it. */
    setPodCa(ca: string): Promise<void> {
      // on disk for a restart; HAProxy gets it through its runtime API
      writeFileAtomic(files.podCa, ca, 0o644);
      return runtime.replaceCa(files.podCa, ca, podTlsServers(opts));
    },
    /** Whether a stop has begun (/health then answers 503). */
    get draining(): boolean {
      return draining;
    },
    /**
     * Drains as balancers expect: /health fails at once; callbacks are still taken for
     * `drainDelayMs`; then HAProxy stops listening and lets callbacks and tunnels in flight finish
     * within `graceMs` (hard-stop-after), closing idle connections.
     */
    async close(graceMs = opts.shutdownGraceMs, drainDelayMs = 0): Promise<void> {
      draining = true;
      const p = proc;
      if (!p || p.child.exitCode !== null) return this.removeFiles();
      await runtime
        .withdrawReadiness(READY_SERVER)
        .catch((err: unknown) => logger.warn({ err }, "callback proxy readiness not withdrawn"));
      if (drainDelayMs > 0) await new Promise((r) => setTimeout(r, drainDelayMs));
      p.child.kill("SIGUSR1");
      const killer = setTimeout(() => p.child.kill("SIGKILL"), graceMs + KILL_AFTER_MS);
      await p.exited;
      clearTimeout(killer);
      this.removeFiles();
    },
    destroy(): void {
      draining = true;
      proc?.child.kill("SIGTERM");
      this.removeFiles();
    },
    removeFiles(): void {
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export type CallbackProxy = ReturnType<typeof callbackProxy>;
