// The two processes of one local instance: its inference server and the worker agent beside it,
// both supervised (restarted with backoff when they die), with the instance's status following
// them: ERRORED when one dies, ACTIVE when the worker is ready, and ACTIVE again once a restarted
// inference server answers its health check.
import { connect } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import type { InstanceStatus } from "../../lib/instance-status.js";
import { SupervisedChild, type ChildSpec } from "../../lib/process/index.js";
import { distRoot } from "../../lib/paths.js";
import type { DesiredDeployment, InstanceEnvironment } from "./deployment.js";
import type { InstanceFolders } from "./instance-folders.js";
import { workerEnvironment } from "./worker-env.js";

/** The instance's status, as the processes read and set it. */
export interface StatusReport {
  status(): InstanceStatus;
  set(status: InstanceStatus, message?: string): void;
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

export class InstanceProcesses {
  private inference: SupervisedChild | undefined;
  private worker: SupervisedChild | undefined;
  private recovery: AbortController | undefined;

  constructor(
    private readonly deployment: DesiredDeployment,
    private readonly slot: number,
    private readonly host: string,
    private readonly env: InstanceEnvironment,
    private readonly report: StatusReport,
  ) {}

  /** Starts both processes for the instance `instanceId` (its current id). */
  spawn(
    cmd: { command: string; args: string[]; env: Record<string, string> },
    folders: InstanceFolders,
    tokenFile: string,
    instanceId: string,
  ): void {
    const d = this.deployment;
    const logs = join(this.env.dataDir, "logs", "instances");
    const restart = { enabled: true, ...this.env.restart };
    const user = this.env.user();
    // the server gets nothing of the agent's: its own folders, its own user (when the agent is
    // root), and no variable of the agent's environment but PATH; its log is a file descriptor
    // the agent opened, so the log folder stays the agent's
    this.inference = new SupervisedChild({
      name: `${d.name}-${this.slot}-inference`,
      command: cmd.command,
      args: cmd.args,
      env: {
        PATH: process.env.PATH ?? "/usr/bin:/bin",
        HOME: folders.home,
        TMPDIR: folders.home,
        ...cmd.env,
      },
      cwd: folders.home,
      ...(user.switched ? { uid: user.uid, gid: user.gid } : {}),
      logFile: join(logs, `${d.name}-${this.slot}-inference.log`),
      ipc: false,
      restart,
    } satisfies ChildSpec);
    this.worker = new SupervisedChild({
      name: `${d.name}-${this.slot}-worker`,
      command: process.execPath,
      args: [join(distRoot, "src", "services", "worker", "main.js")],
      env: {
        PATH: process.env.PATH ?? "/usr/bin:/bin",
        ...workerEnvironment(d, this.env, {
          instanceId,
          tokenFile,
          identitySource: this.env.identity.source,
          responsesDir: folders.responses,
        }),
        INFERENCE_HOST: this.host,
        HEALTH_HOST: this.host,
        ...this.env.workerNatsEnv(),
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
        this.report.set(
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
        this.report.set(
          "ERRORED",
          `the worker agent exited (${info.signal ?? `code ${info.code}`}); restarting it. See ${this.worker!.spec.logFile}`,
        );
    });
    this.worker.on("message", (m: { type: string; message?: string }) => {
      if (m.type === "failed") this.report.set("ERRORED", m.message);
    });
    this.worker.on("ready", () => this.report.set("ACTIVE"));
    this.inference.on("ready", () => undefined);
    this.inference.start().catch((err: unknown) => this.report.set("ERRORED", (err as Error).message));
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
        if (this.report.status() === "ERRORED") this.report.set("ACTIVE");
        return;
      }
    })();
  }

  /** Stops waiting for a restarted inference server to recover. */
  stopRecovery(): void {
    this.recovery?.abort();
  }

  /** Drains the worker (it finishes in-flight requests), then stops the inference server. */
  async stop(graceMs: number): Promise<void> {
    await this.worker?.stop(graceMs);
    await this.inference?.stop(graceMs);
  }

  /** The process ids of the instance's two processes, when they run (read-only, for tests and diagnostics). */
  get pids(): { inference: number | undefined; worker: number | undefined } {
    return { inference: this.inference?.pid, worker: this.worker?.pid };
  }

  killNow(): void {
    this.worker?.killNow();
    this.inference?.killNow();
  }
}
