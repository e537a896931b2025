// The whole stack on one machine: nats-server, the control-plane API, the admin issuer, and (as
// later parts land) invocation replicas, the compute agent and the demo. Each service runs as its
// own process on its own loopback address, logs to <data>/logs/<service>.log, and is supervised:
// restarted with backoff if it dies, stopped (drain, then kill) with the stack.
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { ensureAdminKeyPair, ensureOperatorCredential, ensureServiceTokens } from "../lib/identity/index.js";
import { removeTreeSync, writeFileAtomic } from "../lib/fs.js";
import { ensureCa, ensureServerCert, stackCertificates, TlsReloader } from "../lib/tls/index.js";
import { ensureKeyringFile, instancesRoot, secretsRoot } from "../lib/secrets/index.js";
import type { Config } from "../lib/config/index.js";
import { createLogger, silentLogger } from "../lib/log.js";
import { createRegistry } from "../lib/metrics.js";
import {
  connectNats,
  drainOrClose,
  ensureNatsKeys,
  ensureRouteCredentials,
  KEY_FILES,
  natsAccess,
  natsCertNames,
  type NatsNode,
  natsNodes,
  natsRouteCertNames,
  natsServerBinary,
  reloadNatsServer,
  waitForNats,
  waitForNatsCluster,
  writeNatsServerConfig,
} from "../lib/nats/index.js";
import type { HostPort } from "../lib/net/index.js";
import { ChildStartError, SupervisedChild, type ChildSpec } from "../lib/process/index.js";
import { checkListen, descendantPids, processAlive, processCommandLine } from "./preflight.js";

const distSrc = resolve(fileURLToPath(import.meta.url), "..", "..");

export interface StackOptions {
  config: Config;
  configFile: string | undefined;
  say: (line: string) => void;
}

export class StackError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StackError";
  }
}

interface PidFile {
  pid: number;
  /** `service` names the child as the stack's output and logs do (invocation-1, compute, ...). */
  children: Array<{ pid: number; service?: string; cmdline: string }>;
}

export interface StackInfo {
  api: string;
  /** The operator console: the API's /console/ pages (log in with an admin token). */
  console: string;
  issuer?: string;
  nats: string;
  invocation: string[];
  grpc: string[];
  proxy?: string;
  dataDir: string;
  logs: string;
  startedAt: string;
  pid: number;
  demo?: Record<string, unknown>;
  [k: string]: unknown;
}

export class LocalStack {
  readonly children: SupervisedChild[] = [];
  readonly dataDir: string;
  readonly logDir: string;
  private readonly pidFile: string;
  readonly stackFile: string;
  private stopping = false;

  constructor(readonly opts: StackOptions) {
    this.dataDir = opts.config.global.dataDir;
    this.logDir = join(this.dataDir, "logs");
    this.pidFile = join(this.dataDir, "stack.pid");
    this.stackFile = join(this.dataDir, "stack.json");
  }

  /** Refuses to start over a running stack; cleans up what a stack killed without stopping left behind. */
  claim(): void {
    // the data folder holds the keys, the MEK, the database and the service tokens: no other user
    // (function instances run as one) may even list it, whatever the modes of the files in it
    mkdirSync(this.dataDir, { recursive: true, mode: 0o700 });
    chmodSync(this.dataDir, 0o700);
    if (existsSync(this.pidFile)) {
      let prev: PidFile | undefined;
      try {
        prev = JSON.parse(readFileSync(this.pidFile, "utf8")) as PidFile;
      } catch {
        prev = undefined;
      }
      if (
        prev &&
        prev.pid !== process.pid &&
        processAlive(prev.pid) &&
        processCommandLine(prev.pid)?.includes("stack/main.js")
      ) {
        throw new StackError(
          `a callplane stack is already running from ${this.dataDir} (pid ${prev.pid}); stop it with Ctrl-C in its terminal or \`kill ${prev.pid}\``,
        );
      }
      let cleaned = 0;
      for (const c of prev?.children ?? []) {
        if (processAlive(c.pid) && processCommandLine(c.pid) === c.cmdline) {
          try {
            process.kill(c.pid, "SIGKILL");
            cleaned++;
          } catch {
            // already gone
          }
        }
      }
      if (cleaned)
        this.opts.say(`cleaned up ${cleaned} process(es) left by a stack that did not stop cleanly`);
    }
    rmSync(this.stackFile, { force: true });
    this.writePidFile();
  }

  private writePidFile(): void {
    const children = this.children.flatMap((c) =>
      c.pid ? [{ pid: c.pid, service: c.spec.name, cmdline: processCommandLine(c.pid) ?? "" }] : [],
    );
    writeFileAtomic(this.pidFile, JSON.stringify({ pid: process.pid, children } satisfies PidFile));
  }

