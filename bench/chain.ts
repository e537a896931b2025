// The whole invocation chain for benchmarks, as real processes on loopback: nats-server, the API
// (for key checks), the example inference server, worker agents, and two invocation replicas of
// the same function: one whose workers call back through the callback proxy (TLS to the proxy, TLS
// from the proxy to the replica's worker listener: the path `npm start` sets up) and one whose
// workers call the replica's plain pod address (the in-cluster path). Both are measured in one run.
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import type { ChildProcess } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  createAdminTokenSigner,
  ensureAdminKeyPair,
  ensureServiceTokens,
} from "../src/lib/identity/index.js";
import { ensureKeyringFile } from "../src/lib/secrets/index.js";
import {
  ensureNatsKeys,
  natsServerBinary,
  readWorkerSeed,
  waitForNats,
  writeNatsServerConfig,
} from "../src/lib/nats/index.js";
import {
  TLS_FILES,
  createCa,
  grpcProxyCertFolder,
  invocationCertFolder,
  issueServerCert,
} from "../src/lib/tls/index.js";
import { descendantsOf, freePort, removeLater, start, waitHttp } from "./harness.js";

const dist = join(import.meta.dirname, "..");
const WORKER_DOMAIN = "worker.callplane.test";
const SERVICE_DOMAIN = "nvcf.svc.cluster.local";

export interface ChainOptions {
  workers: number;
  concurrency: number;
  /** Extra environment for the worker agents. */
  workerEnv?: NodeJS.ProcessEnv;
  /** Extra environment for callplane's services (configuration overrides, CALLPLANE__...). */
  serviceEnv?: NodeJS.ProcessEnv;
  /**
   * Also a gRPC function: the example gRPC server, `grpcWorkers` worker agents for it, and one
   * grpc-proxy replica whose workers open their tunnels through the callback proxy (as `npm start`
   * sets up).
   */
  grpc?: { workers: number; concurrency: number };
  /** The function's inference path (default /echo; the client's query string is appended). */
  inferenceUrl?: string;
  /** Invocation replicas whose workers call back through the callback proxy (default 1). */
  replicas?: number;
  /** Example inference servers; the workers are spread over them in turn (default 1). */
  inferenceServers?: number;
  /**
   * Run the worker agents as this uid and gid (needs root). Each worker watches its output folders
   * with inotify, and the kernel counts inotify instances and watches per user (128 instances by
   * default): a hundred workers under the user that runs everything else on a shared machine would
   * take what other users' processes need.
   */
  workerUid?: number;
  /** Worker agents started at once (default 1). */
  startBatch?: number;
}

export interface GrpcChain {
  /** host:port of grpc-proxy's client listener (workers reach it through the callback proxy). */
  target: string;
  /** host:port of a second grpc-proxy whose workers dial its CONNECT listener directly (in-cluster). */
  inCluster: string;
  functionId: string;
  proc: ChildProcess;
  inClusterProc: ChildProcess;
  /** host:port of the example gRPC server, for direct calls. */
  direct: string;
  server: ChildProcess;
  workers: ChildProcess[];
}

export interface Replica {
  /** The invocation URL of the chain's function on this replica. */
  url: string;
  /** host:port the replica listens on. */
  address: string;
  proc: ChildProcess;
}

