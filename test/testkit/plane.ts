// A whole invocation plane for tests: nats-server, the API, a function deployed with an API key,
// invocation replicas and worker agents beside an example inference server, and optionally a worker
// callback proxy with a test PKI. Services run in this process on 127.0.0.1:0 unless a test asks
// for other loopback addresses (replicaHosts) or child processes.
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { createServer as createNetServer, type AddressInfo } from "node:net";
import { writeFileAtomic } from "../../src/lib/fs.js";
import { createLogger, type Logger } from "../../src/lib/log.js";
import { createRegistry, type Registry } from "../../src/lib/metrics.js";
import { startTracing } from "../../src/lib/tracing/index.js";
import { dashIp } from "../../src/lib/net/index.js";
import { TLS_FILES, TlsReloader } from "../../src/lib/tls/index.js";
import { DEFAULT_QUEUE_LIMITS, type QueueLimits } from "../../src/lib/nats/index.js";
import { createCallbackProxy, type CallbackProxy } from "../../src/services/callback-proxy/service.js";
import {
  createInvocationService,
  type InvocationService,
  type InvocationServiceOptions,
} from "../../src/services/invocation/service.js";
import { createWorkerAgent, type WorkerAgent } from "../../src/services/worker/agent.js";
import { workerConfigFromEnv } from "../../src/services/worker/config.js";
import { call } from "./client.js";
import { startNats, type Nats } from "./nats.js";
import { sampleDeployment } from "./samples.js";
import { startApi, type ApiFixture } from "./services.js";
import { startExampleServer } from "./inference.js";
import { testPki, type TestPki } from "./tls.js";
// moved to inference.ts; tests import it from here
export { startExampleServer } from "./inference.js";

type Ctx = Pick<TestContext, "after">;

/**
 * A scratch folder removed when the test ends, by a hook registered now: call it after starting
 * what writes there, so that (after-hooks run in the order they were added) the writer stops
 * first. tmpDir() registers its removal before startNats() and startApi() register their stops:
 * the folder went while nats-server still wrote consumer state into it (ENOTEMPTY), and a hook
 * that throws skips every hook after it, leaving nats-server and the services running and the
 * test file never exiting. Removal here never throws: a leftover temp folder is harmless.
 */
function scratchDir(prefix: string): { dir: string; removeAfter(t: Ctx): void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return {
    dir,
    removeAfter(t) {
      t.after(() => {
        try {
          rmSync(dir, { recursive: true, force: true, maxRetries: 5 });
        } catch {
          // see above
        }
      });
    },
  };
}

/** A port nothing listens on at `host` right now (for listeners that must share one port). */
export async function freePort(host: string): Promise<number> {
  const server = createNetServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, host, resolve);
  });
  const port = (server.address() as AddressInfo).port;
  await new Promise<void>((r) => server.close(() => r()));
  return port;
}

/** Reads a JSON-lines log file (a missing file is an empty log). */
export function readLog(file: string): Array<Record<string, unknown>> {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Record<string, unknown>);
}

export interface DeployedFunction {
  functionId: string;
  versionId: string;
  apiKey: string;
}

export async function deployFunction(
  api: ApiFixture,
  name: string,
  opts: {
    inferenceUrl?: string;
    functionType?: string;
    concurrency?: number;
    containerImage?: string;
    health?: Record<string, unknown>;
  } = {},
): Promise<DeployedFunction> {
  const admin = await api.adminToken();
  const created = await call<{ function: { id: string; versionId: string } }>(
    `${api.url}/v2/nvcf/functions`,
    {
      token: admin,
      body: {
        name,
        inferenceUrl: opts.inferenceUrl ?? "/echo",
        containerImage: opts.containerImage ?? "local/echo",
        health: opts.health ?? { uri: "/health" },
        ...(opts.functionType ? { functionType: opts.functionType } : {}),
      },
    },
  );
  if (created.status !== 200) throw new Error(`create function: ${created.text}`);
  const { id, versionId } = created.body.function;
  const dep = await call(`${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`, {
    token: admin,
    body: sampleDeployment(1, 1, opts.concurrency ?? 8),
  });
  if (dep.status !== 200) throw new Error(`deploy: ${dep.text}`);
  const key = await call<{ value: string }>(`${api.url}/v1/keys`, {
    token: admin,
    body: { description: "test" },
  });
  if (key.status !== 200) throw new Error(`key: ${key.text}`);
  return { functionId: id, versionId, apiKey: key.body.value };
}