  async preflight(addresses: Array<[string, HostPort]>): Promise<void> {
    for (const [name, addr] of addresses) {
      const problem = await checkListen(name, addr);
      if (problem) throw new StackError(problem);
    }
  }

  prepareSecrets(): void {
    const { config } = this.opts;
    let keys: ReturnType<typeof ensureAdminKeyPair>;
    try {
      keys = ensureAdminKeyPair(config.auth.adminSigningKeyFile, config.auth.adminPublicKeyFile);
    } catch (err) {
      throw new StackError((err as Error).message);
    }
    if (keys.created) this.opts.say(`generated the admin signing key in ${config.auth.adminSigningKeyFile}`);
    if (keys.derivedPublicKey)
      this.opts.say(`wrote the admin public key from the signing key to ${config.auth.adminPublicKeyFile}`);
    this.prepareIssuerKeys();
    ensureServiceTokens(config.auth.serviceTokenDir);
    for (const f of ensureNatsKeys(config.nats.credentialsDir))
      this.opts.say(`generated the NATS key ${f.slice(config.nats.credentialsDir.length + 1)}`);
    if (config.secrets.mek.provider === "file") {
      let mek: ReturnType<typeof ensureKeyringFile>;
      try {
        mek = ensureKeyringFile(config.secrets.mek.file);
      } catch (err) {
        throw new StackError(
          `cannot create the MEK keyring ${config.secrets.mek.file}: ${(err as Error).message}`,
        );
      }
      if (mek.created)
        this.opts.say(
          `generated the master encryption key (MEK ${mek.kid}) in ${config.secrets.mek.file} (mode 0600; back it up with the database)`,
        );
    }
  }

  /**
   * The admin issuer's own key pair, apart from the stack's admin key: created while the issuer is
   * enabled. Turned off, the pair the stack generated is deleted, so that no token the issuer ever
   * signed can be accepted again, even if the issuer is turned back on (it then gets a new pair).
   */
  private prepareIssuerKeys(): void {
    const { config } = this.opts;
    const ai = config.adminIssuerProxy;
    const ours =
      ai.signingKeyFile === join(this.dataDir, "keys", "admin-issuer.key.pem") &&
      ai.publicKeyFile === join(this.dataDir, "keys", "admin-issuer.pub.pem");
    if (!ai.enabled) {
      if (ours && (existsSync(ai.signingKeyFile) || existsSync(ai.publicKeyFile))) {
        rmSync(ai.signingKeyFile, { force: true });
        rmSync(ai.publicKeyFile, { force: true });
        this.opts.say(
          "the admin issuer is off (adminIssuerProxy.enabled: false): deleted its key pair, so the tokens it issued are refused for good",
        );
      }
      return;
    }
    let keys: ReturnType<typeof ensureAdminKeyPair>;
    try {
      keys = ensureAdminKeyPair(ai.signingKeyFile, ai.publicKeyFile);
    } catch (err) {
      throw new StackError(
        (err as Error).message
          .replaceAll("auth.adminPublicKeyFile", "adminIssuerProxy.publicKeyFile")
          .replaceAll("auth.adminSigningKeyFile", "adminIssuerProxy.signingKeyFile"),
      );
    }
    if (keys.created) this.opts.say(`generated the admin issuer's own signing key in ${ai.signingKeyFile}`);
    let credential: ReturnType<typeof ensureOperatorCredential>;
    try {
      credential = ensureOperatorCredential(ai.operatorCredentialFile);
    } catch (err) {
      throw new StackError(
        `cannot create the admin issuer's operator credential ${ai.operatorCredentialFile} (adminIssuerProxy.operatorCredentialFile): ${(err as Error).message}`,
      );
    }
    if (credential.created)
      this.opts.say(
        `generated the operator credential the admin issuer asks for in ${ai.operatorCredentialFile} (mode 0600; \`callplane init\` reads it)`,
      );
    if (credential.tightened)
      this.opts.say(`made ${ai.operatorCredentialFile} readable by this account only (mode 0600)`);
  }

