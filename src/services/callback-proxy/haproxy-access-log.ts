// The callback proxy's access log: one JSON line per callback or tunnel on HAProxy's standard
// output, shaped like callplane's own (pino) lines, naming the worker (its address), the pod, what
// the checks decided (`outcome`, `reason`) and how the exchange ended. service.ts tells these lines
// from HAProxy's notices by their first character.
import { lf } from "./haproxy-syntax.js";

/** The frontend's log-format: the access-log line, with HAProxy's per-request values filled in. */
export function accessLogFormat(): string {
  return lf(
    [
      `{"level":30,"time":%[date(0,ms)],"service":"callback-proxy","msg":"callback"`,
      `"worker":"%ci:%cp"`,
      `"method":"%[capture.req.method,json(utf8s)]"`,
      `"sni":"%[ssl_fc_sni,json(utf8s)]"`,
      `"target":"%[var(txn.target),json(utf8s)]"`,
      `"path":"%[var(txn.path),bytes(0,200),json(utf8s)]"`,
      `"status":%ST`,
      // a request HAProxy's parser refused ran no rule: it has no outcome of its own
      `"outcome":"%[var(txn.outcome,refused_framing),json(utf8s)]"`,
      `"termination":"%tsc"`,
      `"reason":"%[var(txn.reason),json(utf8s)]"`,
      `"upstreamError":"%[bc_err_str,json(utf8s)]"`,
      `"traceId":"%[var(txn.traceid),json(utf8s)]"`,
      `"bytesIn":%U`,
      `"bytesOut":%B`,
      `"durationMs":%Ta}`,
    ].join(","),
  );
}
