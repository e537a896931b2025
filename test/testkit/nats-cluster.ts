// A real three-node (or n-node) nats-server JetStream cluster for tests, configured as the stack
// configures one (src/lib/nats/server.ts): each node on its own loopback address, TLS on every
// client connection with one certificate from a test CA covering every node, routes over mutual TLS
// with a certificate that serves as client and server plus the route password from the credentials
// folder, every user in a named account, the auth callout in this process. Nodes can be killed and
// started again on the same addresses and store, as a supervisor restarts a crashed node.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { createUser } from "@nats-io/nkeys";
import { connect, nkeyAuthenticator, type NatsConnection } from "@nats-io/transport-node";
import { writeFileAtomic } from "../../src/lib/fs.js";
import { silentLogger } from "../../src/lib/log.js";
import {
  connectNats,
  ensureNatsKeys,
  ensureRouteCredentials,
  natsClusterHealth,
  type NatsClusterHealth,
  natsServerBinary,
  readWorkerSeed,
  serviceNatsAccess,
  waitForNats,
  waitForNatsCluster,
  writeNatsServerConfig,
} from "../../src/lib/nats/index.js";
import { TLS_FILES } from "../../src/lib/tls/index.js";
import type { NatsAuthCalloutOptions } from "../../src/services/nats-auth-callout/service.js";
import { startTestCallout, type Nats } from "./nats.js";
import { removeDir } from "./scope.js";
import { freePort } from "./plane.js";
import { testPki } from "./tls.js";

type Ctx = Pick<TestContext, "after">;

export interface ClusterNode {
  index: number;
  /** server_name */
  name: string;
  host: string;
  port: number;
  routePort: number;
  url: string;
  configFile: string;
  /** The node's current process (a new one after start()). */
  readonly process: ChildProcess;
  readonly running: boolean;
  /** What the node wrote to stderr since it last started. */
  log(): string;
  /** Sends a signal (SIGKILL by default) and resolves once the process has exited. */
  kill(signal?: NodeJS.Signals): Promise<void>;
  /** Starts the node again on the same addresses, configuration and JetStream store. */
  start(): Promise<void>;
}

export interface NatsCluster extends Nats {
  nodes: ClusterNode[];
  /** The cluster's health as the nats-monitor role reads it (every node's, through any node). */
  health(): Promise<NatsClusterHealth>;
  /** Resolves once every node is healthy, routed to the others, and they agree on a leader. */
  waitHealthy(timeoutMs?: number): Promise<NatsClusterHealth>;
  /** A connection of the api-revoker role (SYS), for tests of revocation across the cluster. */
  revoker(): Promise<NatsConnection>;
}

/** Loopback addresses no other test uses: 127.0.84.1 .. 127.0.84.n. */
export function clusterHosts(size = 3, net = 84): string[] {
  return Array.from({ length: size }, (_, i) => `127.0.${net}.${i + 1}`);
}

