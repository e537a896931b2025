// Steady load for the fault suite, from a client we did not write: test/e2e/faults/load.py (Python's
// http.client, or Debian's python3-grpcio) as a child process. It runs until stop(), then reports
// every request it sent: answered with the right body, failed with a reason, answered wrongly, or
// unaccounted (sent and never settled: must be zero).
import { spawn } from "node:child_process";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { repoRoot } from "../../testkit/index.js";

export interface LoadResult {
  sent: number;
  answered: number;
  failed: number;
  wrong: number;
  unaccounted: number;
  /** Failures by reason: `503 SHUTTING_DOWN`, `UNAVAILABLE ...`, `ConnectionResetError`, ... */
  reasons: Record<string, number>;
  p50ms: number | null;
  p99ms: number | null;
  seconds: number;
  startedAtMs: number;
  /** When each failure happened, in seconds since the start (the first 1000). */
  failAt: number[];
}

export interface LoadProgress {
  sent: number;
  answered: number;
  failed: number;
  in_flight: number;
  t: number;
}

export interface LoadOptions {
  /** `name: value` headers (http) or `name=value` metadata (grpc). */
  headers?: string[];
  concurrency?: number;
  bytes?: number;
  /** Seconds one request may take before it counts as hung (failed with TimeoutError). */
  timeoutSeconds?: number;
  /** Reconnect after this many requests (0: keep each connection). */
  newConnectionEvery?: number;
}

export interface Load {
  /** Resolves with the wall-clock start once every thread is sending. */
  readonly started: Promise<number>;
  progress(): LoadProgress | undefined;
  /** Resolves once `sent` has grown by n (so a fault lands on a loaded plane). */
  untilSent(n: number, timeoutMs?: number): Promise<void>;
  stop(): Promise<LoadResult>;
}

/** A reason that says the client waited out its timeout: a request that hung. */
export const isHang = (reason: string): boolean => /timeout|DEADLINE_EXCEEDED/i.test(reason);

export function startLoad(kind: "http" | "grpc", target: string, o: LoadOptions = {}): Load {
  const args = [
    join(repoRoot, "test", "e2e", "faults", "load.py"),
    kind,
    target,
    "--concurrency",
    String(o.concurrency ?? 8),
    "--duration",
    "3600",
    "--bytes",
    String(o.bytes ?? 1024),
    "--timeout",
    String(o.timeoutSeconds ?? 30),
    "--drain",
    String((o.timeoutSeconds ?? 30) + 5),
    "--new-connection-every",
    String(o.newConnectionEvery ?? 0),
  ];
  for (const h of o.headers ?? []) args.push(kind === "http" ? "--header" : "--metadata", h);
  const child = spawn("/usr/bin/python3", args, { stdio: ["ignore", "pipe", "pipe"] });
  let last: LoadProgress | undefined;
  let stderr = "";
  let partial = "";
  let startedResolve!: (ms: number) => void;
  const started = new Promise<number>((r) => (startedResolve = r));
  let result: LoadResult | undefined;
  // a load outlives nothing: when the suite's process ends (a case that hung past the runner's
  // timeout never stops its load), the generator goes with it instead of running its 3600 s
  const orphaned = () => child.kill("SIGKILL");
  process.once("exit", orphaned);
  const exited = new Promise<void>((resolve) =>
    child.once("exit", () => {
      process.off("exit", orphaned);
      resolve();
    }),
  );
  const waiters: Array<() => void> = [];
  child.stderr.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-8192)));
  child.stdout.on("data", (d: Buffer) => {
    partial += d.toString();
    let nl: number;
    while ((nl = partial.indexOf("\n")) !== -1) {
      const line = partial.slice(0, nl);
      partial = partial.slice(nl + 1);
      try {
        const m = JSON.parse(line) as { started?: number; progress?: LoadProgress; result?: LoadResult };
        if (m.started) startedResolve(m.started);
        if (m.progress) {
          last = m.progress;
          for (const w of waiters.splice(0)) w();
        }
        if (m.result) result = m.result;
      } catch {
        // not ours
      }
    }
  });
  return {
    started,
    progress: () => last,
    async untilSent(n, timeoutMs = 60_000) {
      const deadline = Date.now() + timeoutMs;
      // every wait is bounded: a load generator that goes silent (no line at all) fails here, by its
      // deadline, instead of holding the case until the runner's 600 s
      const until = (p: Promise<unknown>) =>
        Promise.race([p, sleep(Math.max(0, deadline - Date.now()), undefined, { ref: false })]);
      await until(started);
      const from = last?.sent ?? 0;
      while ((last?.sent ?? 0) < from + n) {
        if (Date.now() >= deadline || child.exitCode !== null) {
          // the load stops sending (SIGTERM: it drains and prints its result, which stop() reads), so
          // a case that fails here does not leave it running into the next case
          if (child.exitCode === null) child.kill("SIGTERM");
          throw new Error(
            `the load sent ${(last?.sent ?? 0) - from} of ${n} requests in ${timeoutMs} ms (exit ${child.exitCode})\n${stderr}`,
          );
        }
        await until(new Promise<void>((r) => waiters.push(r)));
      }
    },
    async stop() {
      if (child.exitCode === null) child.kill("SIGTERM");
      await exited;
      if (!result)
        throw new Error(`the load generator printed no result (exit ${child.exitCode})\n${stderr}`);
      return result;
    },
  };
}

/** `sent 1200 answered 1198 failed 2 (503 SHUTTING_DOWN ×2) wrong 0 unaccounted 0 p99 12 ms` */
export function describe(r: LoadResult): string {
  const why = Object.entries(r.reasons)
    .map(([k, v]) => `${k} ×${v}`)
    .join(", ");
  return (
    `sent ${r.sent} answered ${r.answered} failed ${r.failed}${why ? ` (${why})` : ""} wrong ${r.wrong} ` +
    `unaccounted ${r.unaccounted} p50 ${r.p50ms ?? "-"} ms p99 ${r.p99ms ?? "-"} ms`
  );
}
