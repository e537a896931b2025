// The local backend: a function instance is two processes on this machine, the inference server
// and a worker agent beside it, on the instance's own loopback address (like a pod's IP), so that
// instances never collide on ports. Both are supervised (restarted with backoff when they die) and
// never detached: stopping the agent stops them.
import { randomUUID } from "node:crypto";
import { connect } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { request } from "undici";
import type { Logger } from "../../lib/log.js";
import { SupervisedChild, type ChildSpec } from "../../lib/supervise.js";
import type { InstanceStatus } from "../../lib/instance-status.js";
import { InstanceSecrets, type InstanceSecretsConfig } from "./secrets.js";
import { InstanceIdentity, type IdentityProvider } from "./identity.js";

const distRoot = join(fileURLToPath(import.meta.url), "..", "..", "..", "..");
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
}

/** The command that runs a function's inference server on the local backend, or why there is none. */
export function inferenceCommand(
  d: DesiredDeployment,
  host: string,
  secretsEnv: Record<string, string> = {},
): { command: string; args: string[]; env: Record<string, string> } | { error: string } {
  const image = d.spec.containerImage;
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
  if (image === "local/command") {
    if (!d.spec.containerArgs?.trim())
      return { error: "containerImage local/command needs the command to run in containerArgs" };
    // exec, so that signals reach the server itself and not a shell around it
    return { command: "/bin/sh", args: ["-c", `exec ${d.spec.containerArgs}`], env };
  }
  return {
    error: `containerImage "${image}" cannot run on the local compute backend; use ${EXAMPLE_IMAGES.join(", ")}, ${GRPC_EXAMPLE_IMAGE}, or local/command with the command in containerArgs`,
  };
}

function canConnect(host: string, port: number, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect({ host, port, signal, timeout: 5000 });
    const done = (ok: boolean) => {
      socket.destroy();
      resolve(ok);
    };
    socket.once("connect", () => done(true));
    socket.once("error", () => done(false));
    socket.once("timeout", () => done(false));
  });
}

export class LocalInstance {
  private id = randomUUID();
  /** Its id; a start attempt after a failed one is a new instance with a new id (a revoked identity stays revoked). */
  get instanceId(): string {
    return this.id;
  }
  status: InstanceStatus = "STARTING";
  message: string | undefined;
  readonly createdAt = new Date().toISOString();
  updatedAt = this.createdAt;
  private inference: SupervisedChild | undefined;
  private worker: SupervisedChild | undefined;
  private recovery: AbortController | undefined;
  private stopped = false;
  private secrets: InstanceSecrets | undefined;
  private refreshing: Promise<void> | undefined;
  private wantedRevision = 0;
  private identity: InstanceIdentity | undefined;
  private starting: AbortController | undefined;

  constructor(
    readonly deployment: DesiredDeployment,
    readonly slot: number,
    readonly host: string,
    private readonly env: InstanceEnvironment,
    private readonly logger: Logger,
    private readonly onChange: () => void,
  ) {}

  private set(status: InstanceStatus, message?: string): void {
    if (this.status === "TERMINATED") return;
    if (this.status === status && this.message === message) return;
    this.status = status;
    this.message = message;
    this.updatedAt = new Date().toISOString();
    this.logger.info(
      { instanceId: this.instanceId, function: this.deployment.name, host: this.host, status, message },
      `instance ${status}`,
    );
    this.onChange();
  }

  /** The revision of the secrets this instance's file holds (-1: none written yet). */
  get secretsRevision(): number {
    return this.secrets?.revision ?? -1;
  }

