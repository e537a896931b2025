import { pino, type Logger, type LevelWithSilent } from "pino";

export type { Logger };

export interface LogOptions {
  level?: LevelWithSilent;
  /** A file descriptor or path to write JSON lines to; stdout by default. */
  destination?: number | string;
  /** Write each line before returning (tests that read the file right away); async by default. */
  sync?: boolean;
}

/** One JSON logger per service. Lines carry `service` and, where known, `requestId`. */
export function createLogger(service: string, opts: LogOptions = {}): Logger {
  const dest = pino.destination({ dest: opts.destination ?? 1, sync: opts.sync ?? false, mkdir: true });
  return pino(
    {
      level: opts.level ?? (process.env.CALLPLANE_LOG_LEVEL as LevelWithSilent | undefined) ?? "info",
      base: { service, pid: process.pid },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    dest,
  );
}

/** A logger that drops everything, for tests that do not look at logs. */
export function silentLogger(): Logger {
  return pino({ level: "silent" });
}