export interface Chain {
  dir: string;
  key: string;
  /** The API (its URL and process) and a plane-wide admin token for it (an hour). */
  api: { url: string; proc: ChildProcess };
  adminToken: string;
  functionId: string;
  echo: { url: string; proc: ChildProcess };
  /** Every example inference server (the first is `echo`). */
  inference: Array<{ url: string; proc: ChildProcess }>;
  /** The replica whose workers call back through the proxy (as `npm start` sets up). */
  viaProxy: { url: string; proc: ChildProcess };
  /** Every replica whose workers call back through the proxy (the first is `viaProxy`). */
  replicas: Replica[];
  /** The replica whose workers call its plain pod address (in-cluster, no proxy). */
  direct: { url: string; proc: ChildProcess };
  proxy: ChildProcess;
  nats: ChildProcess;
  workers: ChildProcess[];
  grpc: GrpcChain | undefined;
  /** Every process of the chain by role, for CPU and memory figures. */
  roles(path: "viaProxy" | "directCallbacks"): Record<string, number[]>;
  /** Starts more worker agents for the function (they join `workers`). */
  addWorkers(n: number): Promise<ChildProcess[]>;
  close(): void;
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

export async function startChain(o: ChainOptions): Promise<Chain> {
  const dir = mkdtempSync(join(tmpdir(), "callplane-bench-chain-"));
  const keyFile = join(dir, "keys", "admin.key.pem");
  ensureAdminKeyPair(keyFile, join(dir, "keys", "admin.pub.pem"));
  ensureServiceTokens(join(dir, "secrets"));
  ensureKeyringFile(join(dir, "keys", "mek.json"));
  // with workers under another user: they must reach the CA file (the folder is 0700 from mkdtemp)
  if (o.workerUid !== undefined) chmodSync(dir, 0o711);
  const natsPort = await freePort();
  // the stack CA, the proxy's frontend certificate and the proxy-path replica's pod certificate
  const pki = join(dir, "pki");
  const ca = await createCa("bench CA");
  // nats-server as the stack runs it: TLS from the stack CA, every client with its own key
  const credentialsDir = join(dir, "secrets", "nats");
  ensureNatsKeys(credentialsDir);
  const natsCert = await issueServerCert(ca, ["127.0.0.1", "localhost"]);
  mkdirSync(join(pki, "nats"), { recursive: true });
  writeFileSync(join(pki, "nats", TLS_FILES.cert), natsCert.certPem);
  writeFileSync(join(pki, "nats", TLS_FILES.key), natsCert.keyPem, { mode: 0o600 });
  const natsCfg = writeNatsServerConfig(
    join(dir, "nats"),
    { host: "127.0.0.1", port: natsPort },
    {
      security: {
        certFile: join(pki, "nats", TLS_FILES.cert),
        keyFile: join(pki, "nats", TLS_FILES.key),
        credentialsDir,
        region: "bench",
      },
    },
  );
  const nats = await start("nats-server", natsServerBinary(), ["-c", natsCfg.configFile], {});
  await waitForNats({ host: "127.0.0.1", port: natsPort });
  const front = await issueServerCert(ca, [`*.${WORKER_DOMAIN}`, WORKER_DOMAIN]);
  mkdirSync(join(pki, "proxy"), { recursive: true });
  writeFileSync(join(pki, "ca.crt"), ca.certPem);
  writeFileSync(join(pki, "ca.key"), ca.keyPem, { mode: 0o600 });
  writeFileSync(join(pki, "proxy", TLS_FILES.cert), front.certPem);
  writeFileSync(join(pki, "proxy", TLS_FILES.key), front.keyPem, { mode: 0o600 });
  const directIp = "127.0.1.2";
  // the first replica is 127.0.1.1, the others 127.0.1.11, .12, ...: each its own pod certificate
  const replicaIps = Array.from({ length: o.replicas ?? 1 }, (_, i) =>
    i === 0 ? "127.0.1.1" : `127.0.1.${10 + i}`,
  );
  for (const ip of replicaIps) {
    const pod = await issueServerCert(ca, [`${ip.replaceAll(".", "-")}.invocation.${SERVICE_DOMAIN}`]);
    const podDir = invocationCertFolder(pki, ip);
    mkdirSync(podDir, { recursive: true });
    writeFileSync(join(podDir, TLS_FILES.cert), pod.certPem);
    writeFileSync(join(podDir, TLS_FILES.key), pod.keyPem, { mode: 0o600 });
  }

  const apiPort = await freePort();
  const invPort = await freePort();
  const tlsPort = await freePort();
  const proxyPort = await freePort();
  const grpcIp = "127.0.2.9";
  const grpcTlsPort = await freePort(grpcIp);
  const common: NodeJS.ProcessEnv = {
    CALLPLANE__GLOBAL__DATA_DIR: dir,
    CALLPLANE__LOG__LEVEL: "warn",
    CALLPLANE__NATS__URL: `tls://127.0.0.1:${natsPort}`,
    CALLPLANE__API__URL: `http://127.0.0.1:${apiPort}`,
    CALLPLANE__AUTH__ADMIN_SIGNING_KEY_FILE: keyFile,
    CALLPLANE__AUTH__ADMIN_PUBLIC_KEY_FILE: join(dir, "keys", "admin.pub.pem"),
    CALLPLANE__GLOBAL__REGION: "bench",
    CALLPLANE__PKI__DIR: pki,
    CALLPLANE__INVOCATION__PORT: String(invPort),
    CALLPLANE__WORKER_CALLBACK_PROXY__LISTEN: `127.0.0.1:${proxyPort}`,
    CALLPLANE__WORKER_CALLBACK_PROXY__METRICS_LISTEN: `127.0.0.1:${await freePort()}`,
    CALLPLANE__WORKER_CALLBACK_PROXY__INVOCATION__WORKER_TLS_PORT: String(tlsPort),
    // one replica each way: no relay needed, and none measured
    CALLPLANE__INVOCATION__RELAY__ENABLED: "false",
    // the pending bench holds thousands of polls per replica with the one key
    CALLPLANE__INVOCATION__MAX_IN_FLIGHT_PER_KEY: "1000000",
    // no issuer in the bench: the API must not look for its key
    CALLPLANE__ADMIN_ISSUER_PROXY__ENABLED: "false",
    CALLPLANE__GRPCPROXY__RELAY__ENABLED: "false",
    CALLPLANE__GRPCPROXY__WORKER_TLS_PORT: String(grpcTlsPort),
    ...o.serviceEnv,
  };
  // each service's log goes to <dir>/logs/<name>.log (CALLPLANE_BENCH_KEEP=1 keeps the folder)
  mkdirSync(join(dir, "logs"), { recursive: true });
  const service = (name: string, env: NodeJS.ProcessEnv, label = name) =>
    start(
      name,
      process.execPath,
      [join(dist, "src/services", name, "main.js")],
      { ...common, ...env },
      {
        ipc: true,
        logFile: join(dir, "logs", `${label}.log`),
      },
    );
  // the auth callout lets the workers' shared nkey in (as the stack runs it)
  await service("nats-auth-callout", {});
  const apiProc = await service("api", { CALLPLANE__API__LISTEN: `127.0.0.1:${apiPort}` });
  const api = `http://127.0.0.1:${apiPort}`;
  const admin = (await (await createAdminTokenSigner(readFileSync(keyFile, "utf8"), 3600)).sign()).token;
  const fn = (
    await json<{ function: { id: string; versionId: string } }>(`${api}/v2/nvcf/functions`, admin, {
      name: "bench-echo",
      inferenceUrl: o.inferenceUrl ?? "/echo",
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

  const inference: Array<{ url: string; port: number; proc: ChildProcess }> = [];
  for (let i = 0; i < (o.inferenceServers ?? 1); i++) {
    const port = await freePort();
    const proc = await start(
      i === 0 ? "echo" : `echo-${i}`,
      process.execPath,
      [join(dist, "examples/inference-server.js"), "--listen", `127.0.0.1:${port}`],
      {},
    );
    await waitHttp(`http://127.0.0.1:${port}/health`);
    inference.push({ url: `http://127.0.0.1:${port}`, port, proc });
  }
  const echo = inference[0].proc;
  const echoPort = inference[0].port;
  const replicaProcs: ChildProcess[] = [];
  for (const [i, ip] of replicaIps.entries())
    replicaProcs.push(
      await service(
        "invocation",
        { POD_IP: ip },
        i === 0 ? "invocation-via-proxy" : `invocation-via-proxy-${i}`,
      ),
    );
  const viaProxy = replicaProcs[0];
  const direct = await service(
    "invocation",
    { POD_IP: directIp, CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "false" },
    "invocation-direct",
  );
  const proxy = await service("callback-proxy", { CALLPLANE__LOG__LEVEL: "info" });
  const workers: ChildProcess[] = [];
  const startWorker = (i: number) => {
    const responses = join(dir, `responses-${i}`);
    if (o.workerUid !== undefined) {
      mkdirSync(responses);
      chownSync(responses, o.workerUid, o.workerUid);
    }
    return start(
      `worker-${i}`,
      process.execPath,
      [join(dist, "src/services/worker/main.js")],
      {
        NVCF_FQDN_NATS: `tls://127.0.0.1:${natsPort}`,
        NKEY_SEED: readWorkerSeed(credentialsDir),
        NVCF_NATS_CA_FILE: join(pki, "ca.crt"),
        FUNCTION_ID: fn.id,
        FUNCTION_VERSION_ID: fn.versionId,
        INFERENCE_PORT: String(inference[i % inference.length].port),
        INFERENCE_HEALTH_ENDPOINT: "/health",
        HEALTH_HOST: "127.0.0.1",
        HEALTH_PORT: "0",
        MAX_REQUEST_CONCURRENCY: String(o.concurrency),
        NVCF_REGION: "bench",
        BASE_RESPONSE_DIR: responses,
        NVCF_PROXY_CA_FILE: join(pki, "ca.crt"),
        CALLPLANE_WORKER_HOST_MAP: `invocation.${WORKER_DOMAIN}=127.0.0.1`,
        CALLPLANE_LOG_LEVEL: "warn",
        ...o.workerEnv,
      },
      {
        ipc: true,
        logFile: join(dir, "logs", `worker-${i}.log`),
        ...(o.workerUid !== undefined ? { uid: o.workerUid } : {}),
      },
    );
  };
  const addWorkers = async (n: number): Promise<ChildProcess[]> => {
    const batch = Math.max(1, o.startBatch ?? 1);
    const added: ChildProcess[] = [];
    for (let k = 0; k < n; k += batch) {
      const first = workers.length;
      const more = await Promise.all(
        Array.from({ length: Math.min(batch, n - k) }, (_, j) => startWorker(first + j)),
      );
      workers.push(...more);
      added.push(...more);
    }
    return added;
  };
  await addWorkers(o.workers);
  let grpc: GrpcChain | undefined;
  if (o.grpc) {
    const gfn = (
      await json<{ function: { id: string; versionId: string } }>(`${api}/v2/nvcf/functions`, admin, {
        name: "bench-grpc",
        inferenceUrl: "/grpc",
        containerImage: "local/grpc-echo",
        health: { protocol: "gRPC", uri: "/" },
      })
    ).function;
    await json(`${api}/v2/nvcf/deployments/functions/${gfn.id}/versions/${gfn.versionId}`, admin, {
      deploymentSpecifications: [
        {
          gpu: "local",
          instanceType: "local.cpu",
          minInstances: o.grpc.workers,
          maxInstances: o.grpc.workers,
          maxRequestConcurrency: o.grpc.concurrency,
        },
      ],
    });
    const gpod = await issueServerCert(ca, [`127-0-2-9.grpc-headless.${SERVICE_DOMAIN}`]);
    const gpodDir = grpcProxyCertFolder(pki, grpcIp);
    mkdirSync(gpodDir, { recursive: true });
    writeFileSync(join(gpodDir, TLS_FILES.cert), gpod.certPem);
    writeFileSync(join(gpodDir, TLS_FILES.key), gpod.keyPem, { mode: 0o600 });
    const gport = await freePort(grpcIp);
    const serverPort = await freePort();
    const server = await start(
      "grpc-server",
      process.execPath,
      [join(dist, "examples/grpc-server.js"), "--listen", `127.0.0.1:${serverPort}`],
      {},
    );
    const gproxy = await service(
      "grpc-proxy",
      { POD_IP: grpcIp, CALLPLANE__GRPCPROXY__PORT: String(gport), CALLPLANE__GRPCPROXY__CONNECT_PORT: "0" },
      "grpc-proxy",
    );
    const inClusterIp = "127.0.2.10";
    const inClusterPort = await freePort(inClusterIp);
    const inCluster = await service(
      "grpc-proxy",
      {
        POD_IP: inClusterIp,
        CALLPLANE__GRPCPROXY__PORT: String(inClusterPort),
        CALLPLANE__GRPCPROXY__CONNECT_PORT: "0",
        CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "false",
      },
      "grpc-proxy-in-cluster",
    );
    const gworkers: ChildProcess[] = [];
    for (let i = 0; i < o.grpc.workers; i++) {
      gworkers.push(
        await start(
          `grpc-worker-${i}`,
          process.execPath,
          [join(dist, "src/services/worker/main.js")],
          {
            // NATS as the HTTP workers reach it: TLS from the stack CA, the workers' shared nkey
            NVCF_FQDN_NATS: `tls://127.0.0.1:${natsPort}`,
            NKEY_SEED: readWorkerSeed(credentialsDir),
            NVCF_NATS_CA_FILE: join(pki, "ca.crt"),
            FUNCTION_ID: gfn.id,
            FUNCTION_VERSION_ID: gfn.versionId,
            INFERENCE_PORT: String(serverPort),
            INFERENCE_HEALTH_PROTOCOL: "gRPC",
            HEALTH_HOST: "127.0.0.1",
            HEALTH_PORT: "0",
            MAX_REQUEST_CONCURRENCY: String(o.grpc.concurrency),
            NVCF_REGION: "bench",
            BASE_RESPONSE_DIR: join(dir, `grpc-responses-${i}`),
            NVCF_PROXY_CA_FILE: join(pki, "ca.crt"),
            CALLPLANE_WORKER_HOST_MAP: `*.${WORKER_DOMAIN}=127.0.0.1`,
            CALLPLANE_SESSION_RECONNECT_WAIT_SECONDS: "1",
            CALLPLANE_LOG_LEVEL: "warn",
          },
          { ipc: true, logFile: join(dir, "logs", `grpc-worker-${i}.log`) },
        ),
      );
    }
    grpc = {
      target: `${grpcIp}:${gport}`,
      inCluster: `${inClusterIp}:${inClusterPort}`,
      functionId: gfn.id,
      proc: gproxy,
      inClusterProc: inCluster,
      direct: `127.0.0.1:${serverPort}`,
      server,
      workers: gworkers,
    };
  }
  const path = `/v2/nvcf/pexec/functions/${fn.id}`;
  return {
    grpc,
    dir,
    key,
    api: { url: api, proc: apiProc },
    adminToken: admin,
    functionId: fn.id,
    echo: { url: `http://127.0.0.1:${echoPort}`, proc: echo },
    inference: inference.map(({ url, proc }) => ({ url, proc })),
    viaProxy: { url: `http://${replicaIps[0]}:${invPort}${path}`, proc: viaProxy },
    replicas: replicaIps.map((ip, i) => ({
      url: `http://${ip}:${invPort}${path}`,
      address: `${ip}:${invPort}`,
      proc: replicaProcs[i],
    })),
    direct: { url: `http://${directIp}:${invPort}${path}`, proc: direct },
    proxy,
    nats,
    workers,
    addWorkers,
    roles(which) {
      return {
        nats: [nats.pid!],
        invocation: [(which === "viaProxy" ? viaProxy : direct).pid!],
        // the keeper and the HAProxy processes it runs
        ...(which === "viaProxy" ? { proxy: [proxy.pid!, ...descendantsOf(proxy.pid!)] } : {}),
        worker: workers.map((w) => w.pid!),
        echo: [echo.pid!],
      };
    },
    close() {
      if (process.env.CALLPLANE_BENCH_KEEP) console.log(`  kept ${dir}`);
      else removeLater(dir);
    },
  };
}