export interface Plane {
  nats: Nats;
  api: ApiFixture;
  fn: DeployedFunction;
  /** The example inference server every worker of the plane calls (`server` lets a test stop it). */
  inference: { url: string; port: number; server: Server };
  replicas: Array<{
    service: InvocationService;
    url: string;
    /** The address the replica listens on (its pod address). */
    host: string;
    /** With the proxy: the folder of its worker-listener certificate (tls.crt, tls.key, ca.crt). */
    certDir: string | undefined;
  }>;
  workers: WorkerAgent[];
  /** With `proxy`: the callback proxy every worker's callbacks go through. */
  proxy: PlaneProxy | undefined;
  /** With `logs`: the JSON lines a part logged so far (`replica-0`, `worker-0`); else none. */
  logs(name: string): Array<Record<string, unknown>>;
  invokeUrl(replica?: number): string;
  /** Starts a worker for `fn` (the plane's function unless given), with its own output folder. */
  addWorker(overrides?: Record<string, string>, fn?: DeployedFunction): Promise<WorkerAgent>;
  /**
   * Deploys another function (its own inferenceUrl, its own API key) beside the plane's one and
   * starts `workers` workers for it (default 1) against the same example inference server.
   */
  addFunction(opts: { inferenceUrl: string; workers?: number }): Promise<{
    fn: DeployedFunction;
    invokeUrl(replica?: number): string;
  }>;
}

export interface PlaneProxy {
  proxy: CallbackProxy;
  registry: Registry;
  /** https://invocation.worker.callplane.test:<port>, as workers are told. */
  uri: string;
  host: string;
  port: number;
  pki: TestPki;
  /** The proxy's frontend certificate folder (tls.crt, tls.key), watched by a TlsReloader. */
  frontendDir: string;
  /** The CA bundle that pod certificates must chain to, watched by a TlsReloader. */
  caFile: string;
  /** The port of every replica's worker TLS listener. */
  podPort: number;
  /** HAProxy's Prometheus exporter (GET /metrics), on the proxy's admin listener. */
  metricsUrl: string;
  /** The proxy's access-log lines (one per callback). */
  accessLog(): Array<Record<string, unknown>>;
  /** Callbacks the proxy has logged, all or those of one outcome (forwarded, refused_path, ...). */
  callbacks(outcome?: string): number;
}

export interface PlaneOptions {
  replicas?: number;
  /**
   * The address replica i listens on (default 127.0.0.1). Distinct loopback addresses give the
   * replicas distinct pod addresses, as pods get their own IPs; the proxy needs them distinct.
   */
  replicaHosts?: string[];
  /** Options for replica i only, applied over `invocation`. */
  replica?: (i: number) => Partial<InvocationServiceOptions>;
  /** The callback target every replica hands workers (a shared, load-balanced address). */
  selfAddress?: string;
  relay?: InvocationServiceOptions["relay"];
  /**
   * Worker callbacks through a callback proxy started in this process with a test PKI: each
   * replica gets a TLS worker listener with a certificate for its pod name, workers get the proxy
   * address and the test CA.
   */
  proxy?: boolean | { host?: string; podPort?: number };
  /** Replicas, workers and the proxy log JSON lines to files that `plane.logs()` reads. */
  logs?: boolean;
  workers?: number;
  concurrency?: number;
  queue?: Partial<QueueLimits>;
  invocation?: Partial<InvocationServiceOptions>;
  workerEnv?: Record<string, string>;
  inferenceUrl?: string;
  /** Options for the API (worker auth mode, identity lifetime). */
  api?: Omit<NonNullable<Parameters<typeof startApi>[1]>, "dir" | "nats">;
  /** A NATS the test started (a cluster, say) instead of the plane's own single server. */
  nats?: Nats;
  /** The example inference server's handler, wrapped (a test that counts what reaches it). */
  inferenceHandler?: (req: IncomingMessage, res: ServerResponse) => void;
}