export async function startNatsCluster(
  t: Ctx,
  opts: { size?: number; hosts?: string[]; region?: string; name?: string } = {},
): Promise<NatsCluster> {
  const size = opts.size ?? opts.hosts?.length ?? 3;
  const hosts = opts.hosts ?? clusterHosts(size);
  const region = opts.region ?? "test";
  const dir = mkdtempSync(join(tmpdir(), "callplane-nats-cluster-"));
  const pki = await testPki();
  const tlsDir = join(dir, "tls");
  const routeDir = join(dir, "route-tls");
  const certFile = join(tlsDir, TLS_FILES.cert);
  const keyFile = join(tlsDir, TLS_FILES.key);
  const caFile = join(tlsDir, TLS_FILES.ca);
  // one client certificate for every node; one route certificate, client and server
  const cert = await pki.issue([...hosts, "localhost"]);
  const routeCert = await pki.issue(hosts, { clientAuth: true });
  writeFileAtomic(keyFile, cert.keyPem, 0o600);
  writeFileAtomic(certFile, cert.certPem, 0o644);
  writeFileAtomic(caFile, pki.ca.certPem, 0o644);
  writeFileAtomic(join(routeDir, TLS_FILES.key), routeCert.keyPem, 0o600);
  writeFileAtomic(join(routeDir, TLS_FILES.cert), routeCert.certPem, 0o644);
  const credentialsDir = join(dir, "creds");
  ensureNatsKeys(credentialsDir);
  const route = ensureRouteCredentials(credentialsDir);
  const observer = createUser();
  const observerSeed = new TextDecoder().decode(observer.getSeed());
  const addrs: Array<{ host: string; port: number; routePort: number }> = [];
  for (const host of hosts) addrs.push({ host, port: await freePort(host), routePort: await freePort(host) });
  const url = addrs.map((a) => `tls://${a.host}:${a.port}`).join(",");
  const writeConfig = (i: number) =>
    writeNatsServerConfig(
      join(dir, `node-${i + 1}`),
      { host: addrs[i].host, port: addrs[i].port },
      {
        name: `${opts.name ?? "test"}-${i + 1}`,
        security: {
          certFile,
          keyFile,
          credentialsDir,
          region,
          extraAppUsers: [{ nkey: observer.getPublicKey() }],
        },
        cluster: {
          name: opts.name ?? "test",
          listen: { host: addrs[i].host, port: addrs[i].routePort },
          routes: addrs.map((a) => ({ host: a.host, port: a.routePort })),
          certFile: join(routeDir, TLS_FILES.cert),
          keyFile: join(routeDir, TLS_FILES.key),
          caFile,
          user: route.user,
          password: route.password,
        },
      },
    );
  const bin = natsServerBinary();
  const nodes: ClusterNode[] = addrs.map((a, i) => {
    const files = writeConfig(i);
    let child: ChildProcess | undefined;
    let stderr = "";
    const running = () => !!child && child.exitCode === null && child.signalCode === null;
    const node: ClusterNode = {
      index: i + 1,
      name: `${opts.name ?? "test"}-${i + 1}`,
      host: a.host,
      port: a.port,
      routePort: a.routePort,
      url: `tls://${a.host}:${a.port}`,
      configFile: files.configFile,
      get process() {
        return child!;
      },
      get running() {
        return running();
      },
      log: () => stderr,
      async kill(signal = "SIGKILL") {
        if (!child || !running()) return;
        const exited = new Promise((r) => child!.once("exit", r));
        child.kill(signal);
        await exited;
      },
      async start() {
        if (running()) return;
        stderr = "";
        const c = spawn(bin, ["-c", files.configFile], { stdio: ["ignore", "ignore", "pipe"] });
        child = c;
        c.stderr.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-256 * 1024)));
        await waitForNats({ host: a.host, port: a.port }).catch((err: unknown) => {
          throw new Error(`${node.name}: ${(err as Error).message}\n${stderr}`);
        });
      },
    };
    return node;
  });
  let callout: Awaited<ReturnType<typeof startTestCallout>> | undefined;
  const sys: NatsConnection[] = [];
  const stop = async () => {
    await callout?.close().catch(() => undefined);
    callout = undefined;
    for (const nc of sys.splice(0)) await nc.close().catch(() => undefined);
    await Promise.all(
      nodes.map(async (n) => {
        if (!n.running) return;
        const k = setTimeout(() => n.process.kill("SIGKILL"), 3000);
        await n.kill("SIGTERM");
        clearTimeout(k);
      }),
    );
  };
  t.after(stop);
  // after the stop: the nodes write into their folders until they exit
  t.after(() => removeDir(dir));
  // all at once: JetStream waits for the routes to the other nodes
  await Promise.all(nodes.map((n) => n.start()));
  const access = (role: Parameters<Nats["access"]>[0]) =>
    serviceNatsAccess({ url, caFile, credentialsDir, role });
  const monitorConn = async () => {
    const nc = await connectNats(access("nats-monitor"), "test-monitor", silentLogger());
    sys.push(nc);
    return nc;
  };
  let monitor: NatsConnection | undefined;
  const health = async () => natsClusterHealth((monitor ??= await monitorConn()), size);
  const waitHealthy = async (timeoutMs = 60_000) =>
    waitForNatsCluster((monitor ??= await monitorConn()), size, timeoutMs);
  await waitHealthy();
  const replaceCallout = async (plugins: NatsAuthCalloutOptions["plugins"], logFile?: string) => {
    await callout?.close();
    callout = await startTestCallout({ url, caFile, credentialsDir, region }, plugins, logFile);
  };
  await replaceCallout({});
  return {
    url,
    servers: size,
    get host() {
      return nodes[0].host;
    },
    get port() {
      return nodes[0].port;
    },
    get process() {
      return nodes[0].process;
    },
    stop,
    pki,
    caFile,
    credentialsDir,
    certFile,
    keyFile,
    configFile: nodes[0].configFile,
    nodes,
    access,
    health,
    waitHealthy,
    async revoker() {
      const nc = await connectNats(access("api-revoker"), "test-revoker", silentLogger());
      sys.push(nc);
      return nc;
    },
    async observe(name = "test-observer") {
      const nc = await connect({
        servers: url.split(","),
        name,
        tls: { ca: pki.ca.certPem },
        authenticator: nkeyAuthenticator(new TextEncoder().encode(observerSeed)),
        maxReconnectAttempts: -1,
        reconnectTimeWait: 250,
      });
      t.after(() => nc.close().catch(() => undefined));
      return nc;
    },
    workerNkeyEnv: () => ({ NKEY_SEED: readWorkerSeed(credentialsDir), NVCF_NATS_CA_PEM: pki.ca.certPem }),
    reload() {
      for (const [i, n] of nodes.entries()) {
        writeConfig(i);
        if (n.running) n.process.kill("SIGHUP");
      }
    },
    replaceCallout,
    // the whole cluster at once, as one server's stopServer/startServer (a node alone: nodes[i])
    async stopServer(how = "term") {
      await Promise.all(nodes.map((n) => n.kill(how === "kill" ? "SIGKILL" : "SIGTERM")));
    },
    async startServer() {
      await Promise.all(nodes.map((n) => n.start()));
      await waitHealthy();
    },
    serviceEnv: () => ({
      CALLPLANE__NATS__URL: url,
      CALLPLANE__NATS__CREDENTIALS_DIR: credentialsDir,
      CALLPLANE__NATS__TLS__CA_FILE: caFile,
      // the services are told the cluster's size; the cluster is not the stack's own to run
      CALLPLANE__NATS__CLUSTER__SIZE: String(size),
      CALLPLANE__NATS__SERVER__ENABLED: "false",
    }),
  };
}
