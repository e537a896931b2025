import { pino, type Logger, type LevelWithSilent } from "pino";
import { LogRing } from "./log-ring.js";

export type { Logger };

export interface LogOptions {
  level?: LevelWithSilent;
  /** A file descriptor or path to write JSON lines to; stdout by default. */
  destination?: number | string;
  /** Write each line before returning (tests that read the file right away); async by default. */
  sync?: boolean;
  /** Fields added to each line from the line's own (the trace id of a request that has a span). */
  mixin?: (obj: object) => object;
  /** How many recent lines are kept for the operator console (log-ring.ts); 0 keeps none. */
  recentLines?: number;
}

/** Each logger's ring of recent lines, by its destination (which its child loggers share). */
const rings = new WeakMap<object, LogRing>();

/** The recent lines of a logger made by createLogger (or one of its children); none for others. */
export function recentLogLines(logger: Logger): LogRing | undefined {
  return rings.get((logger as unknown as Record<symbol, object>)[pino.symbols.streamSym]);
}

/** Lines are written in batches of up to this many bytes, and at most FLUSH_MS after they were logged. */
const BATCH_BYTES = 8192;
const FLUSH_MS = 200;

/**
 * One JSON logger per service. Lines carry `service` and, where known, `requestId`. Unless `sync`,
 * lines are batched (a write per line cost the callback proxy a fifth of its CPU per callback, for
 * its access log) and flushed within FLUSH_MS; a service that stops flushes what is left.
 */
export function createLogger(service: string, opts: LogOptions = {}): Logger {
  const sync = opts.sync ?? false;
  const dest = pino.destination({
    dest: opts.destination ?? 1,
    sync,
    mkdir: true,
    ...(sync ? {} : { minLength: BATCH_BYTES }),
  });
  if (!sync) {
    // (sonic-boom keeps the batch's length in _len; nothing buffered, nothing to write)
    const pending = dest as typeof dest & { _len?: number; destroyed?: boolean; fd: number };
    const timer = setInterval(() => {
      if (pending.destroyed) clearInterval(timer);
      else if (pending.fd >= 0 && pending._len !== 0) dest.flush();
    }, FLUSH_MS);
    timer.unref();
  }
  const ring = opts.recentLines === 0 ? undefined : new LogRing(opts.recentLines);
  const logger = pino(
    {
      level: opts.level ?? (process.env.CALLPLANE_LOG_LEVEL as LevelWithSilent | undefined) ?? "info",
      base: { service, pid: process.pid },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      ...(opts.mixin ? { mixin: opts.mixin } : {}),
      // the line as pino made it, stored as it goes out: the ring's only cost per line
      ...(ring ? { hooks: { streamWrite: (s: string) => (ring.push(s), s) } } : {}),
    },
    dest,
  );
  if (ring) rings.set(dest, ring);
  return logger;
}

/** A logger that drops everything, for tests that do not look at logs. */
export function silentLogger(): Logger {
  return pino({ level: "silent" });
}