  /**
   * Writes the function's secrets into the instance's own folder before its server starts. Until
   * the API answers, the instance stays STARTING (and says why); it is never started without them.
   */
  private async prepareSecrets(): Promise<Record<string, string>> {
    const cfg = this.env.secrets;
    if (!cfg) return {};
    const s = new InstanceSecrets(cfg, this.instanceId);
    this.secrets = s;
    this.wantedRevision = this.deployment.secretsRevision ?? 0;
    let delay = 500;
    while (!this.stopped) {
      try {
        const fetched =
          this.wantedRevision === 0
            ? { revision: 0, values: {}, unreadable: [] }
            : await cfg.fetch(this.deployment.functionId, this.deployment.versionId);
        this.reportUnreadable(fetched.unreadable);
        s.write(fetched);
        if (this.message?.startsWith("waiting for")) this.set("STARTING");
        return s.env();
      } catch (err) {
        this.set(
          "STARTING",
          `waiting for the API to give the instance its secrets: ${(err as Error).message}`,
        );
        await sleep(delay);
        delay = Math.min(delay * 2, 10_000);
      }
    }
    return {};
  }

  private reportUnreadable(list: Array<{ name: string; code: string }>): void {
    if (list.length)
      this.logger.warn(
        { instanceId: this.instanceId, function: this.deployment.name, secrets: list.map((u) => u.name) },
        "some secrets of this version cannot be decrypted; the instance gets the others (see the API log)",
      );
  }

  /** A secret of the version changed: rewrite the running instance's file (not its environment). */
  refreshSecrets(revision: number): void {
    const cfg = this.env.secrets;
    if (!cfg || !this.secrets || this.stopped) return;
    this.wantedRevision = revision;
    if (this.refreshing || this.secrets.revision < 0 || this.secrets.revision === revision) return;
    this.refreshing = (async () => {
      try {
        const fetched = await cfg.fetch(this.deployment.functionId, this.deployment.versionId);
        if (this.stopped) return;
        this.reportUnreadable(fetched.unreadable);
        this.secrets!.write(fetched);
        this.logger.info(
          { instanceId: this.instanceId, function: this.deployment.name, revision: fetched.revision },
          "secrets file refreshed",
        );
      } catch (err) {
        this.logger.warn(
          { instanceId: this.instanceId, err: (err as Error).message },
          "could not refresh the instance's secrets; retrying at the next sync",
        );
      } finally {
        this.refreshing = undefined;
      }
    })();
  }

  /** The worker identifier, while the instance holds an identity (reported as WorkerAuth). */
  get workerIdentifier(): string | undefined {
    return this.status === "TERMINATED" ? undefined : this.identity?.workerIdentifier;
  }

  get tokenFile(): string | undefined {
    return this.identity?.tokenFile;
  }

  start(): void {
    const check = inferenceCommand(this.deployment, this.host);
    if ("error" in check) {
      this.set("ERRORED", check.error);
      return;
    }
    void this.prepareSecrets()
      .then((secretsEnv) => {
        if (!this.stopped) this.launch(secretsEnv);
      })
      .catch((err: unknown) =>
        this.set("ERRORED", `cannot write the instance's secrets: ${(err as Error).message}`),
      );
  }

  private launch(secretsEnv: Record<string, string>): void {
    const d = this.deployment;
    const cmd = inferenceCommand(d, this.host, secretsEnv);
    if ("error" in cmd) {
      this.set("ERRORED", cmd.error);
      return;
    }
    const ac = new AbortController();
    this.starting = ac;
    void this.provisionAndSpawn(cmd, ac.signal);
  }

