// The callout's log lines are sampled (natsAuthCalloutService.serviceConfig.logging.sampling): a
// NATS server can send thousands of logins a second, and each would be a line.
import type { Logger } from "../../lib/log.js";

/** Sampled logging, as the upstream service does it (zap's sampler): per message text, per second. */
export function sampler(opts: { initial: number; thereafter: number }, now: () => number = Date.now) {
  const counts = new Map<string, { second: number; n: number }>();
  return (message: string): boolean => {
    if (opts.initial <= 0) return true;
    const second = Math.floor(now() / 1000);
    let c = counts.get(message);
    if (!c || c.second !== second) {
      c = { second, n: 0 };
      counts.set(message, c);
    }
    c.n++;
    return c.n <= opts.initial || (c.n - opts.initial) % opts.thereafter === 0;
  };
}

/** Writes one line at the level, if the sampler keeps it. */
export type SampledLog = (
  level: "info" | "warn" | "debug",
  fields: Record<string, unknown>,
  msg: string,
) => void;

/** The logger's lines through a sampler (the default: 100 a second per message, then 1 in 100). */
export function sampledLog(logger: Logger, sampling = { initial: 100, thereafter: 100 }): SampledLog {
  const keep = sampler(sampling);
  return (level, fields, msg) => {
    if (keep(msg)) logger[level](fields, msg);
  };
}
