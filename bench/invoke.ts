// Benchmark: a 1 KiB echo invocation through callplane (client → invocation service → JetStream →
// worker agent → echo server → worker → invocation service → client) against the same request
// sent straight to the echo server, measured in one run on this machine. Prints throughput with
// many concurrent clients and latency with one client at a time, and the ratios.
import { readFileSync } from "node:fs";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createAdminTokenSigner, ensureAdminKeyPair, ensureServiceTokens } from "../src/lib/auth.js";
import { natsServerBinary, waitForNats, writeNatsServerConfig } from "../src/lib/nats-server.js";
import {
  cpuMs,
  freePort,
  hasWrk,
  load,
  machine,
  sequential,
  start,
  waitHttp,
  wrk,
  wrkScript,
  type LoadResult,
} from "./harness.js";

const dist = join(import.meta.dirname, "..");

export interface InvokeBenchOptions {
  seconds: number;
  connections: number;
  workers: number;
  concurrency: number;
}

async function json<T>(url: string, token: string, body?: unknown): Promise<T> {
  const r = await fetch(url, {
    method: body === undefined ? "GET" : "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`${url}: ${r.status} ${text}`);
  return JSON.parse(text) as T;
}

export async function benchInvoke(o: InvokeBenchOptions): Promise<Record<string, unknown>> {
  const dir = mkdtempSync(join(tmpdir(), "callplane-bench-"));
  try {
    const keyFile = join(dir, "keys", "admin.key.pem");
    ensureAdminKeyPair(keyFile, join(dir, "keys", "admin.pub.pem"));
    ensureServiceTokens(join(dir, "secrets"));
    const natsPort = await freePort();
    const nats = writeNatsServerConfig(join(dir, "nats"), { host: "127.0.0.1", port: natsPort });
    const natsProc = await start("nats-server", natsServerBinary(), ["-c", nats.configFile], {});
    await waitForNats({ host: "127.0.0.1", port: natsPort });
    const apiPort = await freePort();
    const common = {
      CALLPLANE__GLOBAL__DATA_DIR: dir,
      CALLPLANE__LOG__LEVEL: "warn",
      CALLPLANE__NATS__URL: `nats://127.0.0.1:${natsPort}`,
      CALLPLANE__API__URL: `http://127.0.0.1:${apiPort}`,
      CALLPLANE__AUTH__ADMIN_SIGNING_KEY_FILE: keyFile,
      CALLPLANE__AUTH__ADMIN_PUBLIC_KEY_FILE: join(dir, "keys", "admin.pub.pem"),
      CALLPLANE__GLOBAL__REGION: "bench",
      // the in-cluster path: workers call the replica at its pod address (bench/proxy.ts measures the proxy)
      CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "false",
    };
    await start(
      "api",
      process.execPath,
      [join(dist, "src/services/api/main.js")],
      { ...common, CALLPLANE__API__LISTEN: `127.0.0.1:${apiPort}` },
      { ipc: true },
    );
    const api = `http://127.0.0.1:${apiPort}`;
    const admin = (await (await createAdminTokenSigner(readFileSync(keyFile, "utf8"), 3600)).sign()).token;
    const fn = (
      await json<{ function: { id: string; versionId: string } }>(`${api}/v2/nvcf/functions`, admin, {
        name: "bench-echo",
        inferenceUrl: "/echo",
        containerImage: "local/echo",
        health: { uri: "/health" },
      })
    ).function;
    await json(`${api}/v2/nvcf/deployments/functions/${fn.id}/versions/${fn.versionId}`, admin, {
      deploymentSpecifications: [
        {
          gpu: "local",
          instanceType: "local.cpu",
          minInstances: o.workers,
          maxInstances: o.workers,
          maxRequestConcurrency: o.concurrency,
        },
      ],
    });
    const key = (await json<{ value: string }>(`${api}/v1/keys`, admin, { description: "bench" })).value;

    const echoPort = await freePort();
    const echo = await start(
      "echo",
      process.execPath,
      [join(dist, "examples/inference-server.js"), "--listen", `127.0.0.1:${echoPort}`],
      {},
    );
    await waitHttp(`http://127.0.0.1:${echoPort}/health`);
    const invPort = await freePort();
    const inv = await start(
      "invocation",
      process.execPath,
      [join(dist, "src/services/invocation/main.js")],
      { ...common, POD_IP: "127.0.0.1", CALLPLANE__INVOCATION__PORT: String(invPort) },
      { ipc: true },
    );
    const workers = [];
    for (let i = 0; i < o.workers; i++) {
      workers.push(
        await start(
          `worker-${i}`,
          process.execPath,
          [join(dist, "src/services/worker/main.js")],
          {
            NVCF_FQDN_NATS: `nats://127.0.0.1:${natsPort}`,
            FUNCTION_ID: fn.id,
            FUNCTION_VERSION_ID: fn.versionId,
            INFERENCE_PORT: String(echoPort),
            INFERENCE_HEALTH_ENDPOINT: "/health",
            HEALTH_HOST: "127.0.0.1",
            HEALTH_PORT: "0",
            MAX_REQUEST_CONCURRENCY: String(o.concurrency),
            NVCF_REGION: "bench",
            BASE_RESPONSE_DIR: join(dir, `responses-${i}`),
            CALLPLANE_LOG_LEVEL: "warn",
          },
          { ipc: true },
        ),
      );
    }
    const body = Buffer.alloc(1024, "x");
    const direct = {
      url: `http://127.0.0.1:${echoPort}/echo`,
      headers: { "content-type": "application/octet-stream" },
    };
    const through = {
      url: `http://127.0.0.1:${invPort}/v2/nvcf/pexec/functions/${fn.id}`,
      headers: { "content-type": "application/octet-stream", authorization: `Bearer ${key}` },
    };
    // warm up both paths (JIT, connection pools, the auth cache)
    await load({ ...direct, connections: 8, seconds: 2, body });
    await load({ ...through, connections: 8, seconds: 3, body });

    const pids = {
      nats: natsProc.pid!,
      invocation: inv.pid!,
      echo: echo.pid!,
      workers: workers.map((w) => w.pid!),
    };
    const measure = async (
      target: typeof direct,
      connections: number,
    ): Promise<LoadResult & { cpuMsPerRequest: Record<string, number> }> => {
      const lg0 = process.cpuUsage();
      const useWrk = hasWrk();
      const before = {
        nats: cpuMs(pids.nats),
        invocation: cpuMs(pids.invocation),
        echo: cpuMs(pids.echo),
        workers: pids.workers.reduce((s, p) => s + cpuMs(p), 0),
      };
      // wrk (C) when installed: a Node load generator would take a large share of two cores
      const r: LoadResult & { loadgen: string; loadgenCpuMs: number } = useWrk
        ? await (async () => {
            const u = new URL(target.url);
            const script = wrkScript(
              join(dir, `load-${u.port}.lua`),
              "POST",
              u.pathname,
              target.headers,
              body.length,
            );
            const w = await wrk(u.origin, script, { seconds: o.seconds, connections });
            return {
              requests: w.requests,
              rps: w.rps,
              p50: w.p50ms,
              p99: w.p99ms,
              errors: w.errors,
              non2xx: 0,
              durationS: o.seconds,
              loadgen: "wrk",
              loadgenCpuMs: w.cpuMs,
            };
          })()
        : {
            ...(await load({ ...target, connections, seconds: o.seconds, body })),
            loadgen: "autocannon",
            loadgenCpuMs: NaN,
          };
      const per = (after: number, b: number) =>
        Math.round(((after - b) / Math.max(1, r.requests)) * 1000) / 1000;
      return {
        ...r,
        cpuMsPerRequest: {
          loadgen: (() => {
            if (useWrk) return per(r.loadgenCpuMs, 0);
            const u = process.cpuUsage(lg0);
            return per((u.user + u.system) / 1000, 0);
          })(),
          nats: per(cpuMs(pids.nats), before.nats),
          invocation: per(cpuMs(pids.invocation), before.invocation),
          workers: per(
            pids.workers.reduce((s, p) => s + cpuMs(p), 0),
            before.workers,
          ),
          echo: per(cpuMs(pids.echo), before.echo),
        },
      };
    };
    const directLatency = await sequential({ ...direct, seconds: o.seconds, body });
    const callplaneLatency = await sequential({ ...through, seconds: o.seconds, body });
    const directThroughput = await measure(direct, o.connections);
    const callplaneThroughput = await measure(through, o.connections);
    return {
      benchmark: "invoke",
      machine: machine(),
      options: o,
      latency: {
        direct: directLatency,
        callplane: callplaneLatency,
        addedP50ms: Math.round((callplaneLatency.p50 - directLatency.p50) * 100) / 100,
        addedP99ms: Math.round((callplaneLatency.p99 - directLatency.p99) * 100) / 100,
      },
      throughput: {
        direct: directThroughput,
        callplane: callplaneThroughput,
        ratio: Math.round((callplaneThroughput.rps / directThroughput.rps) * 1000) / 1000,
      },
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