/**
 * Worker settings for tests of the callback path itself (the proxy, the relay, attach tokens):
 * every answer is posted to request-attach, as an NVCF worker does, none goes over NATS.
 */
export const POSTED_ANSWERS = { CALLPLANE_ANSWER_OVER_NATS: "false" } as const;

export function workerEnv(
  plane: { nats: Nats; fn: DeployedFunction; inference: { port: number } },
  responseDir: string,
  extra: Record<string, string> = {},
): NodeJS.ProcessEnv {
  return {
    NVCF_FQDN_NATS: plane.nats.url,
    ...plane.nats.workerNkeyEnv(),
    FUNCTION_ID: plane.fn.functionId,
    FUNCTION_VERSION_ID: plane.fn.versionId,
    FUNCTION_NAME: "test",
    INFERENCE_PORT: String(plane.inference.port),
    INFERENCE_HOST: "127.0.0.1",
    INFERENCE_HEALTH_ENDPOINT: "/health",
    HEALTH_HOST: "127.0.0.1",
    HEALTH_PORT: "0",
    MAX_REQUEST_CONCURRENCY: "8",
    BASE_RESPONSE_DIR: responseDir,
    CALLPLANE_LOG_LEVEL: "silent",
    ...extra,
  };
}

export async function startPlane(t: Ctx, opts: PlaneOptions = {}): Promise<Plane> {
  let nats = opts.nats;
  if (!nats) {
    const natsDir = scratchDir("callplane-nats-");
    nats = await startNats(t, { dir: natsDir.dir });
    natsDir.removeAfter(t);
  }
  const apiDir = scratchDir("callplane-api-");
  // the API creates the queues, with the plane's limits
  const api = await startApi(t, {
    dir: apiDir.dir,
    nats,
    ...(opts.queue ? { queue: opts.queue } : {}),
    ...opts.api,
  });
  apiDir.removeAfter(t);
  const fn = await deployFunction(api, `fn-${Math.random().toString(36).slice(2, 10)}`, {
    inferenceUrl: opts.inferenceUrl ?? "/echo",
  });
  const inference = await startExampleServer(t, "127.0.0.1", opts.inferenceHandler);
  // workers started later write here until their own hooks stop them; removal tolerates that
  const responses = scratchDir("callplane-responses-");
  responses.removeAfter(t);
  const responseDir = responses.dir;
  const queue = { ...DEFAULT_QUEUE_LIMITS, ...opts.queue };
  const logDir = opts.logs ? scratchDir("callplane-logs-") : undefined;
  const logFile = (name: string) => join(logDir!.dir, `${name}.log`);
  const fileLogger = (name: string, mixin?: (o: object) => object): Logger | undefined =>
    logDir
      ? createLogger(name, {
          destination: logFile(name),
          sync: true,
          level: "info",
          ...(mixin ? { mixin } : {}),
        })
      : undefined;
  const replicaCount = opts.replicas ?? 1;
  const hosts = Array.from({ length: replicaCount }, (_, i) => opts.replicaHosts?.[i] ?? "127.0.0.1");
  const proxy = opts.proxy
    ? await startPlaneProxy(t, opts.proxy === true ? {} : opts.proxy, hosts)
    : undefined;
  const replicas: Plane["replicas"] = [];
  for (let i = 0; i < replicaCount; i++) {
    const host = hosts[i];
    const logger = fileLogger(`replica-${i}`);
    let certDir: string | undefined;
    let tlsOpts: Partial<InvocationServiceOptions> = {};
    if (proxy) {
      certDir = join(proxy.pkiDir, "invocation", dashIp(host));
      const cert = await proxy.pki.issue([`${dashIp(host)}.invocation.nvcf.svc.cluster.local`]);
      writeFileAtomic(join(certDir, TLS_FILES.key), cert.keyPem);
      writeFileAtomic(join(certDir, TLS_FILES.cert), cert.certPem, 0o644);
      writeFileAtomic(join(certDir, TLS_FILES.ca), proxy.pki.ca.certPem, 0o644);
      tlsOpts = {
        workerTls: {
          port: proxy.podPort,
          certFile: join(certDir, TLS_FILES.cert),
          keyFile: join(certDir, TLS_FILES.key),
        },
        proxyUri: proxy.uri,
      };
    }
    const service = createInvocationService({
      listen: { host, port: 0 },
      region: "test",
      serviceDomain: "nvcf.svc.cluster.local",
      nats: nats.access("invocation"),
      apiUrl: api.url,
      serviceToken: api.serviceToken("invocation"),
      queue,
      ...(opts.selfAddress ? { selfAddress: opts.selfAddress } : {}),
      ...(opts.relay ? { relay: opts.relay } : {}),
      ...(logger ? { logger } : {}),
      ...tlsOpts,
      ...opts.invocation,
      ...opts.replica?.(i),
    });
    const url = (await service.listen()).origin;
    t.after(() => service.destroy());
    replicas.push({ service, url, host, certDir });
  }
  // after the services that write (and watch) there
  logDir?.removeAfter(t);
  proxy?.removeAfter(t);
  const proxyWorkerEnv: Record<string, string> = proxy
    ? {
        CALLPLANE_WORKER_HOST_MAP: `invocation.worker.callplane.test=${proxy.host}`,
        NVCF_PROXY_CA_PEM: proxy.pki.ca.certPem,
      }
    : {};
  const workers: WorkerAgent[] = [];
  let workerCount = 0;
  const plane: Plane = {
    nats,
    api,
    fn,
    inference,
    replicas,
    workers,
    proxy: proxy?.plane,
    logs: (name) => (logDir ? readLog(logFile(name)) : []),
    invokeUrl: (r = 0) => `${replicas[r].url}/v2/nvcf/pexec/functions/${fn.functionId}`,
    async addWorker(overrides = {}, target = fn) {
      // Each worker gets its own output folders: two workers sharing slot-N folders would empty
      // each other's progress files.
      const cfg = workerConfigFromEnv(
        workerEnv({ nats, fn: target, inference }, join(responseDir, `worker-${workerCount++}`), {
          NVCF_REGION: "test",
          MAX_REQUEST_CONCURRENCY: String(opts.concurrency ?? 8),
          CALLPLANE_ACK_WAIT_SECONDS: String(queue.ackWaitSeconds),
          ...proxyWorkerEnv,
          ...opts.workerEnv,
          ...overrides,
        }),
      );
      // as the worker's main does: CALLPLANE_TRACING_* in its environment turn tracing on, and
      // its log lines about a request with a span carry the trace id
      const tracing =
        cfg.tracing && (await startTracing({ service: "worker", settings: cfg.tracing, exportDelayMs: 100 }));
      if (tracing) t.after(() => tracing.shutdown());
      const logger = fileLogger(`worker-${workerCount - 1}`, tracing?.logMixin);
      const agent = createWorkerAgent(cfg, { ...(logger ? { logger } : {}), tracing });
      await agent.start();
      t.after(() => agent.destroy());
      workers.push(agent);
      return agent;
    },
    async addFunction(o) {
      const extra = await deployFunction(api, `fn-${Math.random().toString(36).slice(2, 10)}`, {
        inferenceUrl: o.inferenceUrl,
      });
      for (let i = 0; i < (o.workers ?? 1); i++) await plane.addWorker({}, extra);
      return {
        fn: extra,
        invokeUrl: (r = 0) => `${replicas[r].url}/v2/nvcf/pexec/functions/${extra.functionId}`,
      };
    },
  };
  for (let i = 0; i < (opts.workers ?? 1); i++) await plane.addWorker();
  return plane;
}