  /**
   * Provisions the identity, then starts the processes; a failure to provision starts nothing and
   * is retried with backoff, and a failure after provisioning undoes it before the retry.
   */
  private async provisionAndSpawn(
    cmd: { command: string; args: string[]; env: Record<string, string> },
    signal: AbortSignal,
  ): Promise<void> {
    const d = this.deployment;
    const base = join(this.env.dataDir, "instances", `${d.name}-${this.slot}`);
    let delay = this.env.restart.initialMs;
    while (!signal.aborted) {
      const identity = new InstanceIdentity(
        this.env.identity,
        {
          instanceId: this.instanceId,
          functionId: d.functionId,
          versionId: d.versionId,
          deploymentId: d.deploymentId,
        },
        join(base, "identity"),
        this.logger,
      );
      try {
        await identity.provision();
        if (signal.aborted) {
          await identity.cleanup();
          return;
        }
        this.identity = identity;
        this.spawn(cmd, base, identity.tokenFile);
        return;
      } catch (err) {
        this.identity = undefined;
        await identity.cleanup();
        this.set(
          "ERRORED",
          `could not provision the worker identity (${this.env.identity.source}), so no worker was started: ${(err as Error).message}; retrying`,
        );
      }
      await sleep(delay, undefined, { signal }).catch(() => undefined);
      if (signal.aborted) return;
      this.id = randomUUID();
      delay = Math.min(delay * 2, this.env.restart.maxMs);
    }
  }

  private spawn(
    cmd: { command: string; args: string[]; env: Record<string, string> },
    base: string,
    tokenFile: string,
  ): void {
    const d = this.deployment;
    const logs = join(this.env.dataDir, "logs", "instances");
    const restart = { enabled: true, ...this.env.restart };
    this.inference = new SupervisedChild({
      name: `${d.name}-${this.slot}-inference`,
      command: cmd.command,
      args: cmd.args,
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/", ...cmd.env },
      cwd: process.cwd(),
      logFile: join(logs, `${d.name}-${this.slot}-inference.log`),
      ipc: false,
      restart,
    } satisfies ChildSpec);
    const spec = d.specs[0];
    this.worker = new SupervisedChild({
      name: `${d.name}-${this.slot}-worker`,
      command: process.execPath,
      args: [join(distRoot, "src", "services", "worker", "main.js")],
      env: {
        PATH: process.env.PATH ?? "/usr/bin:/bin",
        NVCF_FQDN_NATS: this.env.natsUrl,
        FUNCTION_ID: d.functionId,
        FUNCTION_VERSION_ID: d.versionId,
        FUNCTION_NAME: d.name,
        NCA_ID: d.ncaId,
        INSTANCE_ID: this.instanceId,
        INSTANCE_TYPE: spec.instanceType,
        GPU_NAME: spec.gpu,
        INFERENCE_HOST: this.host,
        INFERENCE_PORT: String(d.spec.inferencePort),
        INFERENCE_URL: d.spec.inferenceUrl,
        INFERENCE_HEALTH_ENDPOINT: d.spec.health.uri,
        INFERENCE_HEALTH_PORT: String(d.spec.health.port),
        INFERENCE_HEALTH_PROTOCOL: d.spec.health.protocol,
        INFERENCE_HEALTH_TIMEOUT: d.spec.health.timeout,
        INFERENCE_HEALTH_EXPECTED_RESPONSE_CODE: String(d.spec.health.expectedStatusCode),
        MAX_REQUEST_CONCURRENCY: String(spec.maxRequestConcurrency),
        NVCF_TOKEN_FILE_PATH: tokenFile,
        NVCF_IDENTITY_SOURCE: this.env.identity.source,
        NVCF_NATS_CA_PEM: this.env.natsCaPem,
        ...this.env.workerNatsEnv(),
        HEALTH_HOST: this.host,
        HEALTH_PORT: "8080",
        BASE_RESPONSE_DIR: join(base, "responses"),
        NVCF_REGION: this.env.region,
        NVCF_SERVICE_DOMAIN: this.env.serviceDomain,
        CALLPLANE_KEEPALIVE_SECONDS: String(this.env.keepAliveSeconds),
        CALLPLANE_INFERENCE_IDLE_SECONDS: String(this.env.inferenceIdleSeconds),
        CALLPLANE_ACK_WAIT_SECONDS: String(this.env.ackWaitSeconds),
        CALLPLANE_STREAM_MAX_MESSAGES: String(this.env.streamMaxMessages),
        CALLPLANE_STREAM_MAX_MESSAGE_BYTES: String(this.env.streamMaxMessageBytes),
        CALLPLANE_STREAM_REPLICAS: String(this.env.streamReplicas),
        CALLPLANE_LOG_LEVEL: this.env.logLevel,
        ...this.env.workerExtraEnv,
      },
      cwd: process.cwd(),
      logFile: join(logs, `${d.name}-${this.slot}-worker.log`),
      ipc: true,
      // the worker reports ready only once the inference server is healthy, which may take long
      readyTimeoutMs: 35 * 60_000,
      restart,
    });
    this.inference.on("exit", (info: { code: number | null; signal: string | null; expected: boolean }) => {
      if (!info.expected) {
        this.set(
          "ERRORED",
          `the inference server exited (${info.signal ?? `code ${info.code}`}); restarting it. See ${this.inference!.spec.logFile}`,
        );
        // Fix: the worker stays up and reports `ready` only once, so nothing used to bring the
        // instance back to ACTIVE after the restarted server came up: it stayed ERRORED for good.
        this.watchRecovery();
      }
    });
    this.worker.on("exit", (info: { code: number | null; signal: string | null; expected: boolean }) => {
      if (!info.expected)
        this.set(
          "ERRORED",
          `the worker agent exited (${info.signal ?? `code ${info.code}`}); restarting it. See ${this.worker!.spec.logFile}`,
        );
    });
    this.worker.on("message", (m: { type: string; message?: string }) => {
      if (m.type === "failed") this.set("ERRORED", m.message);
    });
    this.worker.on("ready", () => this.set("ACTIVE"));
    this.inference.on("ready", () => undefined);
    this.inference.start().catch((err: unknown) => this.set("ERRORED", (err as Error).message));
    this.worker.start().catch(() => undefined);
  }

