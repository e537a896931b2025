// The worker callback proxy is HAProxy; this module writes its configuration from callplane's own
// settings, so one environment file still decides everything. What HAProxy is told to do:
//
// - one TLS front door for workers (the *.<workerDomain> certificate, HTTP/1.1 only). The server
//   name decides first: `<dashed-ip>.<workerDomain>` is a gRPC tunnel to that grpc-proxy pod, any
//   other name (or none) an HTTP callback;
// - a callback is a forward-proxy request whose absolute-form target is exactly
//   `http://<dashed-ipv4>.invocation.<serviceDomain>:<podPort>/v2/nvcf/worker/request-attach`, with
//   octets in range, no leading zeros, inside `podNetworks`, GET or POST, one Host header naming
//   the same pod, plain framing. Anything else is answered by HAProxy itself (an RFC 7807 body with
//   callplane's stable error code) before any connection to a pod is opened. The pod's address is
//   read out of the name: no DNS is asked, so there is nothing to rebind;
// - the callback then goes to that pod's worker TLS listener, the pod certificate verified against
//   the stack CA for exactly the pod's name (or to its plain port when upstream TLS is off), over
//   pooled connections;
// - a gRPC tunnel's CONNECT goes to the grpc-proxy pod's worker TLS listener, its certificate
//   verified for `<dashed-ip>.grpc-headless.<serviceDomain>`; after its 200 HAProxy moves bytes
//   without reading them;
// - one JSON access-log line per callback on standard output, naming the worker and the pod;
// - a plain admin listener: /health (503 from the moment a drain begins) and /metrics (HAProxy's
//   Prometheus exporter).
//
// CONNECT tunnels to invocation pods are not offered: workers never ask for one (their callbacks
// are absolute-form requests), and HAProxy cannot answer a CONNECT itself.
import type { Config } from "../../lib/config/index.js";
import { ATTACH_PATH } from "../../lib/contract.js";
import { CallplaneError, type ErrorCode } from "../../lib/errors.js";
import { formatHostPort, type HostPort, parseCidr, POD_SERVICES } from "../../lib/net/index.js";

export interface HaproxyConfigOptions {
  listen: HostPort;
  metricsListen: HostPort;
  serviceDomain: string;
  workerDomain: string;
  /** The port of each grpc-proxy pod's worker TLS listener; unset, gRPC tunnels are refused. */
  grpcPodPort?: number | undefined;
  podNetworks: string[];
  /** true: TLS to the pod's worker listener (verified); false: plain HTTP to its plain port. */
  upstreamTls: boolean;
  podPort: number;
  files: {
    /**
     * The frontend certificate and its chain, with its key in the same file, or (with
     * `frontendKeyBeside`) in the file beside it that has the `.key` extension (a
     * kubernetes.io/tls Secret's tls.crt and tls.key).
     */
    frontendPem: string;
    frontendKeyBeside?: boolean;
    /** The CA bundle pod certificates must chain to. */
    podCa: string;
    /** HAProxy's runtime API socket (certificate updates, the drain). */
    adminSocket: string;
    /** The folder of the answers HAProxy's parser refusals get (haproxyErrorFiles). */
    errorDir: string;
  };
  timeouts: { headersMs: number; idleMs: number; connectMs: number };
  maxHeaderBytes: number;
  /** How long a stop lets callbacks and tunnels in flight finish (hard-stop-after). */
  shutdownGraceMs: number;
  /** HAProxy threads (default: one per CPU HAProxy may use). */
  threads?: number | undefined;
  /** The most idle connections to pods kept for reuse (default: HAProxy's, unbounded). */
  poolMaxConnections?: number | undefined;
}

/** What HAProxy's configuration takes from callplane's own, wherever the proxy runs. */
export function haproxySettings(
  c: Config,
): Pick<
  HaproxyConfigOptions,
  | "serviceDomain"
  | "workerDomain"
  | "upstreamTls"
  | "timeouts"
  | "maxHeaderBytes"
  | "shutdownGraceMs"
  | "threads"
  | "poolMaxConnections"