  /** Creates the stack CA if missing and issues (or renews) the certificates worker callbacks need. */
  async preparePki(replicaIps: string[], grpcReplicaIps: string[] = []): Promise<void> {
    const { config } = this.opts;
    const p = config.workerCallbackProxy;
    const ca = await ensureCa({
      dir: config.pki.dir,
      caCertFile: config.pki.caCertFile,
      caKeyFile: config.pki.caKeyFile,
    }).catch((err: unknown) => {
      throw new StackError((err as Error).message);
    });
    if (ca.created) this.opts.say(`generated the stack CA in ${config.pki.caCertFile}`);
    const certs = stackCertificates({
      pkiDir: config.pki.dir,
      serviceDomain: config.global.serviceDomain,
      workerDomain: p.workerDomain,
      proxyEnabled: p.enabled,
      upstreamTls: p.invocation.upstreamTls.enabled,
      frontendCertFile: p.tls.frontend.certFile,
      replicaIps,
      natsNames: config.nats.server.enabled ? natsCertNames(config.nats) : [],
      natsCertFile: config.nats.tls.certFile,
      natsRouteNames: config.nats.server.enabled ? natsRouteCertNames(config.nats) : [],
      natsRouteCertFile: config.nats.cluster.tls.certFile,
      grpcReplicaIps,
    });
    for (const c of certs) {
      if (
        (await ensureServerCert(c.folder, ca, c.dnsNames, { clientAuth: c.clientAuth ?? false })) === "issued"
      )
        this.opts.say(`issued the ${c.name} certificate (${c.dnsNames.join(", ")})`);
    }
  }

