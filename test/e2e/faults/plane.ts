// The plane the fault suite breaks: real processes on real networks, as an operator runs them.
//
//   clients (Python: http.client, grpcio) ──▶ HAProxy ──▶ 3 invocation replicas (127.0.61.i)
//                                        └──▶ HAProxy ──▶ 2 grpc-proxy replicas (127.0.62.i)
//   workers, in their own network namespace ──▶ HAProxy (TCP, on the link) ──▶ 2 callback proxies
//                                          └──▶ nats-server (TLS, every login checked)
//
// The balancer health-checks every replica's /health (500 ms, down after 2 failures), as a
// Kubernetes Service or a cloud balancer would; replicas drain for `drainDelaySeconds` before they
// refuse work. The workers and the example inference servers run inside the namespace and can
// reach only NATS and the balancer in front of the callback proxies. Every piece can be stopped,
// killed and started again on the same address.
import { haproxyBinary } from "../../../src/services/callback-proxy/haproxy.js";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, renameSync, writeFileSync } from "node:fs";
import { connect as netConnect } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { TLS_FILES, ensureServerCert } from "../../../src/lib/tls/index.js";
import { GRPC_FUNCTION } from "../../testkit/grpc.js";
import { freePortOnAll } from "../../testkit/hosts.js";
import { type ApiFixture, type Nats } from "../../testkit/index.js";
import type { Netns } from "../../testkit/netns.js";
import { deployFunction, type DeployedFunction } from "../../testkit/plane.js";
import { Scope, scripts, startService, type ChildHandle } from "../../testkit/processes.js";
import { WORKER_DOMAIN, startTwoNetworkPlane } from "../../testkit/two-networks.js";

export const REGION = "faults";
export { SERVICE_DOMAIN, WORKER_DOMAIN } from "../../testkit/two-networks.js";
const REPLICA_IPS = ["127.0.61.1", "127.0.61.2", "127.0.61.3"];
const GRPC_IPS = ["127.0.62.1", "127.0.62.2"];

/** A service the plane can stop and start again with the same settings, on the same address. */
export interface Restartable {
  readonly name: string;
  readonly handle: ChildHandle;
  /** SIGTERM: the service drains, then exits. Resolves once it has. */
  stop(): Promise<void>;
  kill(): Promise<void>;
  start(): Promise<void>;
  /** The tail of what every run of it wrote (stdout and stderr), oldest first. */
  output(): string;
}

export interface FaultPlane {
  dir: string;
  ns: Netns;
  nats: Nats;
  api: ApiFixture;
  fn: DeployedFunction;
  grpcFn: DeployedFunction;
  /** What clients call: the balancer in front of the invocation replicas, and of grpc-proxy. */
  httpUrl: string;
  invokeUrl(query?: string): string;
  grpcTarget: string;
  replicas: Restartable[];
  grpcProxies: Restartable[];
  proxies: Restartable[];
  httpWorkers: Restartable[];
  grpcWorkers: Restartable[];
  inference: ChildHandle;
  /** The balancer's view: server name → UP, DOWN, MAINT, ... */
  balancerStates(): Promise<Record<string, string>>;
  /** Resolves once the balancer sees the server (replica, grpc or proxy name) up. */
  waitBalanced(name: string, timeoutMs?: number): Promise<void>;
  /** Cuts the link between the workers' namespace and the rest, or restores it. */
  link(up: boolean): Promise<void>;
  /** Issues new frontend certificates for the callback proxies (same CA), written in place. */
  rotateFrontend(): Promise<void>;
  /** Rewrites the pod CA bundle the proxies verify pods against (the same CA), so they reload it. */
  rotateCaBundle(): Promise<void>;
  pkiDir: string;
  /** Writes every service's recent output to `<dir>/<name>.log` (evidence for a failed case). */
  saveOutputs(dir: string): void;
  /** One callback proxy's own TLS port (not the balancer's), for clients that misbehave. */
  proxyAddress: { host: string; port: number };
  workerDomain: string;
  /** How long workers wait on a stalled inference body (CALLPLANE_INFERENCE_IDLE_SECONDS). */
  inferenceIdleSeconds: number;
  close(): Promise<void>;
}

export interface FaultPlaneOptions {
  drainDelaySeconds?: number;
  ackWaitSeconds?: number;
  workerConcurrency?: number;
  /** How long a worker waits on a stalled inference body before it cuts the answer. */
  inferenceIdleSeconds?: number;
}

