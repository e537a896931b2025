// A gRPC invocation plane for tests: nats-server, the API, a gRPC function with an API key, the
// example gRPC server (in this process, so a test can read its counters), grpc-proxy replicas on
// their own loopback addresses and worker agents, all real and stopped when the test ends. Clients:
// @grpc/grpc-js (grpcClient) and Python's grpcio (runPython, test/testkit/grpc_client.py).
import { create } from "@bufbuild/protobuf";
import {
  Metadata,
  credentials,
  makeGenericClientConstructor,
  type ChannelCredentials,
  type Client,
} from "@grpc/grpc-js";
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { startGrpcExample, stats } from "../../examples/grpc-server.js";
import { Echo, EchoMessageSchema, type EchoMessage } from "../../src/gen/callplane/examples/echo_pb.js";
import { UNLIMITED_MESSAGES, grpcDefinition } from "../../src/lib/grpc/index.js";
import { createLogger, type Logger } from "../../src/lib/log.js";
import { DEFAULT_QUEUE_LIMITS } from "../../src/lib/nats/index.js";
import { startTracing } from "../../src/lib/tracing/index.js";
import {
  createGrpcProxy,
  type GrpcProxy,
  type GrpcProxyOptions,
} from "../../src/services/grpc-proxy/service.js";
import { createWorkerAgent, type WorkerAgent } from "../../src/services/worker/agent.js";
import { workerConfigFromEnv } from "../../src/services/worker/config.js";
import { startNats, type Nats } from "./nats.js";
import { repoRoot } from "./paths.js";
import { removeDir } from "./scope.js";
import { startApi, type ApiFixture } from "./services.js";
import { deployFunction, readLog, type DeployedFunction } from "./plane.js";

type Ctx = Pick<TestContext, "after">;

export const GRPC_FUNCTION = {
  inferenceUrl: "/grpc",
  containerImage: "local/grpc-echo",
  health: { protocol: "gRPC", uri: "/", timeout: "PT10S" },
};

export interface GrpcPlane {
  nats: Nats;
  api: ApiFixture;
  fn: DeployedFunction;
  example: {
    port: number;
    stats: { calls: number; cancelled: number; streamed: number };
    stop(): Promise<void>;
  };
  proxies: Array<{ proxy: GrpcProxy; target: string; host: string }>;
  workers: WorkerAgent[];
  addWorker(env?: Record<string, string>): Promise<WorkerAgent>;
  logs(name: string): Array<Record<string, unknown>>;
}

export interface GrpcPlaneOptions {
  /** One grpc-proxy replica per address (default one on 127.0.70.1). */
  hosts?: string[];
  workers?: number;
  proxy?: Partial<GrpcProxyOptions> | ((i: number) => Partial<GrpcProxyOptions>);
  workerEnv?: Record<string, string>;
  logs?: boolean;
  /** The work queue's limits (the API creates the queue with them, and the proxies know them). */
  queue?: { maxMessages: number; maxMessageBytes: number };
}

export async function startGrpcPlane(t: Ctx, opts: GrpcPlaneOptions = {}): Promise<GrpcPlane> {
  const nats = await startNats(t, { region: "test" });
  const api = await startApi(t, { nats, region: "test", ...(opts.queue ? { queue: opts.queue } : {}) });
  const fn = await deployFunction(api, `grpc-${Math.random().toString(36).slice(2, 10)}`, GRPC_FUNCTION);
  const { server, port } = await startGrpcExample("127.0.0.1", 0);
  t.after(() => server.forceShutdown());
  const dir = mkdtempSync(join(tmpdir(), "callplane-grpc-"));
  const logFile = (name: string) => join(dir, `${name}.log`);
  const fileLogger = (name: string, mixin?: (o: object) => object): Logger | undefined =>
    opts.logs
      ? createLogger(name, {
          destination: logFile(name),
          sync: true,
          level: "info",
          ...(mixin ? { mixin } : {}),
        })
      : undefined;
  const proxies: GrpcPlane["proxies"] = [];
  for (const [i, host] of (opts.hosts ?? ["127.0.70.1"]).entries()) {
    const logger = fileLogger(`proxy-${i}`);
    const extra = typeof opts.proxy === "function" ? opts.proxy(i) : opts.proxy;
    const proxy = createGrpcProxy({
      listen: { host, port: 0 },
      connectPort: 0,
      region: "test",
      serviceDomain: "nvcf.svc.cluster.local",
      nats: nats.access("grpc-proxy"),
      apiUrl: api.url,
      serviceToken: api.serviceToken("invocation"),
      queue: { ...DEFAULT_QUEUE_LIMITS, ...opts.queue },
      relay: { enabled: true },
      ...(logger ? { logger } : {}),
      ...extra,
    });
    const url = await proxy.listen();
    t.after(() => proxy.destroy());
    proxies.push({ proxy, target: url.host, host });
  }
  const workers: WorkerAgent[] = [];
  let n = 0;
  const plane: GrpcPlane = {
    nats,
    api,
    fn,
    example: { port, stats, stop: () => new Promise((r) => server.tryShutdown(() => r())) },
    proxies,
    workers,
    async addWorker(env = {}) {
      const k = n++;
      const cfg = workerConfigFromEnv({
        NVCF_FQDN_NATS: nats.url,
        ...nats.workerNkeyEnv(),
        FUNCTION_ID: fn.functionId,
        FUNCTION_VERSION_ID: fn.versionId,
        FUNCTION_NAME: "grpc-test",
        INFERENCE_PORT: String(port),
        INFERENCE_HOST: "127.0.0.1",
        INFERENCE_HEALTH_PROTOCOL: "gRPC",
        HEALTH_HOST: "127.0.0.1",
        HEALTH_PORT: "0",
        MAX_REQUEST_CONCURRENCY: "8",
        BASE_RESPONSE_DIR: join(dir, `worker-${k}`),
        NVCF_REGION: "test",
        CALLPLANE_SESSION_RECONNECT_WAIT_SECONDS: "2",
        CALLPLANE_LOG_LEVEL: "silent",
        ...opts.workerEnv,
        ...env,
      });
      // as the worker's main does: CALLPLANE_TRACING_* in its environment turn tracing on, and
      // its log lines about a request with a span carry the trace id
      const tracing =
        cfg.tracing && (await startTracing({ service: "worker", settings: cfg.tracing, exportDelayMs: 100 }));
      if (tracing) t.after(() => tracing.shutdown());
      const logger = fileLogger(`worker-${k}`, tracing?.logMixin);
      const agent = createWorkerAgent(cfg, { ...(logger ? { logger } : {}), tracing });
      await agent.start();
      t.after(() => agent.destroy());
      workers.push(agent);
      return agent;
    },
    logs: (name) => readLog(logFile(name)),
  };
  for (let i = 0; i < (opts.workers ?? 1); i++) await plane.addWorker();
  t.after(() => removeDir(dir));
  return plane;
}

