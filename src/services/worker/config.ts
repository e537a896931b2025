// The worker agent is configured by environment, with the names the NVCF contract gives workers
// (§3.1) where they apply, plus a few callplane additions (marked) for running on one machine.
import { readFileSync } from "node:fs";
import { z } from "zod";
import { ConfigError } from "../../lib/config/index.js";
import { formatHostPort, parseHostPort } from "../../lib/net/index.js";
import { tracingFromEnv, type TracingSettings } from "../../lib/tracing/index.js";

const int = (def: number, min = 0, max = Number.MAX_SAFE_INTEGER) =>
  z.coerce.number().int().min(min).max(max).default(def);

const hostMap = z
  .string()
  .default("")
  .transform((v, ctx) => {
    const map = new Map<string, string>();
    for (const item of v
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean)) {
      const [name, ip] = item.split("=");
      if (!name || !ip) {
        ctx.addIssue({ code: "custom", message: `"${item}" is not name=address` });
        continue;
      }
      map.set(name.toLowerCase(), ip);
    }
    return map;
  });

const envSchema = z.object({
  NVCF_FQDN_NATS: z.string().regex(/^(nats|tls):\/\//, "must be a nats:// URL"),
  FUNCTION_ID: z.uuid(),
  FUNCTION_VERSION_ID: z.uuid(),
  FUNCTION_NAME: z.string().default(""),
  NCA_ID: z.string().default(""),
  INSTANCE_ID: z.string().default(""),
  INSTANCE_TYPE: z.string().default(""),
  GPU_NAME: z.string().default(""),
  INFERENCE_PORT: int(8000, 1, 65535),
  /** callplane: the inference server's host (upstream always uses 127.0.0.1). */
  INFERENCE_HOST: z.string().default("127.0.0.1"),
  INFERENCE_URL: z.string().default(""),
  INFERENCE_HEALTH_ENDPOINT: z.string().startsWith("/").default("/v2/health/ready"),
  INFERENCE_HEALTH_PORT: z.coerce.number().int().min(1).max(65535).optional(),
  INFERENCE_HEALTH_PROTOCOL: z.enum(["HTTP", "http", "gRPC", "grpc"]).default("HTTP"),
  INFERENCE_HEALTH_TIMEOUT: z.string().default("PT10S"),
  INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE: int(200, 100, 599),
  INFERENCE_READY_TIMEOUT: z.string().default("PT30M"),
  MAX_REQUEST_CONCURRENCY: int(1, 1, 1024),
  HEALTH_PORT: int(8080, 0, 65535),
  /** callplane: the address the health listener binds (a pod binds all; one machine binds its instance address). */
  HEALTH_HOST: z.string().default("0.0.0.0"),
  BASE_RESPONSE_DIR: z.string().default("/tmp/callplane-worker/responses"),
  /** nkey mode: the shared worker nkey seed the API hands out (contract §3.4). */
  NKEY_SEED: z.string().default(""),
  /** token mode: the account to ask for (the API sends APP; an older worker asks for Worker). */
  NVCF_NATS_ACCOUNT: z.string().default("Worker"),
  /** The worker's identity token, refreshed in place by the compute agent (PR #847's names). */
  NVCF_TOKEN_FILE_PATH: z.string().default(""),
  NVCF_IDENTITY_SOURCE: z.string().default(""),
  /** callplane: the CA of the NATS server's certificate (PEM, or colon-separated PEM files). */
  NVCF_NATS_CA_PEM: z.string().default(""),
  NVCF_NATS_CA_FILE: z.string().default(""),
  NVCF_PROXY_CA_PEM: z.string().default(""),
  NVCF_PROXY_CA_FILE: z.string().default(""),
  /** callplane: the region whose queue this worker serves (upstream learns it from ConnectOnce). */
  NVCF_REGION: z
    .string()
    .regex(/^[a-z0-9][a-z0-9-]*$/)
    .default("local"),
  /** callplane: names under this domain whose first label is a dashed IPv4 resolve to that address. */
  NVCF_SERVICE_DOMAIN: z.string().default("nvcf.svc.cluster.local"),
  /** callplane: static name map, `name=address,...` (like curl --resolve), for names no DNS serves. */
  CALLPLANE_WORKER_HOST_MAP: hostMap,
  CALLPLANE_KEEPALIVE_SECONDS: z.coerce.number().positive().default(10),
  /** callplane: small answers to callplane's replicas over NATS instead of POST request-attach. */
  CALLPLANE_ANSWER_OVER_NATS: z
    .enum(["true", "false"])
    .default("true")
    .transform((v) => v === "true"),
  // callplane: an inference answer whose body stops for this long is cut (0: never)
  CALLPLANE_INFERENCE_IDLE_SECONDS: z.coerce.number().min(0).default(300),
  CALLPLANE_ACK_WAIT_SECONDS: z.coerce.number().positive().default(30),
  /** callplane: how long a gRPC session waits for a tunnel to come back after its last one closed. */
  CALLPLANE_SESSION_RECONNECT_WAIT_SECONDS: z.coerce.number().min(0).default(30),
  CALLPLANE_STREAM_MAX_MESSAGES: int(100_000, 1),
  CALLPLANE_STREAM_MAX_MESSAGE_BYTES: int(6 * 1024 * 1024, 1024, 8 * 1024 * 1024),
  CALLPLANE_STREAM_REPLICAS: int(1, 1, 5),
  CALLPLANE_LOG_LEVEL: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
});

export type WorkerEnv = z.infer<typeof envSchema>;

export interface WorkerConfig {
  natsUrl: string;
  /** How the worker proves itself to NATS: the shared nkey, or its own identity token file. */
  natsAuth: { kind: "nkey"; seed: string } | { kind: "token"; tokenFile: string; account: string };
  natsCaPem: string;
  identitySource: string;
  functionId: string;
  functionVersionId: string;
  functionName: string;
  ncaId: string;
  instanceId: string;
  instanceType: string;
  gpuName: string;
  region: string;
  inference: { host: string; port: number };
  health: {
    path: string;
    port: number;
    protocol: "HTTP" | "gRPC";
    timeoutMs: number;
    expectedStatus: number;
    readyTimeoutMs: number;
  };
  concurrency: number;
  healthListen: { host: string; port: number };
  responseDir: string;
  proxyCaPem: string;
  serviceDomain: string;
  hostMap: Map<string, string>;
  keepAliveMs: number;
  /** Small answers go over NATS where the replica takes them (nats-answer.ts). */
  answerOverNats: boolean;
  /** How long an inference answer's body may stop before the worker cuts it (0: never). */
  inferenceIdleMs: number;
  ackWaitSeconds: number;
  sessionReconnectWaitMs: number;
  streamMaxMessages: number;
  streamMaxMessageBytes: number;
  streamReplicas: number;
  logLevel: WorkerEnv["CALLPLANE_LOG_LEVEL"];
  /** Where its spans go (CALLPLANE_TRACING_*, set by the compute agent from observability.tracing); undefined: off. */
  tracing: TracingSettings | undefined;
}

/** PT10S, PT30M, PT1H30M → milliseconds. */
export function isoDurationMs(text: string): number {
  const m = /^PT(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?$/.exec(text);
  if (!m || text === "PT") throw new Error(`"${text}" is not an ISO-8601 duration such as PT10S`);
  return ((Number(m[1] ?? 0) * 60 + Number(m[2] ?? 0)) * 60 + Number(m[3] ?? 0)) * 1000;
}

/** A PEM variable plus the PEM files its _FILE sibling lists (colon-separated). */
function proxyCa(pem: string, files: string, name = "NVCF_PROXY_CA_FILE"): string {
  const parts = pem.trim() ? [pem.trim()] : [];
  for (const f of files.split(":").filter(Boolean)) {
    try {
      parts.push(readFileSync(f, "utf8").trim());
    } catch (err) {
      throw new ConfigError("worker environment", [`${name}: cannot read ${f}: ${(err as Error).message}`]);
    }
  }
  return parts.join("\n");
}

export function workerConfigFromEnv(env: NodeJS.ProcessEnv = process.env): WorkerConfig {
  const r = envSchema.safeParse(env);
  if (!r.success)
    throw new ConfigError(
      "worker environment",
      r.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`),
    );
  const e = r.data;
  let healthTimeout: number;
  let readyTimeout: number;
  try {
    healthTimeout = isoDurationMs(e.INFERENCE_HEALTH_TIMEOUT);
    readyTimeout = isoDurationMs(e.INFERENCE_READY_TIMEOUT);
  } catch (err) {
    throw new ConfigError("worker environment", [(err as Error).message]);
  }
  parseHostPort(formatHostPort({ host: e.HEALTH_HOST, port: Number(e.HEALTH_PORT) }));
  let natsAuth: WorkerConfig["natsAuth"];
  if (e.NKEY_SEED) natsAuth = { kind: "nkey", seed: e.NKEY_SEED };
  else if (e.NVCF_TOKEN_FILE_PATH) {
    if (!e.INSTANCE_ID)
      throw new ConfigError("worker environment", [
        "INSTANCE_ID: must be set when the worker authenticates with its identity token (NVCF_TOKEN_FILE_PATH): its NATS inbox is bound to it",
      ]);
    natsAuth = { kind: "token", tokenFile: e.NVCF_TOKEN_FILE_PATH, account: e.NVCF_NATS_ACCOUNT };
  } else
    throw new ConfigError("worker environment", [
      "NKEY_SEED, NVCF_TOKEN_FILE_PATH: the worker has no NATS credentials; the compute agent sets one of them (nkey or token mode, nats.workerAuth)",
    ]);
  let tracing: TracingSettings | undefined;
  try {
    tracing = tracingFromEnv(env);
  } catch (err) {
    throw new ConfigError("worker environment", [(err as Error).message]);
  }
  const natsCaPem = proxyCa(e.NVCF_NATS_CA_PEM, e.NVCF_NATS_CA_FILE, "NVCF_NATS_CA_FILE");
  if (!natsCaPem)
    throw new ConfigError("worker environment", [
      "NVCF_NATS_CA_PEM, NVCF_NATS_CA_FILE: the worker needs the CA of the NATS server's certificate (NATS requires TLS)",
    ]);
  return {
    natsUrl: e.NVCF_FQDN_NATS,
    natsAuth,
    natsCaPem,
    identitySource: e.NVCF_IDENTITY_SOURCE,
    functionId: e.FUNCTION_ID,
    functionVersionId: e.FUNCTION_VERSION_ID,
    functionName: e.FUNCTION_NAME,
    ncaId: e.NCA_ID,
    instanceId: e.INSTANCE_ID,
    instanceType: e.INSTANCE_TYPE,
    gpuName: e.GPU_NAME,
    region: e.NVCF_REGION,
    inference: { host: e.INFERENCE_HOST, port: e.INFERENCE_PORT },
    health: {
      path: e.INFERENCE_HEALTH_ENDPOINT,
      port: e.INFERENCE_HEALTH_PORT ?? e.INFERENCE_PORT,
      protocol: e.INFERENCE_HEALTH_PROTOCOL.toLowerCase() === "grpc" ? "gRPC" : "HTTP",
      timeoutMs: healthTimeout,
      expectedStatus: e.INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE,
      readyTimeoutMs: readyTimeout,
    },
    concurrency: e.MAX_REQUEST_CONCURRENCY,
    healthListen: { host: e.HEALTH_HOST, port: e.HEALTH_PORT },
    responseDir: e.BASE_RESPONSE_DIR,
    proxyCaPem: proxyCa(e.NVCF_PROXY_CA_PEM, e.NVCF_PROXY_CA_FILE),
    serviceDomain: e.NVCF_SERVICE_DOMAIN.toLowerCase(),
    hostMap: e.CALLPLANE_WORKER_HOST_MAP,
    keepAliveMs: e.CALLPLANE_KEEPALIVE_SECONDS * 1000,
    answerOverNats: e.CALLPLANE_ANSWER_OVER_NATS,
    inferenceIdleMs: e.CALLPLANE_INFERENCE_IDLE_SECONDS * 1000,
    ackWaitSeconds: e.CALLPLANE_ACK_WAIT_SECONDS,
    sessionReconnectWaitMs: e.CALLPLANE_SESSION_RECONNECT_WAIT_SECONDS * 1000,
    streamMaxMessages: e.CALLPLANE_STREAM_MAX_MESSAGES,
    streamMaxMessageBytes: e.CALLPLANE_STREAM_MAX_MESSAGE_BYTES,
    streamReplicas: e.CALLPLANE_STREAM_REPLICAS,
    logLevel: e.CALLPLANE_LOG_LEVEL,
    tracing,
  };
}
