// What every service's main.ts shares: load the configuration, start, report readiness on the
// control channel, and stop on signals (first: drain; second: now). Only main files call this.
import { ConfigError, loadConfig, type Config } from "../config/index.js";
import { parseParentMessage, sendToParent } from "./control.js";
import type { LevelWithSilent } from "pino";
import { createLogger, type Logger } from "../log.js";
import { startTracing, tracingSettings, type Tracing, type TracingSettings } from "../tracing/index.js";

export interface Running {
  urls: Record<string, string>;
  /**
   * Drains: for `drainDelayMs` after readiness has failed the service still takes work (a balancer
   * takes a moment to notice), then it refuses new work and finishes what is in flight within
   * `graceMs`.
   */
  close(graceMs: number, drainDelayMs: number): Promise<void>;
  destroy(): void;
}

interface StopTimes<C> {
  graceMs?: (c: C) => number;
  /** How long the service keeps taking work after its readiness failed (front doors behind balancers). */
  drainDelayMs?: (c: C) => number;
  /** Where the service's spans go, if it traces (undefined: it does not, and loads nothing of it). */
  tracing?: (c: C) => TracingSettings | undefined;
}

export function configFileFromArgs(argv = process.argv.slice(2)): string | undefined {
  const i = argv.indexOf("--config");
  if (i !== -1) return argv[i + 1];
  return process.env.CALLPLANE_CONFIG || undefined;
}

export function runService(
  service: string,
  start: (config: Config, logger: Logger, tracing: Tracing | undefined) => Promise<Running>,
  opts: StopTimes<Config> & { traced?: boolean } = {},
): void {
  runProcess(
    service,
    () => loadConfig({ file: configFileFromArgs() }),
    (c) => c.log.level,
    start,
    opts.traced ? { ...opts, tracing: tracingSettings } : opts,
  );
}

/** Like runService, for processes configured some other way (the worker reads its environment). */
export function runProcess<C>(
  service: string,
  load: () => C,
  level: (c: C) => LevelWithSilent,
  start: (config: C, logger: Logger, tracing: Tracing | undefined) => Promise<Running>,
  opts: StopTimes<C> = {},
): void {
  let config: C;
  try {
    config = load();
  } catch (err) {
    const message = err instanceof ConfigError ? err.message : String(err);
    process.stderr.write(`${service}: ${message}\n`);
    sendToParent({ type: "failed", service, code: "CONFIG", message });
    process.exit(2);
  }
  let traceSettings: TracingSettings | undefined;
  try {
    traceSettings = opts.tracing?.(config);
  } catch (err) {
    process.stderr.write(`${service}: ${(err as Error).message}\n`);
    sendToParent({ type: "failed", service, code: "CONFIG", message: (err as Error).message });
    process.exit(2);
  }
  let tracing: Tracing | undefined;
  // a line that names a request with a span here carries its trace id
  const logger = createLogger(service, {
    level: level(config),
    ...(traceSettings ? { mixin: (o: object) => tracing?.logMixin(o) ?? {} } : {}),
  });
  let running: Running | undefined;
  let stopping = false;
  const stop = (why: string, drainDelay = true) => {
    if (stopping) {
      logger.warn({ why }, "second stop request: stopping now");
      running?.destroy();
      process.exit(1);
    }
    stopping = true;
    const grace = opts.graceMs?.(config) ?? 10_000;
    const delay = drainDelay ? (opts.drainDelayMs?.(config) ?? 0) : 0;
    logger.info({ why, graceMs: grace, drainDelayMs: delay }, "stopping");
    const hard = setTimeout(
      () => {
        logger.warn("grace period over: stopping now");
        running?.destroy();
        process.exit(0);
      },
      delay + grace + 2000,
    );
    hard.unref();
    (running ? running.close(grace, delay) : Promise.resolve())
      // the spans of the work just finished go out before the process does
      .then(() => tracing?.shutdown())
      .then(() => {
        logger.info("stopped");
        logger.flush();
        setImmediate(() => process.exit(0));
      })
      .catch((err: unknown) => {
        logger.error({ err }, "error while stopping");
        process.exit(1);
      });
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("message", (raw) => {
    const msg = parseParentMessage(raw);
    if (msg?.type === "shutdown" && !stopping)
      stop("shutdown requested by supervisor", msg.drainDelay !== false);
  });
  // A supervisor that goes away takes its children with it.
  process.on("disconnect", () => {
    if (!stopping) stop("supervisor went away");
  });
  const traced = traceSettings
    ? startTracing({ service, settings: traceSettings, logger }).then((t) => {
        tracing = t;
        logger.info(
          {
            endpoint: traceSettings.endpoint || undefined,
            file: traceSettings.file || undefined,
            sampleRatio: traceSettings.sampleRatio,
          },
          "tracing on",
        );
        return t;
      })
    : Promise.resolve(undefined);
  traced
    .then((t) => start(config, logger, t))
    .then((r) => {
      running = r;
      sendToParent({ type: "ready", service, urls: r.urls });
    })
    .catch((err: unknown) => {
      const e = err as NodeJS.ErrnoException & { address?: string; port?: number };
      const message =
        e.code === "EADDRINUSE"
          ? `${service} cannot listen on ${e.address ?? "?"}:${e.port ?? "?"}: the address is already in use (another callplane stack, or another program, is listening there)`
          : e.code === "EADDRNOTAVAIL"
            ? `${service} cannot listen on ${e.address ?? "?"}: no network interface has that address`
            : `${service} failed to start: ${e.message}`;
      logger.fatal({ err }, message);
      process.stderr.write(`${message}\n`);
      sendToParent({ type: "failed", service, code: e.code ?? "START", message });
      logger.flush();
      setTimeout(() => process.exit(1), 50);
    });
}