export type EchoClient = Client & {
  Unary: (...a: unknown[]) => unknown;
  ServerStream: (...a: unknown[]) => unknown;
  ClientStream: (...a: unknown[]) => unknown;
  Bidi: (...a: unknown[]) => unknown;
};

const EchoClientCtor = makeGenericClientConstructor(grpcDefinition(Echo), "Echo");

/** A @grpc/grpc-js client of callplane.examples.Echo on one HTTP/2 connection to `target`. */
export function grpcClient(
  t: Ctx,
  target: string,
  options: Record<string, unknown> = {},
  creds: ChannelCredentials = credentials.createInsecure(),
): EchoClient {
  const c = new EchoClientCtor(target, creds, {
    ...UNLIMITED_MESSAGES,
    // a new connection per client object: tests count sessions by client
    "grpc.use_local_subchannel_pool": 1,
    ...options,
  }) as unknown as EchoClient;
  t.after(() => c.close());
  return c;
}

export function echoMessage(payload: Uint8Array | string, repeat = 0, delayMs = 0): EchoMessage {
  return create(EchoMessageSchema, {
    payload: typeof payload === "string" ? Buffer.from(payload) : payload,
    repeat,
    delayMs,
  });
}

export function meta(fn: DeployedFunction, extra: Record<string, string> = {}): Metadata {
  const m = new Metadata();
  m.set("authorization", `Bearer ${fn.apiKey}`);
  m.set("function-id", fn.functionId);
  for (const [k, v] of Object.entries(extra)) m.set(k, v);
  return m;
}

export interface UnaryResult {
  err: (Error & { code?: number; details?: string; metadata?: Metadata }) | null;
  value: EchoMessage | undefined;
  headers: Metadata | undefined;
  trailers: Metadata | undefined;
}

/** One unary call; resolves with its error or value, its initial and trailing metadata. */
export function unary(
  client: EchoClient,
  msg: EchoMessage,
  md: Metadata,
  options: Record<string, unknown> = {},
): Promise<UnaryResult> {
  return new Promise((resolve) => {
    const r: UnaryResult = { err: null, value: undefined, headers: undefined, trailers: undefined };
    const call = client.Unary(msg, md, options, (err: UnaryResult["err"], value: EchoMessage) => {
      r.err = err;
      r.value = value;
      setImmediate(() => resolve(r));
    }) as { on(e: string, f: (m: Metadata | { metadata: Metadata }) => void): void };
    call.on("metadata", (m) => (r.headers = m as Metadata));
    call.on("status", (s) => (r.trailers = (s as { metadata: Metadata }).metadata));
  });
}

/** Runs test/testkit/grpc_client.py with /usr/bin/python3 (Debian's python3-grpcio); resolves with its JSON output. */
export function runPython(
  args: string[],
  input?: string,
): Promise<{ code: number | null; out: unknown; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn("/usr/bin/python3", [join(repoRoot, "test", "testkit", "grpc_client.py"), ...args], {
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    child.once("error", reject);
    child.once("close", (code) => {
      let out: unknown;
      try {
        out = JSON.parse(stdout);
      } catch {
        out = stdout;
      }
      resolve({ code, out, stderr });
    });
    child.stdin.end(input ?? "");
  });
}
