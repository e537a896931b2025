// The observability section: end-to-end tracing (OpenTelemetry, W3C trace context from the client
// through NATS to the worker and the inference server). Off in the file by default; `npm start`
// turns it on for its own stack, writing spans to a file under the data folder.
import { z } from "zod";
import { optionalUrl, section } from "./fields.js";

export const observabilitySection = section({
  tracing: section({
    // null (unset): off, except on the one-machine stack, which turns it on (spans to a file)
    enabled: z.boolean().nullable().default(null),
    /** An OTLP/HTTP traces endpoint (JSON), e.g. http://otel-collector:4318/v1/traces. */
    endpoint: optionalUrl(["http", "https"]),
    sampleRatio: z.number().min(0).max(1).default(1),
    /** A file the services append their spans to (OTLP/JSON, one export per line). */
    file: z.string().default(""),
    /** A Tempo-compatible query API that `callplane trace` reads (e.g. http://tempo:3200). */
    queryUrl: optionalUrl(["http", "https"]),
  }),
});

export type ObservabilityConfig = z.output<typeof observabilitySection>;

/** Tracing switched on with nowhere to send spans: an error naming the keys. */
export function tracingProblems(c: { observability: ObservabilityConfig }): string[] {
  const t = c.observability.tracing;
  if (t.enabled === true && !t.endpoint && !t.file)
    return [
      "observability.tracing.enabled is true, but neither observability.tracing.endpoint nor observability.tracing.file is set: say where spans go",
    ];
  return [];
}
