// What the local backend runs for a deployment: the desired deployment as the API gives it, the
// environment every instance shares, and the command that runs the function's inference server
// (an example server of this repository, or the function's own command).
import { join } from "node:path";
import { distRoot } from "../../lib/paths.js";
import { LOCAL_COMMAND_IMAGE, localImageRefusal } from "../../lib/local-images.js";
import type { IdentityProvider } from "./identity.js";
import type { InstanceUser } from "./instance-user.js";
import type { InstanceSecretsConfig } from "./secrets.js";

/** The root of the built tree (dist/), where the example servers and the worker agent are. */
export const EXAMPLE_IMAGES = [
  "local/echo",
  "local/sse",
  "local/slow",
  "local/large",
  "local/example",
] as const;
/** The example gRPC server (examples/grpc-server.ts): callplane.examples.Echo and grpc.health.v1. */
export const GRPC_EXAMPLE_IMAGE = "local/grpc-echo";

export interface DesiredDeployment {
  deploymentId: string;
  functionId: string;
  versionId: string;
  name: string;
  ncaId: string;
  specs: Array<{
    gpu: string;
    instanceType: string;
    backend?: string;
    /** The clusters (by id) it may run on; absent or empty: any that offers its instance type. */
    clusters?: string[];
    minInstances: number;
    maxInstances: number;
    maxRequestConcurrency: number;
  }>;
  spec: {
    inferenceUrl: string;
    inferencePort: number;
    containerImage: string;
    containerArgs?: string;
    containerEnvironment: Array<{ key: string; value: string }>;
    health: { protocol: string; uri: string; port: number; timeout: string; expectedStatusCode: number };
  };
  /** Changes whenever a secret of the version is written or deleted; 0: it has none. */
  secretsRevision?: number;
}

export interface InstanceEnvironment {
  natsUrl: string;
  region: string;
  serviceDomain: string;
  dataDir: string;
  keepAliveSeconds: number;
  /** worker.inferenceIdleSeconds, handed to workers. */
  inferenceIdleSeconds: number;
  ackWaitSeconds: number;
  streamMaxMessages: number;
  streamMaxMessageBytes: number;
  streamReplicas: number;
  stopGraceMs: number;
  restart: { initialMs: number; maxMs: number };
  logLevel: string;
  /** Extra environment for workers (callback proxy CA, static name map). */
  workerExtraEnv: Record<string, string>;
  /** Where and how instances get their function's secrets; without it, they get none. */
  secrets?: InstanceSecretsConfig;
  /** PEM of the CA of the NATS server's certificate, handed to workers. */
  natsCaPem: string;
  /** Where instance identities come from (provisioned before any worker starts). */
  identity: IdentityProvider;
  /** What the API said workers get to reach NATS (NKEY_SEED or NVCF_NATS_ACCOUNT), at the last sync. */
  workerNatsEnv: () => Record<string, string>;
  /** compute.local.allowCommand: whether local/command (any command line) may run. */
  allowCommand: boolean;
  /** The user inference servers run as (resolved when the agent starts). */
  user: () => InstanceUser;
  /** Where each instance gets its working and output folders (instance-folders.ts). */
  instancesRoot: string;
}

/** What the agent's options leave to the backend to fill in. */
export type BackendFilled =
  "identity" | "workerNatsEnv" | "secrets" | "allowCommand" | "user" | "instancesRoot";

/** The command that runs a function's inference server on the local backend, or why there is none. */
export function inferenceCommand(
  d: DesiredDeployment,
  host: string,
  allowCommand: boolean,
  secretsEnv: Record<string, string> = {},
): { command: string; args: string[]; env: Record<string, string> } | { error: string } {
  const image = d.spec.containerImage;
  // the API refuses these too; a deployment that reached the agent some other way never runs
  const refused = localImageRefusal(d.spec, allowCommand);
  if (refused) return { error: `not started: ${refused.message}` };
  const env: Record<string, string> = { INFERENCE_HOST: host, INFERENCE_PORT: String(d.spec.inferencePort) };
  for (const { key, value } of d.spec.containerEnvironment) env[key] = value;
  // secrets (and where their file is) after the function's own environment: they win
  Object.assign(env, secretsEnv);
  if ((EXAMPLE_IMAGES as readonly string[]).includes(image)) {
    return {
      command: process.execPath,
      args: [
        join(distRoot, "examples", "inference-server.js"),
        "--listen",
        `${host}:${d.spec.inferencePort}`,
      ],
      env,
    };
  }
  if (image === GRPC_EXAMPLE_IMAGE) {
    return {
      command: process.execPath,
      args: [join(distRoot, "examples", "grpc-server.js"), "--listen", `${host}:${d.spec.inferencePort}`],
      env,
    };
  }
  if (image === LOCAL_COMMAND_IMAGE) {
    if (!d.spec.containerArgs?.trim())
      return { error: "containerImage local/command needs the command to run in containerArgs" };
    // exec, so that signals reach the server itself and not a shell around it
    return { command: "/bin/sh", args: ["-c", `exec ${d.spec.containerArgs}`], env };
  }
  return {
    error: `containerImage "${image}" cannot run on the local compute backend; use ${EXAMPLE_IMAGES.join(", ")}, ${GRPC_EXAMPLE_IMAGE}, or local/command with the command in containerArgs`,
  };
}
