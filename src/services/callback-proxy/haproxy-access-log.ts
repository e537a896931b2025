// The callback proxy's access log: one JSON line per callback or tunnel on HAProxy's standard
// output, shaped like callplane's own (pino) lines, naming the worker (its address), the pod, the
// request when the exchange named one, what the checks decided (`outcome`, `reason`) and how the
// exchange ended. service.ts tells these lines from HAProxy's notices by their first character.
//
// HAProxy also keeps the last lines in a ring of its own (ACCESS_LOG_RING, 1 MB), which the keeper
// reads over the runtime API only when the operator console asks (access-log-answers.ts): standard
// output stays as it is, and no line passes through the keeper on its way out.
import { NVCF_HEADERS } from "../../lib/contract.js";
import { lf } from "./haproxy-syntax.js";

/** HAProxy's ring of the last access-log lines (`show events access_log` on the runtime API). */
export const ACCESS_LOG_RING = { name: "access_log", bytes: 1024 * 1024 } as const;

/** Where HAProxy's log lines go: standard output (as before), and the ring. */
export function accessLogTargets(): string[] {
  return ["  log stdout format raw local0 info", `  log ring@${ACCESS_LOG_RING.name} format raw local0 info`];
}

/** The ring section: raw lines (the JSON line alone), the oldest dropped when it is full. */
export function accessLogRingLines(): string[] {
  return [
    `ring ${ACCESS_LOG_RING.name}`,
    "  format raw",
    // HAProxy's default line length (1024) cuts a refusal's line with a long reason
    "  maxlen 4096",
    `  size ${ACCESS_LOG_RING.bytes}`,
    "",
  ];
}

const UUID = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";

/**
 * The frontend's rules that name the request on the line (`requestId`, empty when none did): a
 * callback's from the pod's answer (the replica names the request on its answers to
 * request-attach, nvcf-reqid), a tunnel's from the worker's X-Request-ID once grpc-proxy accepted
 * the tunnel (it refuses a tunnel whose token was not minted for that id). What a worker claims
 * in a refused exchange names nothing.
 */
export function requestIdLines(): string[] {
  return [
    `  http-request set-var(txn.tunnelreqid) req.fhdr(x-request-id) if grpc_name { req.fhdr(x-request-id) -m reg ${UUID} }`,
    `  http-response set-var(txn.reqid) res.fhdr(${NVCF_HEADERS.reqId}),lower if !grpc_name { res.fhdr(${NVCF_HEADERS.reqId}) -m reg ${UUID} }`,
    "  http-response set-var(txn.reqid) var(txn.tunnelreqid),lower if grpc_name { status 200 }",
  ];
}

/** The frontend's log-format: the access-log line, with HAProxy's per-request values filled in. */
export function accessLogFormat(): string {
  return lf(
    [
      `{"level":30,"time":%[date(0,ms)],"service":"callback-proxy","msg":"callback"`,
      // what the console shows first (its detail column is cut at 300 characters)
      `"method":"%[capture.req.method,json(utf8s)]"`,
      `"path":"%[var(txn.path),bytes(0,200),json(utf8s)]"`,
      `"status":%ST`,
      `"durationMs":%Ta`,
      `"bytesIn":%U`,
      `"bytesOut":%B`,
      `"target":"%[var(txn.target),json(utf8s)]"`,
      // a request HAProxy's parser refused ran no rule: it has no outcome of its own
      `"outcome":"%[var(txn.outcome,refused_framing),json(utf8s)]"`,
      `"requestId":"%[var(txn.reqid),json(utf8s)]"`,
      `"reason":"%[var(txn.reason),json(utf8s)]"`,
      `"worker":"%ci:%cp"`,
      `"sni":"%[ssl_fc_sni,json(utf8s)]"`,
      `"termination":"%tsc"`,
      `"upstreamError":"%[bc_err_str,json(utf8s)]"`,
      `"traceId":"%[var(txn.traceid),json(utf8s)]"}`,
    ].join(","),
  );
}
