// The worker callback proxy is HAProxy; this module writes its configuration from callplane's own
// settings (haproxy-options.ts), so one environment file still decides everything. What HAProxy is
// told to do, and where each part is written:
//
// - one TLS front door for workers (the *.<workerDomain> certificate, HTTP/1.1 only), whose checks
//   (haproxy-checks.ts) take a callback or a gRPC tunnel apart by its server name and target, and
//   answer anything else themselves before any connection to a pod is opened;
// - a checked callback goes to its pod's worker listener, a tunnel to its grpc-proxy pod, over
//   verified TLS (haproxy-backends.ts, which also writes what a worker is told when the pod cannot
//   be reached);
// - what HAProxy's parser refuses before any rule runs gets a fixed answer file
//   (haproxy-parser-errors.ts);
// - one JSON access-log line per callback on standard output, naming the worker, the pod and the
//   request, and the last of them in a 1 MB ring the console reads (haproxy-access-log.ts);
// - a plain admin listener: /health (503 from the moment a drain begins) and /metrics (HAProxy's
//   Prometheus exporter).
import { formatHostPort } from "../../lib/net/index.js";
import {
  accessLogFormat,
  accessLogRingLines,
  accessLogTargets,
  requestIdLines,
} from "./haproxy-access-log.js";
import { backendLines, forwardLines, gatewayAnswerLines } from "./haproxy-backends.js";
import { checkLines } from "./haproxy-checks.js";
import type { HaproxyConfigOptions } from "./haproxy-options.js";
import { MAX_HEADERS, parserErrorLines } from "./haproxy-parser-errors.js";
import { problem, seconds } from "./haproxy-syntax.js";

/** The backend whose one server stands for readiness: the drain disables it, /health then fails. */
export const READY_SERVER = "ready/up";

/** HAProxy's configuration for the callback proxy. */
export function haproxyConfig(o: HaproxyConfigOptions): string {
  const lines = [
    "# written by callplane from its configuration (src/services/callback-proxy/haproxy-config.ts)",
    "global",
    ...accessLogTargets(),
    `  stats socket ${o.files.adminSocket} mode 600 level admin`,
    `  hard-stop-after ${seconds(o.shutdownGraceMs)}`,
    ...(o.threads ? [`  nbthread ${o.threads}`] : []),
    "  maxconn 8000",
    // a head larger than this is refused; the rest of each buffer carries bodies
    `  tune.bufsize ${Math.max(16_384, o.maxHeaderBytes + 1024)}`,
    "  tune.maxrewrite 1024",
    `  tune.http.maxhdr ${MAX_HEADERS}`,
    "  tune.ssl.default-dh-param 2048",
    "  ssl-default-bind-options ssl-min-ver TLSv1.2",
    ...(o.files.frontendKeyBeside ? ["  ssl-load-extra-del-ext", "  ssl-load-extra-files key"] : []),
    "  ssl-server-verify required",
    "",
    ...accessLogRingLines(),
    "defaults",
    "  mode http",
    "  log global",
    "  option dontlognull",
    `  timeout connect ${seconds(o.timeouts.connectMs)}`,
    `  timeout http-request ${seconds(o.timeouts.headersMs)}`,
    "  timeout http-keep-alive 65s",
    // a callback's answer may take as long as the idle timeout between bytes; the worker's side a
    // little longer, so a stalled pod is answered 504 before the worker's connection is cut
    `  timeout server ${seconds(o.timeouts.idleMs)}`,
    `  timeout client ${seconds(o.timeouts.idleMs + 5000)}`,
    // a gRPC tunnel carries a worker's session to a grpc-proxy pod for as long as both live
    "  timeout tunnel 24h",
    "  timeout client-fin 5s",
    "  timeout server-fin 5s",
    // a failed connection to a pod is answered at once: the worker gives up on that request
    "  retries 0",
    ...parserErrorLines(o),
    "",
    "frontend workers",
    `  bind ${formatHostPort(o.listen)} ssl crt ${o.files.frontendPem} alpn http/1.1`,
    `  log-format '${accessLogFormat()}'`,
    ...checkLines(o),
    ...forwardLines(o),
    ...requestIdLines(),
    ...gatewayAnswerLines(),

    // draining (readiness withdrawn): every answer asks the worker to take its next callback
    // elsewhere, through the balancer
    "  http-after-response set-header connection close if { nbsrv(ready) lt 1 }",
    "  use_backend grpc_pods if grpc_name",
    "  default_backend invocation_pods",
    "",
    ...backendLines(o),
    // the drain disables this server (runtime API): /health then answers 503
    "backend ready",
    "  server up 127.0.0.1:9",
    "",
    "frontend admin",
    `  bind ${formatHostPort(o.metricsListen)}`,
    "  mode http",
    "  option dontlog-normal",
    // probes are not callbacks: nothing of this listener goes to the access log
    "  no log",
    "  monitor-uri /health",
    "  monitor fail if { nbsrv(ready) lt 1 }",
    "  http-request use-service prometheus-exporter if { path /metrics }",
    `  http-request return status 404 content-type application/problem+json lf-string '${problem("NOT_FOUND", "this listener answers /health and /metrics only")}'`,
    "",
  ];
  return lines.join("\n");
}
