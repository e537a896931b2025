// Tracing settings from where each service reads them: the environment file's
// observability.tracing.* (the plane's services), and the worker's environment
// (CALLPLANE_TRACING_*, which the compute agent sets from the same keys).
import type { Config } from "../config/index.js";
import type { TracingSettings } from "./tracing.js";

/** The worker's variables; unset or empty endpoint and file: no tracing. */
export const TRACING_ENV = {
  endpoint: "CALLPLANE_TRACING_ENDPOINT",
  sampleRatio: "CALLPLANE_TRACING_SAMPLE_RATIO",
  file: "CALLPLANE_TRACING_FILE",
} as const;

/** The settings of a plane's service, or undefined when tracing is off. */
export function tracingSettings(c: Config): TracingSettings | undefined {
  const t = c.observability.tracing;
  if (t.enabled !== true) return undefined;
  return { endpoint: t.endpoint, sampleRatio: t.sampleRatio, file: t.file };
}

/** What the compute agent adds to every worker's environment (nothing when tracing is off). */
export function tracingWorkerEnv(c: Config): Record<string, string> {
  const s = tracingSettings(c);
  if (!s) return {};
  return {
    [TRACING_ENV.endpoint]: s.endpoint,
    [TRACING_ENV.sampleRatio]: String(s.sampleRatio),
    [TRACING_ENV.file]: s.file,
  };
}

/** The worker's settings from its environment, or undefined when neither endpoint nor file is set. */
export function tracingFromEnv(env: NodeJS.ProcessEnv): TracingSettings | undefined {
  const endpoint = env[TRACING_ENV.endpoint]?.trim() ?? "";
  const file = env[TRACING_ENV.file]?.trim() ?? "";
  if (!endpoint && !file) return undefined;
  const raw = env[TRACING_ENV.sampleRatio]?.trim();
  const ratio = raw ? Number(raw) : 1;
  if (!Number.isFinite(ratio) || ratio < 0 || ratio > 1)
    throw new Error(`${TRACING_ENV.sampleRatio} must be a number from 0 to 1, not ${JSON.stringify(raw)}`);
  return { endpoint, sampleRatio: ratio, file };
}
