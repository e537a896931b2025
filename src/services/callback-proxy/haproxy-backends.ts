// Where a checked request goes, and what the worker is told when it cannot get there. The
// frontend's checks (haproxy-checks.ts) leave the pod's address in a variable; the destination is
// set from it, so the backends' one server each (0.0.0.0:0) connects wherever the request names:
// - a callback goes to that pod's worker TLS listener, the pod certificate verified against the
//   stack CA for exactly the pod's name (or to its plain port when upstream TLS is off), over
//   pooled connections (`invocation_pods`);
// - a gRPC tunnel's CONNECT goes to the grpc-proxy pod's worker TLS listener, its certificate
//   verified for `<dashed-ip>.grpc-headless.<serviceDomain>`; after its 200 HAProxy moves bytes
//   without reading them (`grpc_pods`).
// A pod HAProxy cannot reach, or that does not answer in time, gets callplane's problem answer
// (502 UPSTREAM_UNAVAILABLE, 504 UPSTREAM_TIMEOUT), marked so that the frontend tells it from a
// pod's own 503.
import { ATTACH_PATH } from "../../lib/contract.js";
import type { HaproxyConfigOptions } from "./haproxy-options.js";
import { lf, problem, quoted, seconds } from "./haproxy-syntax.js";

/** Marks HAProxy's own answers for a pod it could not reach (removed before the worker sees it). */
const GATEWAY_MARK = "x-callplane-proxy-error";

// HAProxy tells a refused connection from a failed TLS session only by its error strings
const GATEWAY_DETAIL = lf(
  `nothing listens at ${"%[var(txn.podip)]:%[dst_port]"} for the pod ${quoted("var(txn.target)")}, or its TLS session failed (connection: ${quoted("bc_err_str")}; certificate: ${quoted("ssl_bc_err_str")})`,
);

/** The frontend's last request rules: the checked request's destination, and its outcome. */
export function forwardLines(o: HaproxyConfigOptions): string[] {
  return [
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
  ];
}

/** The frontend's answer rules for HAProxy's own answers about a pod (the backends' http-error). */
export function gatewayAnswerLines(): string[] {
  return [
    // HAProxy answers a pod it could not reach with 503; callplane's answer for it is 502 (the
    // marker tells HAProxy's own answers from a pod's 503)
    `  http-after-response set-status 502 if { res.hdr(${GATEWAY_MARK}) -m found } { status 503 }`,
    "  http-after-response set-var(txn.outcome) str(upstream_timeout) if { status 504 }",
    `  http-after-response set-var(txn.outcome) str(upstream_error) if { res.hdr(${GATEWAY_MARK}) -m found } !{ status 504 }`,
    `  http-after-response set-var-fmt(txn.reason) '${GATEWAY_DETAIL}' if { res.hdr(${GATEWAY_MARK}) -m found } !{ status 504 }`,
    `  http-after-response del-header ${GATEWAY_MARK}`,
  ];
}

/**
 * A server that dials pods over TLS, verified against a CA bundle: its backend, its name in the
 * configuration, and its address and settings for a given bundle (what a CA rotation repeats with
 * the new bundle, haproxy.ts).
 */
export interface PodTlsServer {
  backend: string;
  name: string;
  settings(caFile: string): string;
}

/** The TLS servers to pods: the callbacks' (with upstream TLS) and the tunnels'. */
export function podTlsServers(
  o: Pick<HaproxyConfigOptions, "upstreamTls" | "poolMaxConnections">,
): PodTlsServer[] {
  const tlsTo = (caFile: string, sni: string) =>
    `0.0.0.0:0 ssl verify required ca-file ${caFile} sni ${sni} alpn http/1.1 ssl-min-ver TLSv1.2`;
  const pool = o.poolMaxConnections ? ` pool-max-conn ${o.poolMaxConnections}` : "";
  return [
    ...(o.upstreamTls
      ? [
          {
            backend: "invocation_pods",
            name: "pod",
            settings: (ca: string) => `${tlsTo(ca, "var(txn.pod)")}${pool}`,
          },
        ]
      : []),
    { backend: "grpc_pods", name: "grpc", settings: (ca: string) => tlsTo(ca, "var(txn.target)") },
  ];
}

/** The backends `invocation_pods` (callbacks) and `grpc_pods` (tunnels). */
export function backendLines(o: HaproxyConfigOptions): string[] {
  const pool = o.poolMaxConnections ? ` pool-max-conn ${o.poolMaxConnections}` : "";
  const server = (backend: string) => {
    const s = podTlsServers(o).find((x) => x.backend === backend);
    return s ? `  server ${s.name} ${s.settings(o.files.podCa)}` : `  server pod 0.0.0.0:0${pool}`;
  };
  return [
    "backend invocation_pods",
    // connections to a pod are pooled and shared by every worker's callbacks to it
    "  http-reuse always",
    `  http-request set-uri ${ATTACH_PATH}`,
    // the proxy's own hop: neither is meant for the pod (HAProxy answers 100-continue itself)
    "  http-request del-header proxy-connection",
    "  http-request del-header keep-alive",
    "  http-request del-header expect",
    "  http-request set-header host %[var(txn.authority)]",
    server("invocation_pods"),
    ...gatewayErrors(o),
    "",
    "backend grpc_pods",
    server("grpc_pods"),
    ...gatewayErrors(o),
    "",
  ];
}

function gatewayErrors(o: HaproxyConfigOptions): string[] {
  const mark = ` hdr ${GATEWAY_MARK} 1`;
  return [
    `  http-error status 502 content-type application/problem+json${mark} lf-string '${problem("UPSTREAM_UNAVAILABLE", `${GATEWAY_DETAIL}; the worker should give up on this request`)}'`,
    `  http-error status 503 content-type application/problem+json${mark} lf-string '${problem("UPSTREAM_UNAVAILABLE", `${GATEWAY_DETAIL}; the worker should give up on this request`)}'`,
    `  http-error status 504 content-type application/problem+json${mark} lf-string '${problem("UPSTREAM_TIMEOUT", `the pod ${quoted("var(txn.target)")} did not answer within ${seconds(o.timeouts.idleMs)}; the worker should give up on this request`)}'`,
  ];
}
