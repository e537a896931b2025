// The checks of the callback proxy's frontend, which every request passes before HAProxy opens any
// connection to a pod. The server name decides first: `<dashed-ip>.<workerDomain>` is a gRPC tunnel
// to that grpc-proxy pod, any other name (or none) an HTTP callback.
//
// A callback is a forward-proxy request whose absolute-form target is exactly
// `http://<dashed-ipv4>.invocation.<serviceDomain>:<podPort>/v2/nvcf/worker/request-attach`, with
// octets in range, no leading zeros, inside `podNetworks`, GET or POST, one Host header naming the
// same pod, plain framing. A tunnel is a CONNECT to a grpc-proxy pod inside `podNetworks`. Anything
// else is answered by HAProxy itself (an RFC 7807 body with callplane's stable error code, and the
// refusal's outcome and reason for the access log). The pod's address is read out of the name: no
// DNS is asked, so there is nothing to rebind.
//
// CONNECT tunnels to invocation pods are not offered: workers never ask for one (their callbacks
// are absolute-form requests), and HAProxy cannot answer a CONNECT itself.
import { ATTACH_PATH } from "../../lib/contract.js";
import { CallplaneError, type ErrorCode } from "../../lib/errors.js";
import { parseCidr, POD_SERVICES } from "../../lib/net/index.js";
import type { HaproxyConfigOptions } from "./haproxy-options.js";
import { lf, problem, quoted } from "./haproxy-syntax.js";

const OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])";
const DASHED_IPV4 = `${OCTET}-${OCTET}-${OCTET}-${OCTET}`;
/** The scheme a callback's target names (the proxy itself encrypts to the pod). */
const SCHEME = "http";

function regexEscape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
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

/** The frontend's checks: what they read, taken apart once, then each refusal in turn. */
export function checkLines(o: HaproxyConfigOptions): string[] {
  return [...readLines(o), ...refusals(o).flatMap(refusalLines)];
}

/** The variables and ACLs the refusals test (the access log reads the variables too). */
function readLines(o: HaproxyConfigOptions): string[] {
  const domain = regexEscape(o.serviceDomain.toLowerCase());
  const workerDomain = regexEscape(o.workerDomain.toLowerCase());
  const podNetworks = o.podNetworks.map((n) => parseCidr(n).text).join(" ");
  const podName = `^${DASHED_IPV4}\\.${POD_SERVICES.invocation}\\.${domain}$`;
  const grpcName = `${POD_SERVICES.grpc}.${o.serviceDomain}`;
  return [
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
    `  acl http_scheme var(txn.scheme) -m str -i ${SCHEME}`,
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
  ];
}

/** Each refusal, in the order the frontend tries them: the first that matches answers. */
function refusals(o: HaproxyConfigOptions): Refusal[] {
  const authority = `<dashed-ip>.invocation.${o.serviceDomain}:${o.podPort}`;
  const example = `POST http://${authority}${ATTACH_PATH}`;
  return [
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
      detail: `the target scheme must be ${SCHEME} (the proxy itself encrypts to the pod), not ${quoted("var(txn.scheme)")}`,
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
}
