// Supervision of child processes, shared by the local stack and the compute agent's local backend.
// A child is started with its output going to its own log file and, when it is one of ours, a typed
// control channel (Node IPC) on which it reports `ready` or `failed`. Stopping asks politely
// (shutdown message and SIGTERM), then SIGKILLs after a grace period. A child that exits on its own
// is restarted with exponential backoff unless told otherwise.
import { spawn, type ChildProcess } from "node:child_process";
import { EventEmitter } from "node:events";
import { closeSync, mkdirSync, openSync } from "node:fs";
import { dirname } from "node:path";
import { parseChildMessage, type ChildMessage } from "./control.js";

export interface ChildSpec {
  name: string;
  command: string;
  args: string[];
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** Runs it as this user and group (the supervisor must be root); its own otherwise. */
  uid?: number;
  gid?: number;
  /** stdout and stderr are appended here. */
  logFile: string;
  /** The child speaks the control channel (it is a callplane service). */
  ipc: boolean;
  /** How long to wait for `ready` on the control channel. */
  readyTimeoutMs?: number;
  restart?: { enabled: boolean; initialMs: number; maxMs: number };
}

export type ChildState = "starting" | "running" | "backoff" | "stopping" | "stopped" | "failed";

export class ChildStartError extends Error {
  constructor(
    readonly child: string,
    message: string,
    readonly code: string,
  ) {
    super(message);
    this.name = "ChildStartError";
  }
}

export interface ExitInfo {
  code: number | null;
  signal: NodeJS.Signals | null;
  expected: boolean;
}

/**
 * Events: "ready" (ChildMessage & {type:"ready"}), "message" (ChildMessage), "exit" (ExitInfo),
 * "restart" ({ inMs, attempt }).
 */
export class SupervisedChild extends EventEmitter {
  state: ChildState = "stopped";
  process: ChildProcess | undefined;
  readyInfo: (ChildMessage & { type: "ready" }) | undefined;
  private stopRequested = false;
  private attempt = 0;
  private restartTimer: NodeJS.Timeout | undefined;
  private startedAt = 0;

  constructor(readonly spec: ChildSpec) {
    super();
  }

  get pid(): number | undefined {
    return this.process?.pid;
  }

  /** Starts the child; resolves when it is ready (IPC children) or spawned (others). */
  start(): Promise<void> {
    this.stopRequested = false;
    return this.spawnOnce();
  }

  private spawnOnce(): Promise<void> {
    const { spec } = this;
    mkdirSync(dirname(spec.logFile), { recursive: true });
    const fd = openSync(spec.logFile, "a");
    this.state = "starting";
    this.readyInfo = undefined;
    this.startedAt = Date.now();
    let child: ChildProcess;
    try {
      child = spawn(spec.command, spec.args, {
        cwd: spec.cwd,
        ...(spec.uid !== undefined ? { uid: spec.uid } : {}),
        ...(spec.gid !== undefined ? { gid: spec.gid } : {}),
        env: spec.env ?? process.env,
        stdio: spec.ipc ? ["ignore", fd, fd, "ipc"] : ["ignore", fd, fd],
        serialization: "json",
      });
    } finally {
      closeSync(fd);
    }
    this.process = child;
    return new Promise<void>((resolve, reject) => {
      let settled = false;
      const settle = (err?: Error) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        if (err) reject(err);
        else resolve();
      };
      const timer = setTimeout(() => {
        if (!spec.ipc) return;
        settle(
          new ChildStartError(
            spec.name,
            `${spec.name} did not report ready within ${Math.round((spec.readyTimeoutMs ?? 30_000) / 1000)} s; see ${spec.logFile}`,
            "READY_TIMEOUT",
          ),
        );
        child.kill("SIGKILL");
      }, spec.readyTimeoutMs ?? 30_000);
      child.once("spawn", () => {
        if (!spec.ipc) {
          this.state = "running";
          settle();
        }
      });
      child.once("error", (err) =>
        settle(
          new ChildStartError(
            spec.name,
            `cannot start ${spec.name} (${spec.command}): ${err.message}`,
            "SPAWN",
          ),
        ),
      );
      child.on("message", (raw) => {
        const msg = parseChildMessage(raw);
        if ("invalid" in msg) {
          this.emit("message", {
            type: "status",
            service: spec.name,
            state: "invalid-message",
            detail: msg.invalid,
          } satisfies ChildMessage);
          return;
        }
        this.emit("message", msg);
        if (msg.type === "ready") {
          this.state = "running";
          this.readyInfo = msg;
          this.attempt = 0;
          this.emit("ready", msg);
          settle();
        } else if (msg.type === "failed") {
          settle(new ChildStartError(spec.name, msg.message, msg.code));
        }
      });
      child.once("exit", (code, signal) => {
        const expected = this.stopRequested;
        this.process = undefined;
        settle(
          new ChildStartError(
            spec.name,
            `${spec.name} exited during start (${signal ?? `code ${code}`}); see ${spec.logFile}`,
            "EXITED",
          ),
        );
        this.emit("exit", { code, signal, expected } satisfies ExitInfo);
        if (expected || !spec.restart?.enabled) {
          this.state = expected ? "stopped" : "failed";
          return;
        }
        // a child that ran a while before dying starts its backoff afresh
        if (Date.now() - this.startedAt > 60_000) this.attempt = 0;
        const inMs = Math.min(spec.restart.maxMs, spec.restart.initialMs * 2 ** this.attempt);
        this.attempt++;
        this.state = "backoff";
        this.emit("restart", { inMs, attempt: this.attempt });
        this.restartTimer = setTimeout(() => {
          this.restartTimer = undefined;
          if (this.stopRequested) return;
          this.spawnOnce().catch(() => undefined);
        }, inMs);
      });
    });
  }

  /** Asks the child to stop, then kills it after graceMs. Resolves once it has exited. */
  async stop(graceMs: number, opts: { drainDelay?: boolean } = {}): Promise<void> {
    this.stopRequested = true;
    if (this.restartTimer) {
      clearTimeout(this.restartTimer);
      this.restartTimer = undefined;
    }
    const child = this.process;
    if (!child || child.exitCode !== null || child.signalCode !== null) {
      this.state = "stopped";
      return;
    }
    this.state = "stopping";
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    // our own services drain on the shutdown message; a SIGTERM on top would read as a second,
    // impatient request and cut the drain short
    if (this.spec.ipc && child.connected)
      child.send({
        type: "shutdown",
        graceMs,
        ...(opts.drainDelay === false ? { drainDelay: false } : {}),
      });
    else child.kill("SIGTERM");
    const killer = setTimeout(() => child.kill("SIGKILL"), graceMs);
    await exited;
    clearTimeout(killer);
    this.state = "stopped";
  }

  /** Kills now, without waiting (for process exit handlers). */
  killNow(): void {
    this.stopRequested = true;
    if (this.restartTimer) clearTimeout(this.restartTimer);
    this.process?.kill("SIGKILL");
  }
}
