// The worker agent's environment, the same on every backend: what it serves (function, version,
// instance), how it reaches its inference server and NATS, and the plane's settings. Each backend
// adds where things are on it: the local one the instance's loopback address and token file, a pod
// its IP (from the downward API), its projected token and its NATS credential from a Secret.
import type { DesiredDeployment, InstanceEnvironment } from "./deployment.js";

/** The parts of the instance environment every worker gets. */
export type WorkerSettings = Pick<
  InstanceEnvironment,
  | "natsUrl"
  | "region"
  | "serviceDomain"
  | "keepAliveSeconds"
  | "inferenceIdleSeconds"
  | "ackWaitSeconds"
  | "streamMaxMessages"
  | "streamMaxMessageBytes"
  | "streamReplicas"
  | "logLevel"
  | "workerExtraEnv"
  | "natsCaPem"
>;

/**
 * The port the worker's health server listens on: 8080, unless the function's inference or health
 * port is 8080 (they share the address: a pod's IP, or a local instance's), then 8081, and so on.
 */
export function workerHealthPort(d: DesiredDeployment): number {
  const taken = new Set([d.spec.inferencePort, d.spec.health.port]);
  let port = 8080;
  while (taken.has(port)) port++;
  return port;
}

/**
 * The worker's variables, without the addresses (INFERENCE_HOST, HEALTH_HOST) and the NATS
 * credential (NKEY_SEED or NVCF_NATS_ACCOUNT), which each backend sets its own way.
 */
export function workerEnvironment(
  d: DesiredDeployment,
  env: WorkerSettings,
  at: { instanceId: string; tokenFile: string; identitySource: string; responsesDir: string },
): Record<string, string> {
  const spec = d.specs[0];
  return {
    NVCF_FQDN_NATS: env.natsUrl,
    FUNCTION_ID: d.functionId,
    FUNCTION_VERSION_ID: d.versionId,
    FUNCTION_NAME: d.name,
    NCA_ID: d.ncaId,
    INSTANCE_ID: at.instanceId,
    INSTANCE_TYPE: spec.instanceType,
    GPU_NAME: spec.gpu,
    INFERENCE_PORT: String(d.spec.inferencePort),
    INFERENCE_URL: d.spec.inferenceUrl,
    INFERENCE_HEALTH_ENDPOINT: d.spec.health.uri,
    INFERENCE_HEALTH_PORT: String(d.spec.health.port),
    INFERENCE_HEALTH_PROTOCOL: d.spec.health.protocol,
    INFERENCE_HEALTH_TIMEOUT: d.spec.health.timeout,
    INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE: String(d.spec.health.expectedStatusCode),
    MAX_REQUEST_CONCURRENCY: String(spec.maxRequestConcurrency),
    NVCF_TOKEN_FILE_PATH: at.tokenFile,
    NVCF_IDENTITY_SOURCE: at.identitySource,
    NVCF_NATS_CA_PEM: env.natsCaPem,
    HEALTH_PORT: String(workerHealthPort(d)),
    BASE_RESPONSE_DIR: at.responsesDir,
    NVCF_REGION: env.region,
    NVCF_SERVICE_DOMAIN: env.serviceDomain,
    CALLPLANE_KEEPALIVE_SECONDS: String(env.keepAliveSeconds),
    CALLPLANE_INFERENCE_IDLE_SECONDS: String(env.inferenceIdleSeconds),
    CALLPLANE_ACK_WAIT_SECONDS: String(env.ackWaitSeconds),
    CALLPLANE_STREAM_MAX_MESSAGES: String(env.streamMaxMessages),
    CALLPLANE_STREAM_MAX_MESSAGE_BYTES: String(env.streamMaxMessageBytes),
    CALLPLANE_STREAM_REPLICAS: String(env.streamReplicas),
    CALLPLANE_LOG_LEVEL: env.logLevel,
    ...env.workerExtraEnv,
  };
}