/** A free TCP port on one host. */
const freePort = (host: string) => freePortOnAll([host]);

/** Reads HAProxy's `show stat` over its admin socket: backend/server → status. */
function haproxyStates(socket: string): Promise<Record<string, string>> {
  return new Promise((resolve, reject) => {
    const s = netConnect(socket);
    let out = "";
    s.on("data", (d: Buffer) => (out += d.toString()));
    s.once("error", reject);
    s.once("connect", () => s.write("show stat\n"));
    s.once("end", () => {
      const states: Record<string, string> = {};
      for (const line of out.split("\n")) {
        const f = line.split(",");
        if (f.length > 17 && f[1] !== "FRONTEND" && f[1] !== "BACKEND" && !line.startsWith("#"))
          states[f[1]] = f[17];
      }
      resolve(states);
    });
  });
}

export async function startFaultPlane(o: FaultPlaneOptions = {}): Promise<FaultPlane> {
  const scope = new Scope();
  try {
    return await build(scope, o);
  } catch (err) {
    // every cleanup runs; the error that stopped the start is the one to report
    await scope.close().catch(() => undefined);
    throw err;
  }
}

async function build(scope: Scope, o: FaultPlaneOptions): Promise<FaultPlane> {
  const drain = String(o.drainDelaySeconds ?? 2);
  const ackWait = o.ackWaitSeconds ?? 5;
  const concurrency = o.workerConcurrency ?? 32;
  const plane = await startTwoNetworkPlane(scope, {
    prefix: "callplane-faults-",
    region: REGION,
    replicaIps: REPLICA_IPS,
    grpcReplicaIps: GRPC_IPS,
    upstreamTls: true,
    api: { queue: { ackWaitSeconds: ackWait } },
  });
  const { dir, ns, nats, api, pkiDir, ca, certs } = plane;
  const fn = await deployFunction(api, `faults-${randomBytes(3).toString("hex")}`, {
    inferenceUrl: "/echo",
    concurrency,
  });
  const grpcFn = await deployFunction(api, `faults-grpc-${randomBytes(3).toString("hex")}`, {
    ...GRPC_FUNCTION,
    concurrency,
  });

  const invPort = await freePortOnAll(REPLICA_IPS);
  const grpcPort = await freePortOnAll(GRPC_IPS);
  const grpcConnectPort = await freePortOnAll(GRPC_IPS);
  const proxyPorts = [await freePort(ns.hostIp), await freePort(ns.hostIp)];
  const proxyAdminPorts = [await freePort("127.0.0.1"), await freePort("127.0.0.1")];
  const lbHttp = await freePort("127.0.0.1");
  const lbGrpc = await freePort("127.0.0.1");
  // what replicas hand to workers: the balancer in front of the proxies, on the link
  const lbProxy = plane.proxyPort;

  const serviceEnv: Record<string, string> = {
    ...plane.serviceEnv,
    CALLPLANE__LOG__LEVEL: "warn",
    CALLPLANE__NATS__CONSUMER__ACK_WAIT_SECONDS: String(ackWait),
    CALLPLANE__INVOCATION__PORT: String(invPort),
    CALLPLANE__INVOCATION__DRAIN_DELAY_SECONDS: drain,
    // a client's inline body must arrive within the default poll window: 20 s, not 60, so the
    // slow-body case sees its connections closed sooner
    CALLPLANE__INVOCATION__POLL__DEFAULT_SECONDS: "20",
    CALLPLANE__GRPCPROXY__PORT: String(grpcPort),
    CALLPLANE__GRPCPROXY__CONNECT_PORT: String(grpcConnectPort),
    CALLPLANE__GRPCPROXY__DRAIN_DELAY_SECONDS: drain,
    CALLPLANE__WORKER_CALLBACK_PROXY__DRAIN_DELAY_SECONDS: drain,
    // a proxy that stops waits this long for live tunnels to end: the workers keep their gRPC
    // tunnels open between calls, so a stop always waited the whole grace (30 s by default, twice
    // per run); 5 s is ample for the HTTP callbacks the proxy case counts
    CALLPLANE__WORKER_CALLBACK_PROXY__SHUTDOWN_GRACE_SECONDS: "5",
  };
  const logs = join(dir, "logs");
  mkdirSync(logs, { recursive: true });

  const restartable = (
    name: string,
    script: string,
    env: NodeJS.ProcessEnv,
    extra: { prefix?: string[] } = {},
  ): Promise<Restartable> => {
    const launch = () => startService(scope, name, script, env, { readyTimeoutMs: 60_000, ...extra });
    return launch().then((first) => {
      let handle = first;
      const past: ChildHandle[] = [];
      return {
        output: () =>
          [...past, handle].map((h, i) => `--- run ${i + 1} (pid ${h.pid})\n${h.output()}`).join("\n"),
        name,
        get handle() {
          return handle;
        },
        async stop() {
          await handle.stop(60_000);
        },
        async kill() {
          await handle.kill("SIGKILL");
        },
        async start() {
          past.push(handle);
          handle = await launch();
        },
      };
    });
  };

  const proxies: Restartable[] = [];
  for (let i = 0; i < 2; i++)
    proxies.push(
      await restartable(`proxy-${i + 1}`, scripts.callbackProxy, {
        ...serviceEnv,
        CALLPLANE__LOG__LEVEL: "info",
        CALLPLANE__WORKER_CALLBACK_PROXY__LISTEN: `${ns.hostIp}:${proxyPorts[i]}`,
        CALLPLANE__WORKER_CALLBACK_PROXY__METRICS_LISTEN: `127.0.0.1:${proxyAdminPorts[i]}`,
      }),
    );
  const replicas: Restartable[] = [];
  for (const [i, ip] of REPLICA_IPS.entries())
    replicas.push(
      await restartable(`invocation-${i + 1}`, scripts.invocation, { ...serviceEnv, POD_IP: ip }),
    );
  const grpcProxies: Restartable[] = [];
  for (const [i, ip] of GRPC_IPS.entries())
    grpcProxies.push(await restartable(`grpc-${i + 1}`, scripts.grpcProxy, { ...serviceEnv, POD_IP: ip }));

  // the balancer: HTTP in front of the invocation replicas, TCP in front of grpc-proxy and of the
  // callback proxies, each health-checked on /health
  const sock = join(dir, "haproxy.sock");
  const cfg = join(dir, "haproxy.cfg");
  writeFileSync(
    cfg,
    [
      "global",
      "  maxconn 4000",
      "  nbthread 1",
      `  stats socket ${sock} mode 600 level admin`,
      "defaults",
      "  timeout connect 2s",
      "  timeout client 300s",
      "  timeout server 300s",
      "  timeout tunnel 1h",
      "  default-server inter 500ms fall 2 rise 2",
      "frontend http_in",
      "  mode http",
      `  bind 127.0.0.1:${lbHttp}`,
      "  default_backend invocation",
      "backend invocation",
      "  mode http",
      "  balance roundrobin",
      "  option httpchk GET /health",
      "  http-check expect status 200",
      "  option redispatch",
      "  retries 3",
      ...REPLICA_IPS.map((ip, i) => `  server invocation-${i + 1} ${ip}:${invPort} check`),
      "frontend grpc_in",
      "  mode tcp",
      `  bind 127.0.0.1:${lbGrpc}`,
      "  default_backend grpc",
      "backend grpc",
      "  mode tcp",
      "  balance roundrobin",
      "  option httpchk GET /health",
      "  http-check expect status 200",
      "  option redispatch",
      "  retries 3",
      ...GRPC_IPS.map((ip, i) => `  server grpc-${i + 1} ${ip}:${grpcPort} check port ${grpcConnectPort}`),
      "frontend proxy_in",
      "  mode tcp",
      `  bind ${ns.hostIp}:${lbProxy}`,
      "  default_backend proxies",
      "backend proxies",
      "  mode tcp",
      "  balance roundrobin",
      "  option httpchk GET /health",
      "  http-check expect status 200",
      "  option redispatch",
      "  retries 3",
      ...proxyPorts.map(
        (p, i) => `  server proxy-${i + 1} ${ns.hostIp}:${p} check addr 127.0.0.1 port ${proxyAdminPorts[i]}`,
      ),
      "",
    ].join("\n"),
  );
  const bin = haproxyBinary();
  const checked = spawnSync(bin, ["-c", "-f", cfg], { encoding: "utf8" });
  if (checked.status !== 0) throw new Error(`haproxy -c: ${checked.stdout}${checked.stderr}`);
  const ha: ChildProcess = spawn(bin, ["-db", "-f", cfg], { stdio: ["ignore", "ignore", "pipe"] });
  let haErr = "";
  ha.stderr!.on("data", (d: Buffer) => (haErr = (haErr + d.toString()).slice(-8192)));
  scope.after(async () => {
    if (ha.exitCode !== null) return;
    const exited = new Promise((r) => ha.once("exit", r));
    ha.kill("SIGTERM");
    await exited;
  });
  const balancerStates = async () => {
    for (let i = 0; ; i++) {
      try {
        return await haproxyStates(sock);
      } catch (err) {
        if (i > 100 || ha.exitCode !== null)
          throw new Error(`HAProxy is not answering: ${String(err)} ${haErr}`);
        await sleep(50);
      }
    }
  };
  const waitBalanced = async (name: string, timeoutMs = 30_000) => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const s = (await balancerStates())[name];
      if (s === "UP") return;
      if (Date.now() > deadline) throw new Error(`the balancer does not see ${name} up (it is ${s})`);
      await sleep(100);
    }
  };
  for (const r of [...replicas, ...grpcProxies, ...proxies]) await waitBalanced(r.name);

  // the workers' namespace: the example servers and the worker agents
  const inference = await plane.startInference(8000);
  await plane.startInference(8001, true);
  const workerEnv = (fnOf: DeployedFunction, k: string, port: number, grpc: boolean): NodeJS.ProcessEnv =>
    plane.workerEnv({
      fn: fnOf,
      key: k,
      instanceId: `faults-${k}`,
      name: fnOf.functionId,
      port,
      grpc,
      concurrency,
      logLevel: "warn",
      extra: {
        CALLPLANE_ACK_WAIT_SECONDS: String(ackWait),
        CALLPLANE_SESSION_RECONNECT_WAIT_SECONDS: "1",
        CALLPLANE_INFERENCE_IDLE_SECONDS: String(o.inferenceIdleSeconds ?? 5),
      },
    });
  const httpWorkers: Restartable[] = [];
  for (let k = 0; k < 2; k++)
    httpWorkers.push(
      await restartable(`worker-${k}`, scripts.worker, workerEnv(fn, `http-${k}`, 8000, false), {
        prefix: ns.prefix,
      }),
    );
  const grpcWorkers: Restartable[] = [];
  for (let k = 0; k < 2; k++)
    grpcWorkers.push(
      await restartable(`grpc-worker-${k}`, scripts.worker, workerEnv(grpcFn, `grpc-${k}`, 8001, true), {
        prefix: ns.prefix,
      }),
    );

  const httpUrl = `http://127.0.0.1:${lbHttp}`;
  return {
    dir,
    ns,
    nats,
    api,
    fn,
    grpcFn,
    httpUrl,
    invokeUrl: (query = "") => `${httpUrl}/v2/nvcf/pexec/functions/${fn.functionId}${query}`,
    grpcTarget: `127.0.0.1:${lbGrpc}`,
    replicas,
    grpcProxies,
    proxies,
    httpWorkers,
    grpcWorkers,
    inference,
    balancerStates,
    waitBalanced,
    link(up) {
      // the namespace's end goes down: its packets stop, its connections stall (nothing resets
      // them), and the host's end keeps its address for the processes outside
      const r = spawnSync("ip", ["-n", ns.name, "link", "set", ns.nsIf, up ? "up" : "down"], {
        encoding: "utf8",
      });
      if (r.status !== 0) throw new Error(`ip link set ${ns.nsIf}: ${r.stderr}`);
      return Promise.resolve();
    },
    async rotateFrontend() {
      const front = certs.find((c) => c.name === "callback proxy frontend")!;
      await ensureServerCert(front.folder, ca, front.dnsNames, { force: true });
    },
    rotateCaBundle() {
      // the same CA, written anew: every proxy reloads it and builds fresh pod connections
      writeFileSync(join(pkiDir, `ca.crt.tmp`), `${ca.certPem.trim()}\n`);
      renameSync(join(pkiDir, "ca.crt.tmp"), join(pkiDir, TLS_FILES.ca));
      return Promise.resolve();
    },
    pkiDir,
    saveOutputs(to) {
      mkdirSync(to, { recursive: true });
      for (const r of [...replicas, ...grpcProxies, ...proxies, ...httpWorkers, ...grpcWorkers])
        writeFileSync(join(to, `${r.name}.log`), r.output());
    },
    proxyAddress: { host: ns.hostIp, port: proxyPorts[0] },
    workerDomain: WORKER_DOMAIN,
    inferenceIdleSeconds: o.inferenceIdleSeconds ?? 5,
    // every cleanup runs, whatever one of them throws
    close: () => scope.close().catch(() => undefined),
  };
}