> {
  const p = c.workerCallbackProxy;
  return {
    serviceDomain: c.global.serviceDomain,
    workerDomain: p.workerDomain,
    upstreamTls: p.invocation.upstreamTls.enabled,
    timeouts: {
      headersMs: p.timeouts.headersSeconds * 1000,
      idleMs: p.timeouts.idleSeconds * 1000,
      connectMs: p.timeouts.connectSeconds * 1000,
    },
    maxHeaderBytes: p.maxHeaderBytes,
    shutdownGraceMs: p.shutdownGraceSeconds * 1000,
    threads: p.threads,
    poolMaxConnections: p.upstreamConnectionsPerPod,
  };
}

/** The backend whose one server stands for readiness: the drain disables it, /health then fails. */
export const READY_SERVER = "ready/up";

/** Marks HAProxy's own answers for a pod it could not reach (removed before the worker sees it). */
const GATEWAY_MARK = "x-callplane-proxy-error";

/** The header fields a callback may carry (Node's proxy allowed 100). */
const MAX_HEADERS = 100;

const OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])";
const DASHED_IPV4 = `${OCTET}-${OCTET}-${OCTET}-${OCTET}`;

function regexEscape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

function seconds(ms: number): string {
  return `${Math.max(1, Math.ceil(ms / 1000))}s`;
}

/**
 * A log-format string for HAProxy: `%` doubled, and nothing that would end the single-quoted word
 * the configuration holds it in.
 */
function lf(text: string): string {
  if (text.includes("'")) throw new Error(`no single quote may appear in an HAProxy string: ${text}`);
  return text;
}

/**
 * The RFC 7807 body of a refusal, as callplane's own services write it. `detail` may hold HAProxy
 * log-format expressions (`%[...]`), which are evaluated per request; the expressions used here
 * end in `json(utf8s)`, so what they insert is escaped for a JSON string.
 */
function problem(code: ErrorCode, detail: string): string {
  const p = new CallplaneError(code, "\u0000").toProblem();
  return lf(JSON.stringify(p).replace('"\\u0000"', JSON.stringify(detail).replace(/\\\\/g, "\\")));
}

/** A sample fetch escaped for a JSON string inside a log-format body (at most 100 characters). */
function quoted(fetch: string): string {
  return `%[${fetch},bytes(0,100),json(utf8s)]`;
}

interface Refusal {
  when: string;
  code: ErrorCode;
  outcome: string;
  detail: string;
  /** The connection ends after the answer (framing: what follows cannot be trusted). */
  close?: boolean;
  headers?: Record<string, string>;
}

function refusalLines(r: Refusal): string[] {
  const status = new CallplaneError(r.code, "").status;
  const hdrs = Object.entries({ ...(r.close ? { connection: "close" } : {}), ...r.headers })
    .map(([k, v]) => ` hdr ${k} "${v}"`)
    .join("");
  return [
    `  http-request set-var(txn.outcome) str(${r.outcome}) if ${r.when}`,
    `  http-request set-var-fmt(txn.reason) '${lf(r.detail)}' if ${r.when}`,
    `  http-request return status ${status} content-type application/problem+json${hdrs} lf-string '${problem(r.code, r.detail)}' if ${r.when}`,
  ];
}

// What HAProxy answers itself when it cannot take a request apart (its parser refuses it before any
// rule runs, so the answer is a fixed file)
const PARSER_ERRORS: Record<number, (o: HaproxyConfigOptions) => CallplaneError> = {
  400: (o) =>
    new CallplaneError(
      "BAD_REQUEST",
      `the callback proxy (HAProxy) could not take the request apart: ambiguous framing (Content-Length or Transfer-Encoding), a Host header that disagrees with the absolute-form target, more than ${MAX_HEADERS} header fields, a head over ${o.maxHeaderBytes} bytes, or invalid syntax; send one well-formed request with an absolute-form target`,
    ),
  408: (o) =>
    new CallplaneError(
      "REQUEST_TIMEOUT",
      `the request head did not arrive within ${seconds(o.timeouts.headersMs)}; the connection is closed`,
    ),
};