/**
 * The callback proxy of a plane, as the stack runs it: frontend certificate and pod CA from files
 * (reloaded when they change), pod networks exactly the replicas' addresses, one worker TLS port
 * shared by every replica (the port in the pod addresses the proxy accepts).
 */
async function startPlaneProxy(
  t: Ctx,
  opts: { host?: string; podPort?: number },
  replicaHosts: string[],
): Promise<{
  plane: PlaneProxy;
  pki: TestPki;
  pkiDir: string;
  removeAfter(t: Ctx): void;
  uri: string;
  host: string;
  podPort: number;
}> {
  if (new Set(replicaHosts).size !== replicaHosts.length)
    throw new Error("with the proxy, every replica needs its own address (replicaHosts)");
  const pki = await testPki();
  const pkiDir = scratchDir("callplane-pki-");
  const frontendDir = join(pkiDir.dir, "proxy");
  const caFile = join(pkiDir.dir, TLS_FILES.ca);
  const front = await pki.issue(["*.worker.callplane.test", "worker.callplane.test"]);
  writeFileAtomic(join(frontendDir, TLS_FILES.key), front.keyPem);
  writeFileAtomic(join(frontendDir, TLS_FILES.cert), front.certPem, 0o644);
  writeFileAtomic(caFile, pki.ca.certPem, 0o644);
  // not in the certificate folders: a log written there wakes their watches on every line
  const logDir = scratchDir("callplane-proxy-log-");
  const accessLogFile = join(logDir.dir, "proxy.log");
  const logger = createLogger("callback-proxy", { destination: accessLogFile, sync: true, level: "info" });
  const registry = createRegistry("callback-proxy", { defaultMetrics: false });
  // the replicas' listeners are not up yet; a port free on the first address is free on the others
  const podPort = opts.podPort ?? (await freePort(replicaHosts[0]));
  const host = opts.host ?? "127.0.0.1";
  // as the proxy's main does: the reloaders read the files first, the proxy starts with what they read
  const frontend = new TlsReloader(
    "frontend",
    { certFile: join(frontendDir, TLS_FILES.cert), keyFile: join(frontendDir, TLS_FILES.key) },
    (m) => proxy.setFrontend(m),
    logger,
    registry,
  );
  const podCa = new TlsReloader("pod-ca", { caFile }, (m) => proxy.setPodCa(m.ca!), logger, registry);
  const port = await freePort(host);
  const metricsPort = await freePort(host);
  const proxy: CallbackProxy = await createCallbackProxy({
    listen: { host, port },
    metricsListen: { host, port: metricsPort },
    serviceDomain: "nvcf.svc.cluster.local",
    workerDomain: "worker.callplane.test",
    podNetworks: replicaHosts.map((h) => `${h}/32`),
    upstreamTls: true,
    podPort,
    frontend: { cert: frontend.material.cert!, key: frontend.material.key! },
    podCa: podCa.material.ca!,
    timeouts: { headersMs: 10_000, idleMs: 60_000, connectMs: 2000 },
    maxHeaderBytes: 16 * 1024,
    shutdownGraceMs: 10_000,
    logger,
    onAccessLog: (line) => appendFileSync(accessLogFile, `${line}\n`),
  });
  await proxy.listen();
  t.after(async () => {
    frontend.close();
    podCa.close();
    await proxy.close(2000);
  });
  const uri = `https://invocation.worker.callplane.test:${port}`;
  return {
    pki,
    pkiDir: pkiDir.dir,
    removeAfter: (c) => {
      pkiDir.removeAfter(c);
      logDir.removeAfter(c);
    },
    uri,
    host,
    podPort,
    plane: {
      proxy,
      registry,
      uri,
      host,
      port,
      pki,
      frontendDir,
      caFile,
      podPort,
      metricsUrl: `http://${host}:${metricsPort}/metrics`,
      accessLog: () => readLog(accessLogFile).filter((l) => l.msg === "callback"),
      callbacks: (outcome) =>
        readLog(accessLogFile).filter((l) => l.msg === "callback" && (!outcome || l.outcome === outcome))
          .length,
    },
  };
}

/** The sum of a counter's or gauge's values whose labels include `labels` (0 when there are none). */
export async function metricValue(
  registry: Registry,
  name: string,
  labels: Record<string, string> = {},
): Promise<number> {
  const metric = registry.getSingleMetric(name);
  if (!metric) return 0;
  const { values } = await metric.get();
  return values
    .filter((v) => Object.entries(labels).every(([k, want]) => String(v.labels[k]) === want))
    .reduce((sum, v) => sum + v.value, 0);
}