  private childEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
    const env: NodeJS.ProcessEnv = { ...process.env, ...extra };
    if (this.opts.configFile) env.CALLPLANE_CONFIG = this.opts.configFile;
    // children resolve relative paths against the same folder as the stack
    env.CALLPLANE__GLOBAL__DATA_DIR = this.dataDir;
    return env;
  }

  private restartPolicy(): ChildSpec["restart"] {
    const b = this.opts.config.compute.restartBackoff;
    return { enabled: true, initialMs: b.initialSeconds * 1000, maxMs: b.maxSeconds * 1000 };
  }

  private track(child: SupervisedChild): SupervisedChild {
    this.children.push(child);
    child.on("exit", (info: { code: number | null; signal: string | null; expected: boolean }) => {
      if (!info.expected && !this.stopping)
        this.opts.say(
          `${child.spec.name} exited (${info.signal ?? `code ${info.code}`}); see ${child.spec.logFile}`,
        );
    });
    child.on("restart", ({ inMs }: { inMs: number }) => {
      if (!this.stopping) this.opts.say(`restarting ${child.spec.name} in ${Math.round(inMs / 100) / 10} s`);
    });
    child.on("ready", () => this.writePidFile());
    return child;
  }

  /**
   * Starts the stack's NATS: one nats-server on nats.server.listen, or a JetStream cluster of
   * nats.cluster.size nodes on their own loopback addresses (lib/nats/cluster.ts), each supervised (a
   * node that dies is restarted and rejoins through its routes). Resolves once every node answers
   * and, for a cluster, every node is healthy and they agree on a JetStream leader.
   */
  async startNats(): Promise<{ url: string; nodes: NatsNode[] }> {
    const { config } = this.opts;
    const nodes = natsNodes(config.nats);
    const cluster = nodes.length > 1;
    const security = {
      certFile: config.nats.tls.certFile,
      keyFile: config.nats.tls.keyFile,
      credentialsDir: config.nats.credentialsDir,
      region: config.global.region,
    };
    let route: ReturnType<typeof ensureRouteCredentials> | undefined;
    if (cluster) {
      route = ensureRouteCredentials(config.nats.credentialsDir);
      if (route.created)
        this.opts.say(
          `generated the NATS cluster's route password in ${KEY_FILES.routePassword(config.nats.credentialsDir)}`,
        );
    }
    const bin = natsServerBinary(config.nats.server.binary || undefined);
    const children: SupervisedChild[] = [];
    for (const node of nodes) {
      // one server keeps the folder it always had; a cluster's nodes each get their own
      const dir = cluster ? join(this.dataDir, "nats", `node-${node.index}`) : join(this.dataDir, "nats");
      const files = writeNatsServerConfig(dir, node.client, {
        name: node.name,
        security,
        ...(cluster
          ? {
              cluster: {
                name: config.nats.cluster.name,
                listen: node.route!,
                routes: nodes.map((n) => n.route!),
                certFile: config.nats.cluster.tls.certFile,
                keyFile: config.nats.cluster.tls.keyFile,
                caFile: config.nats.tls.caFile,
                user: route!.user,
                password: route!.password,
              },
            }
          : {}),
      });
      const name = cluster ? `nats-server-${node.index}` : "nats-server";
      children.push(
        this.track(
          new SupervisedChild({
            name,
            command: bin,
            args: ["-c", files.configFile],
            // One scheduler thread unless the environment says otherwise: on one machine nats-server
            // shares the cores with every service and worker, and with two threads it spent a
            // quarter more CPU per invocation (Go's scheduler spinning and handing work between
            // threads) for no gain in rate (bench/RESULTS.md, the stack rows).
            env: { ...process.env, GOMAXPROCS: process.env.GOMAXPROCS ?? "1" },
            logFile: join(this.logDir, `${name}.log`),
            ipc: false,
            restart: this.restartPolicy(),
          }),
        ),
      );
    }
    // all at once: a cluster's nodes wait for each other's routes before JetStream is ready
    await Promise.all(children.map((c) => c.start()));
    await Promise.all(nodes.map((n) => waitForNats(n.client)));
    this.writePidFile();
    if (cluster) {
      const monitor = await connectNats(natsAccess(config, "nats-monitor"), "stack", silentLogger());
      try {
        await waitForNatsCluster(monitor, nodes.length, 120_000).catch((err: unknown) => {
          throw new StackError(
            `${(err as Error).message}; see ${children.map((c) => c.spec.logFile).join(", ")}`,
          );
        });
      } finally {
        await drainOrClose(monitor);
      }
    }
    // a renewed certificate reaches every node without a restart: each re-reads it on SIGHUP (the
    // route certificate applies to routes opened after the reload)
    const reloadAll = (what: string) => {
      for (const c of children) if (c.pid) reloadNatsServer(c.pid);
      this.opts.say(
        `nats-server: ${what} changed; told ${children.length === 1 ? "it" : `all ${children.length} nodes`} to reload`,
      );
    };
    const logger = createLogger("stack", { destination: join(this.logDir, "stack.log") });
    const registry = createRegistry("stack", { defaultMetrics: false });
    this.natsTls.push(
      new TlsReloader(
        "nats-server",
        { certFile: config.nats.tls.certFile, keyFile: config.nats.tls.keyFile },
        () => reloadAll("certificate"),
        logger,
        registry,
      ),
    );
    if (cluster)
      this.natsTls.push(
        new TlsReloader(
          "nats-server-routes",
          { certFile: config.nats.cluster.tls.certFile, keyFile: config.nats.cluster.tls.keyFile },
          () => reloadAll("route certificate"),
          logger,
          registry,
        ),
      );
    return { url: config.nats.url, nodes };
  }

  private readonly natsTls: TlsReloader[] = [];

  /** Starts one of callplane's own services (dist/src/services/<dir>/main.js) and waits for ready. */
  async startService(
    name: string,
    dir: string,
    env: NodeJS.ProcessEnv = {},
  ): Promise<Record<string, string>> {
    const child = this.track(
      new SupervisedChild({
        name,
        command: process.execPath,
        args: [join(distSrc, "services", dir, "main.js")],
        env: this.childEnv(env),
        logFile: join(this.logDir, `${name}.log`),
        ipc: true,
        readyTimeoutMs: 60_000,
        restart: this.restartPolicy(),
      }),
    );
    try {
      await child.start();
    } catch (err) {
      if (err instanceof ChildStartError) throw new StackError(err.message);
      throw err;
    }
    return child.readyInfo?.urls ?? {};
  }

  writeStackFile(info: StackInfo): void {
    writeFileAtomic(this.stackFile, `${JSON.stringify(info, null, 2)}\n`, 0o600);
  }

  async stop(graceMs: number): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    rmSync(this.stackFile, { force: true });
    for (const r of this.natsTls) r.close();
    // services first (they drain), nats-server last so that draining services can still use it
    const isNats = (c: SupervisedChild) => /^nats-server(-\d+)?$/.test(c.spec.name);
    const nats = this.children.filter(isNats);
    const rest = this.children.filter((c) => !isNats(c)).reverse();
    // everything stops at once: no balancer to notice, no replica to take over, so no drain delay
    await Promise.all(rest.map((c) => c.stop(graceMs, { drainDelay: false })));
    await Promise.all(nats.map((c) => c.stop(5000)));
    this.removeInstanceSecrets();
    rmSync(this.pidFile, { force: true });
  }

  /**
   * Function instances' secrets files (in memory, outside the data folder): the compute agent
   * removes each with its instance; when the stack is stopped at once, it cannot, so the stack does.
   */
  private removeInstanceSecrets(): void {
    try {
      const { config } = this.opts;
      removeTreeSync([secretsRoot(this.dataDir, config.compute.secrets.dir), instancesRoot(this.dataDir)]);
    } catch {
      // the next compute agent start removes what is left
    }
  }

  killAll(): void {
    // Fix: only the direct children used to be killed. The compute agent's inference servers have
    // no control channel to notice their supervisor die, so they outlived the stack and kept the
    // instance addresses busy (the next start's instances then crash-looped with EADDRINUSE while
    // their workers took the orphans' health for their own). The tree is read before anything is
    // killed, since a killed parent's children are reparented and can no longer be found.
    const below = this.children.flatMap((c) => (c.pid ? descendantPids(c.pid) : []));
    for (const c of this.children) c.killNow();
    for (const pid of below) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    this.removeInstanceSecrets();
  }
}