function errorFile(o: HaproxyConfigOptions, status: number): string {
  return `${o.files.errorDir}/${status}.http`;
}

/** The files HAProxy answers its parser's refusals with, by path: whole HTTP responses. */
export function haproxyErrorFiles(o: HaproxyConfigOptions): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [status, err] of Object.entries(PARSER_ERRORS)) {
    const e = err(o);
    const body = JSON.stringify(e.toProblem());
    out[errorFile(o, Number(status))] =
      `HTTP/1.1 ${e.status} ${e.status === 400 ? "Bad Request" : "Request Timeout"}\r\ncontent-type: application/problem+json\r\ncontent-length: ${Buffer.byteLength(body)}\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n${body}`;
  }
  return out;
}

/** HAProxy's configuration for the callback proxy. */
export function haproxyConfig(o: HaproxyConfigOptions): string {
  const domain = regexEscape(o.serviceDomain.toLowerCase());
  const workerDomain = regexEscape(o.workerDomain.toLowerCase());
  const podNetworks = o.podNetworks.map((n) => parseCidr(n).text).join(" ");
  const podName = `^${DASHED_IPV4}\\.${POD_SERVICES.invocation}\\.${domain}$`;
  const authority = `<dashed-ip>.invocation.${o.serviceDomain}:${o.podPort}`;
  const example = `POST http://${authority}${ATTACH_PATH}`;
  const scheme = "http";
  const grpcName = `${POD_SERVICES.grpc}.${o.serviceDomain}`;
  const tlsTo = (sni: string) =>
    `ssl verify required ca-file ${o.files.podCa} sni ${sni} alpn http/1.1 ssl-min-ver TLSv1.2`;

  const refusals: Refusal[] = [
    // gRPC tunnels: the server name is the target
    {
      when: "grpc_name !grpc_pod",
      code: "PROXY_TARGET_INVALID",
      outcome: "refused_target",
      detail: `the server name ${quoted("ssl_fc_sni")} is neither invocation.${o.workerDomain} nor a grpc-proxy pod of the form <dashed-ipv4>.${o.workerDomain}`,
    },
    {
      when: "grpc_name !grpc_in_network",
      code: "PROXY_TARGET_FORBIDDEN",
      outcome: "refused_forbidden",
      detail: `the pod address ${quoted("var(txn.podip)")} is outside the pod networks (${o.podNetworks.join(", ")})`,
    },
    ...(o.grpcPodPort === undefined
      ? [
          {
            when: "grpc_name",
            code: "CONNECT_DISABLED" as const,
            outcome: "refused_grpc",
            detail: "gRPC tunnels are not routed by this proxy (no grpc-proxy pods are configured)",
          },
        ]
      : []),
    {
      when: "grpc_name !METH_CONNECT",
      code: "METHOD_NOT_ALLOWED",
      outcome: "refused_method",
      detail: "a gRPC tunnel begins with a CONNECT request to the grpc-proxy pod",
    },
    // HTTP callbacks
    {
      when: "!grpc_name METH_CONNECT",
      code: "CONNECT_DISABLED",
      outcome: "refused_connect",
      detail: "CONNECT tunnels are not offered; send a forward-proxy request (absolute-form target) instead",
      headers: { allow: "GET, POST" },
    },
    {
      when: "!grpc_name !absolute origin_form !attach_path",
      code: "NOT_FOUND",
      outcome: "refused_path",
      detail: `only ${ATTACH_PATH} is forwarded`,
    },
    {
      when: "!grpc_name !absolute origin_form",
      code: "PROXY_TARGET_INVALID",
      outcome: "refused_target",
      detail: `send a forward-proxy request with an absolute-form target (${example}), not an origin-form path`,
    },
    {
      when: "!grpc_name !absolute",
      code: "PROXY_TARGET_INVALID",
      outcome: "refused_target",
      detail: "the request target is not an absolute URI",
    },
    {
      when: "!grpc_name !attach_path",
      code: "NOT_FOUND",
      outcome: "refused_path",
      detail: `only ${ATTACH_PATH} is forwarded, not ${quoted("var(txn.path)")}`,
    },
    {
      when: "!grpc_name has_query",
      code: "PROXY_TARGET_INVALID",
      outcome: "refused_target",
      detail: "the callback target takes no query or fragment",
    },
    {
      when: "!grpc_name !http_scheme",
      code: "PROXY_TARGET_INVALID",
      outcome: "refused_target",
      detail: `the target scheme must be ${scheme} (the proxy itself encrypts to the pod), not ${quoted("var(txn.scheme)")}`,
    },
    {
      when: "!grpc_name has_userinfo",
      code: "PROXY_TARGET_INVALID",
      outcome: "refused_target",
      detail: "the target must not carry user information",
    },
    {
      when: "!grpc_name !authority_form",
      code: "PROXY_TARGET_INVALID",
      outcome: "refused_target",
      detail: `the target authority ${quoted("var(txn.authority)")} is not ${authority}`,
    },
    {
      when: "!grpc_name !pod_name",
      code: "PROXY_TARGET_INVALID",
      outcome: "refused_target",
      detail: `the target host ${quoted("var(txn.pod)")} is not a pod address of the form <dashed-ipv4>.invocation.${o.serviceDomain}`,
    },
    {
      when: "!grpc_name !pod_port",
      code: "PROXY_TARGET_INVALID",
      outcome: "refused_target",
      detail: `the target port ${quoted("var(txn.port)")} is not the worker port of the pods, ${o.podPort}`,
    },
    {
      when: "!grpc_name !in_network",
      code: "PROXY_TARGET_FORBIDDEN",
      outcome: "refused_forbidden",
      detail: `the pod address ${quoted("var(txn.podip)")} is outside the pod networks (${o.podNetworks.join(", ")})`,
    },
    {
      when: "!grpc_name !get_or_post",
      code: "METHOD_NOT_ALLOWED",
      outcome: "refused_method",
      detail: `only GET and POST reach ${ATTACH_PATH}`,
    },
    {
      when: "!grpc_name many_hosts",
      code: "PROXY_HOST_MISMATCH",
      outcome: "refused_host",
      detail: `the request has ${"%[req.hdr_cnt(host)]"} Host headers; send one, naming the target ${quoted("var(txn.authority)")}`,
    },
    {
      when: "!grpc_name has_host !host_is_pod",
      code: "PROXY_HOST_MISMATCH",
      outcome: "refused_host",
      detail: `the Host header (${quoted("req.hdr(host)")}) does not name the target ${quoted("var(txn.authority)")}`,
    },
    {
      when: "!grpc_name has_te !te_chunked",
      code: "PROXY_FRAMING_INVALID",
      outcome: "refused_framing",
      detail: `Transfer-Encoding ${quoted("req.fhdr(transfer-encoding)")} is not plain chunked`,
      close: true,
    },
    {
      when: "!grpc_name has_expect !expect_continue",
      code: "EXPECTATION_FAILED",
      outcome: "refused_framing",
      detail: `Expect: ${quoted("req.fhdr(expect)")} is not supported; only Expect: 100-continue is`,
      close: true,
    },
  ];

  const accessLog = lf(
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

  // HAProxy tells a refused connection from a failed TLS session only by its error strings
  const gatewayDetail = lf(
    `nothing listens at ${"%[var(txn.podip)]:%[dst_port]"} for the pod ${quoted("var(txn.target)")}, or its TLS session failed (connection: ${quoted("bc_err_str")}; certificate: ${quoted("ssl_bc_err_str")})`,
  );
  const pool = o.poolMaxConnections ? ` pool-max-conn ${o.poolMaxConnections}` : "";
  const lines = [
    "# written by callplane from its configuration (src/services/callback-proxy/haproxy-config.ts)",
    "global",
    "  log stdout format raw local0 info",
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
    ...parserErrors(),
    "",
    "frontend workers",
    `  bind ${formatHostPort(o.listen)} ssl crt ${o.files.frontendPem} alpn http/1.1`,
    `  log-format '${accessLog}'`,
    // what the checks read, taken apart once
    // a server name of one label under the worker domain is a gRPC tunnel, unless it is the
    // invocation name (the name HTTP callbacks use)
    `  acl tunnel_name ssl_fc_sni,lower -m reg ^[^.]+\\.${workerDomain}$`,
    `  acl invocation_name ssl_fc_sni,lower -m str invocation.${o.workerDomain.toLowerCase()}`,
    "  http-request set-var(txn.tunnel) bool(true) if tunnel_name !invocation_name",
    "  acl grpc_name var(txn.tunnel) -m bool",
    `  acl grpc_pod ssl_fc_sni,lower -m reg ^${DASHED_IPV4}\\.${workerDomain}$`,
    `  http-request set-var(txn.podip) 'ssl_fc_sni,lower,field(1,.),regsub("-",".",g)' if grpc_name`,
    `  acl grpc_in_network var(txn.podip) -m ip ${podNetworks}`,
    `  http-request set-var(txn.target) 'ssl_fc_sni,lower,field(1,.),concat(.${grpcName})' if grpc_name`,
    `  http-request set-var(txn.scheme) 'url,regsub("^([A-Za-z][A-Za-z0-9+.-]*)://.*$","\\1")' if !grpc_name`,
    `  http-request set-var(txn.authority) 'url,regsub("^[A-Za-z][A-Za-z0-9+.-]*://([^/?\\#]*).*$","\\1"),lower' if !grpc_name`,
    `  http-request set-var(txn.path) 'url,regsub("^[A-Za-z][A-Za-z0-9+.-]*://[^/?\\#]*([^?\\#]*).*$","\\1")' if !grpc_name`,
    `  http-request set-var(txn.pod) 'var(txn.authority),regsub(":[0-9]*$","")'`,
    `  http-request set-var(txn.port) 'var(txn.authority),regsub("^.*:","")'`,
    `  http-request set-var(txn.podip) 'var(txn.pod),field(1,.),regsub("-",".",g)' if !grpc_name`,
    `  http-request set-var(txn.target) var(txn.pod) if !grpc_name`,
    // the trace id of the worker's span (W3C traceparent, passed on untouched) for the access line
    "  acl has_traceparent req.fhdr(traceparent) -m reg ^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
    "  http-request set-var(txn.traceid) 'req.fhdr(traceparent),field(2,-)' if has_traceparent",
    "  acl absolute url -m reg ^[A-Za-z][A-Za-z0-9+.-]*://",
    "  acl origin_form url -m beg /",
    `  acl attach_path var(txn.path) -m str ${ATTACH_PATH}`,
    "  acl has_query url -m reg [?\\#]",
    `  acl http_scheme var(txn.scheme) -m str -i ${scheme}`,
    "  acl has_userinfo var(txn.authority) -m sub @",
    "  acl authority_form var(txn.authority) -m reg ^[a-z0-9.-]+:[0-9]{1,5}$",
    `  acl pod_name var(txn.pod) -m reg ${podName}`,
    `  acl pod_port var(txn.port) -m str ${o.podPort}`,
    `  acl in_network var(txn.podip) -m ip ${podNetworks}`,
    "  acl get_or_post method GET POST",
    "  acl many_hosts req.hdr_cnt(host) gt 1",
    "  acl has_host req.hdr_cnt(host) gt 0",
    "  acl host_is_pod req.hdr(host),lower,strcmp(txn.authority) eq 0",
    "  acl host_is_pod req.hdr(host),lower,strcmp(txn.pod) eq 0",
    "  acl has_te req.hdr_cnt(transfer-encoding) gt 0",
    "  acl te_chunked req.fhdr(transfer-encoding),lower -m str chunked",
    "  acl has_expect req.hdr_cnt(expect) gt 0",
    "  acl expect_continue req.fhdr(expect),lower -m str 100-continue",
    ...refusals.flatMap(refusalLines),
    // what was refused above never reaches a backend; what is left is a checked callback or tunnel
    `  http-request set-dst var(txn.podip)`,
    ...(o.grpcPodPort !== undefined
      ? [`  http-request set-dst-port int(${o.grpcPodPort}) if grpc_name`]
      : []),
    `  http-request set-dst-port int(${o.podPort}) if !grpc_name`,
    "  http-request set-var(txn.outcome) str(forwarded) if !grpc_name",
    "  http-request set-var(txn.outcome) str(grpc_tunnel) if grpc_name",
    "  http-request set-header x-forwarded-for %[src]",
    // a worker that asks to continue gets HAProxy's 100 Continue once the checks have passed
    "  http-request wait-for-body time 1s at-least 1 if has_expect",
    // HAProxy answers a pod it could not reach with 503; callplane's answer for it is 502 (the
    // marker tells HAProxy's own answers from a pod's 503)
    `  http-after-response set-status 502 if { res.hdr(${GATEWAY_MARK}) -m found } { status 503 }`,
    "  http-after-response set-var(txn.outcome) str(upstream_timeout) if { status 504 }",
    `  http-after-response set-var(txn.outcome) str(upstream_error) if { res.hdr(${GATEWAY_MARK}) -m found } !{ status 504 }`,
    `  http-after-response set-var-fmt(txn.reason) '${gatewayDetail}' if { res.hdr(${GATEWAY_MARK}) -m found } !{ status 504 }`,
    `  http-after-response del-header ${GATEWAY_MARK}`,

    // draining (readiness withdrawn): every answer asks the worker to take its next callback
    // elsewhere, through the balancer
    "  http-after-response set-header connection close if { nbsrv(ready) lt 1 }",
    "  use_backend grpc_pods if grpc_name",
    "  default_backend invocation_pods",
    "",
    "backend invocation_pods",
    // connections to a pod are pooled and shared by every worker's callbacks to it
    "  http-reuse always",
    `  http-request set-uri ${ATTACH_PATH}`,
    // the proxy's own hop: neither is meant for the pod (HAProxy answers 100-continue itself)
    "  http-request del-header proxy-connection",
    "  http-request del-header keep-alive",
    "  http-request del-header expect",
    "  http-request set-header host %[var(txn.authority)]",
    o.upstreamTls
      ? `  server pod 0.0.0.0:0 ${tlsTo("var(txn.pod)")}${pool}`
      : `  server pod 0.0.0.0:0${pool}`,
    ...gatewayErrors(),
    "",
    "backend grpc_pods",
    `  server grpc 0.0.0.0:0 ${tlsTo("var(txn.target)")}`,
    ...gatewayErrors(),
    "",
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

  function parserErrors(): string[] {
    return Object.keys(PARSER_ERRORS).map(
      (status) => `  errorfile ${status} ${errorFile(o, Number(status))}`,
    );
  }

  function gatewayErrors(): string[] {
    const mark = ` hdr ${GATEWAY_MARK} 1`;
    return [
      `  http-error status 502 content-type application/problem+json${mark} lf-string '${problem("UPSTREAM_UNAVAILABLE", `${gatewayDetail}; the worker should give up on this request`)}'`,
      `  http-error status 503 content-type application/problem+json${mark} lf-string '${problem("UPSTREAM_UNAVAILABLE", `${gatewayDetail}; the worker should give up on this request`)}'`,
      `  http-error status 504 content-type application/problem+json${mark} lf-string '${problem("UPSTREAM_TIMEOUT", `the pod ${quoted("var(txn.target)")} did not answer within ${seconds(o.timeouts.idleMs)}; the worker should give up on this request`)}'`,
    ];
  }
}
