// A whole invocation plane for tests: nats-server, the API, a function deployed with an API key,
// invocation replicas and worker agents beside an example inference server. Services run in this
// process on 127.0.0.1:0 unless a test asks for child processes.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
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
import { call, sampleDeployment, startApi, startNats, type ApiFixture, type Nats } from "./index.js";

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
  /** The example inference server every worker of the plane calls (`server` lets a test stop it). */
  inference: { url: string; port: number; server: Server };
  replicas: Array<{ service: InvocationService; url: string }>;
  workers: WorkerAgent[];
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
  const natsDir = scratchDir("callplane-nats-");
  const nats = await startNats(t, { dir: natsDir.dir });
  natsDir.removeAfter(t);
  const apiDir = scratchDir("callplane-api-");
  const api = await startApi(t, { dir: apiDir.dir });
  apiDir.removeAfter(t);
  const fn = await deployFunction(api, `fn-${Math.random().toString(36).slice(2, 10)}`, {
    inferenceUrl: opts.inferenceUrl ?? "/echo",
  });
  const inference = await startExampleServer(t);
  // workers started later write here until their own hooks stop them; removal tolerates that
  const responses = scratchDir("callplane-responses-");
  responses.removeAfter(t);
  const responseDir = responses.dir;
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
  let workerCount = 0;
  const plane: Plane = {
    nats,
    api,
    fn,
    inference,
    replicas,
    workers,
    invokeUrl: (r = 0) => `${replicas[r].url}/v2/nvcf/pexec/functions/${fn.functionId}`,
    async addWorker(overrides = {}, target = fn) {
      // Each worker gets its own output folders: two workers sharing slot-N folders would empty
      // each other's progress files.
      const cfg = workerConfigFromEnv(
        workerEnv({ nats, fn: target, inference }, join(responseDir, `worker-${workerCount++}`), {
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
