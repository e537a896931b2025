// A whole invocation plane for tests: nats-server, the API, a function deployed with an API key,
// invocation replicas and worker agents beside an example inference server. Services run in this
// process on 127.0.0.1:0 unless a test asks for child processes.
import { createServer, type Server } from "node:http";
import { join } from "node:path";
import type { TestContext } from "node:test";
import type { AddressInfo } from "node:net";
import { handle as exampleHandler } from "../../examples/inference-server.js";
import { DEFAULT_QUEUE_LIMITS, type QueueLimits } from "../../src/lib/queue.js";
import {
  createInvocationService,
  type InvocationService,
  type InvocationServiceOptions,
} from "../../src/services/invocation/service.js";
import { createWorkerAgent, type WorkerAgent } from "../../src/services/worker/agent.js";
import { workerConfigFromEnv } from "../../src/services/worker/config.js";
import { call, sampleDeployment, startApi, startNats, tmpDir, type ApiFixture, type Nats } from "./index.js";

type Ctx = Pick<TestContext, "after">;

export async function startExampleServer(
  t: Ctx,
  host = "127.0.0.1",
): Promise<{ server: Server; port: number; url: string }> {
  const server = createServer({ keepAliveTimeout: 65_000 }, exampleHandler);
  await new Promise<void>((r) => server.listen(0, host, r));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const port = (server.address() as AddressInfo).port;
  return { server, port, url: `http://${host}:${port}` };
}

export interface DeployedFunction {
  functionId: string;
  versionId: string;
  apiKey: string;
}

export async function deployFunction(
  api: ApiFixture,
  name: string,
  opts: { inferenceUrl?: string; functionType?: string; concurrency?: number } = {},
): Promise<DeployedFunction> {
  const admin = await api.adminToken();
  const created = await call<{ function: { id: string; versionId: string } }>(
    `${api.url}/v2/nvcf/functions`,
    {
      token: admin,
      body: {
        name,
        inferenceUrl: opts.inferenceUrl ?? "/echo",
        containerImage: "local/echo",
        health: { uri: "/health" },
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
  inference: { url: string; port: number };
  replicas: Array<{ service: InvocationService; url: string }>;
  workers: WorkerAgent[];
  invokeUrl(replica?: number): string;
  addWorker(overrides?: Record<string, string>): Promise<WorkerAgent>;
}

export interface PlaneOptions {
  replicas?: number;
  workers?: number;
  concurrency?: number;
  queue?: Partial<QueueLimits>;
  invocation?: Partial<InvocationServiceOptions>;
  workerEnv?: Record<string, string>;
  inferenceUrl?: string;
}

export function workerEnv(
  plane: { nats: Nats; fn: DeployedFunction; inference: { port: number } },
  responseDir: string,
  extra: Record<string, string> = {},
): NodeJS.ProcessEnv {
  return {
    NVCF_FQDN_NATS: plane.nats.url,
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
  const nats = await startNats(t);
  const api = await startApi(t);
  const fn = await deployFunction(api, `fn-${Math.random().toString(36).slice(2, 10)}`, {
    inferenceUrl: opts.inferenceUrl ?? "/echo",
  });
  const inference = await startExampleServer(t);
  const responseDir = join(tmpDir(t, "callplane-responses-"));
  const queue = { ...DEFAULT_QUEUE_LIMITS, ...opts.queue };
  const replicas: Plane["replicas"] = [];
  for (let i = 0; i < (opts.replicas ?? 1); i++) {
    const service = createInvocationService({
      listen: { host: "127.0.0.1", port: 0 },
      region: "test",
      serviceDomain: "nvcf.svc.cluster.local",
      natsUrl: nats.url,
      apiUrl: api.url,
      serviceToken: api.serviceToken("invocation"),
      queue,
      ...opts.invocation,
    });
    const url = (await service.listen()).origin;
    t.after(() => service.destroy());
    replicas.push({ service, url });
  }
  const workers: WorkerAgent[] = [];
  const plane: Plane = {
    nats,
    api,
    fn,
    inference,
    replicas,
    workers,
    invokeUrl: (r = 0) => `${replicas[r].url}/v2/nvcf/pexec/functions/${fn.functionId}`,
    async addWorker(overrides = {}) {
      const cfg = workerConfigFromEnv(
        workerEnv(plane, responseDir, {
          NVCF_REGION: "test",
          MAX_REQUEST_CONCURRENCY: String(opts.concurrency ?? 8),
          CALLPLANE_ACK_WAIT_SECONDS: String(queue.ackWaitSeconds),
          ...opts.workerEnv,
          ...overrides,
        }),
      );
      const agent = createWorkerAgent(cfg);
      await agent.start();
      t.after(() => agent.destroy());
      workers.push(agent);
      return agent;
    },
  };
  for (let i = 0; i < (opts.workers ?? 1); i++) await plane.addWorker();
  return plane;
}