  /**
   * After the inference server died: waits until its replacement answers its health check (and
   * the worker is up), then reports the instance ACTIVE again.
   */
  private watchRecovery(): void {
    if (this.recovery) return;
    const ac = new AbortController();
    this.recovery = ac;
    const h = this.deployment.spec.health;
    const healthy = async (): Promise<boolean> => {
      if (this.inference?.state !== "running" || this.worker?.state !== "running") return false;
      if (h.protocol.toLowerCase() !== "http") return await canConnect(this.host, h.port, ac.signal);
      try {
        const res = await request(`http://${this.host}:${h.port}${h.uri}`, {
          signal: ac.signal,
          headersTimeout: 5000,
          bodyTimeout: 5000,
        });
        await res.body.dump();
        return res.statusCode === h.expectedStatusCode;
      } catch {
        return false;
      }
    };
    void (async () => {
      while (!ac.signal.aborted) {
        await sleep(250, undefined, { signal: ac.signal }).catch(() => undefined);
        if (ac.signal.aborted || !(await healthy()) || ac.signal.aborted) continue;
        this.recovery = undefined;
        if (this.status === "ERRORED") this.set("ACTIVE");
        return;
      }
    })();
  }

  /** Drains the worker (it finishes in-flight requests), then stops the inference server. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.recovery?.abort();
    this.starting?.abort();
    await this.worker?.stop(this.env.stopGraceMs);
    await this.inference?.stop(this.env.stopGraceMs);
    await this.refreshing;
    this.secrets?.remove();
    await this.identity?.cleanup();
    this.set("TERMINATED");
  }

  /** The process ids of the instance's two processes, when they run (read-only, for tests and diagnostics). */
  get pids(): { inference: number | undefined; worker: number | undefined } {
    return { inference: this.inference?.pid, worker: this.worker?.pid };
  }

  killNow(): void {
    this.stopped = true;
    this.recovery?.abort();
    this.starting?.abort();
    this.worker?.killNow();
    this.inference?.killNow();
    try {
      this.secrets?.remove();
    } catch {
      // the agent is going away; removeLeftovers() cleans up at its next start
    }
  }
}
