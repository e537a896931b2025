// The spans callplane makes, one function per hop, so that each place in a service is one call
// (docs/operations.md lists them with their attributes). One HTTP invocation's trace:
//
//   invocation  POST /v2/nvcf/pexec/functions/:fid      (server; a client's traceparent continued)
//   invocation    send rq.<region>.<version>.*          (producer; its context rides in the NATS headers)
//   worker          process rq.<region>.<version>.*     (consumer; parent and link: the creation context)
//   worker            POST <inference path>             (client; the inference server gets its traceparent)
//   worker            POST request-attach               (client; through the callback proxy)
//                     or send callplane.answer.*         (client; a small answer over NATS)
//   invocation          POST /v2/nvcf/worker/request-attach   (server; relayed: a relay span between)
//
// and a gRPC call's: the call (server) on grpc-proxy, the session's publish under the call that
// started it, the worker's process span, its tunnel (CONNECT, client) and grpc-proxy's side of it
// (server), and per call the worker's call to the inference server (client), under the call.
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from "node:http";
import { headers as natsHeaders, type MsgHdrs } from "@nats-io/transport-node";
import { ATTR, KIND as SpanKind, MESSAGING_SYSTEM, WORK_SUBJECT_TEMPLATE } from "./names.js";
import type { TraceHeaders, TraceSpan, Tracing } from "./tracing.js";

/** The name of a work queue's spans: the subject without the request id (a bounded set of names). */
function workDestination(region: string, functionVersionId: string): string {
  return `rq.${region}.${functionVersionId}.*`;
}

/**
 * A request on an HTTP front door (lib/http/server.ts), named by its route: it continues the
 * caller's traceparent (a client's, a worker's, a relaying replica's) or starts a trace, and ends
 * when the response does, with its status (5xx: failed).
 */
export function traceHttpServer(
  tracing: Tracing,
  req: IncomingMessage,
  res: ServerResponse,
  route: string,
): TraceSpan {
  const method = req.method ?? "GET";
  // (no url.path: the route and the request's ids say it, and every attribute is written per span)
  const span = tracing.continueFrom(req.headers, `${method} ${route}`, SpanKind.SERVER, {
    "http.request.method": method,
    "http.route": route,
    "client.address": req.socket.remoteAddress,
  });
  // an unrecorded span (99 requests in 100 under npm start) has no end to write
  if (span.recording)
    res.once("close", () => {
      span.set("http.response.status_code", res.statusCode);
      span.end(res.statusCode >= 500 ? new HttpStatusError(res.statusCode) : undefined);
    });
  return span;
}

class HttpStatusError extends Error {
  readonly code: string;
  constructor(status: number) {
    super(`HTTP ${status}`);
    this.code = String(status);
  }
}

/**
 * The work message's publish (plane/work-queue.ts): a producer span under `parent`, and the NATS
 * headers that carry its context (the creation context) to the worker.
 */
export function tracePublish(
  parent: TraceSpan,
  region: string,
  functionVersionId: string,
  requestId: string,
  bytes: number,
): { span: TraceSpan; headers: MsgHdrs } {
  const span = parent.child(`send ${workDestination(region, functionVersionId)}`, SpanKind.PRODUCER, {
    "messaging.system": MESSAGING_SYSTEM,
    "messaging.operation.type": "send",
    "messaging.destination.template": WORK_SUBJECT_TEMPLATE,
    "messaging.message.body.size": bytes,
    [ATTR.requestId]: requestId,
    [ATTR.functionVersionId]: functionVersionId,
  });
  const h = natsHeaders();
  const carrier: Record<string, string> = {};
  span.inject(carrier);
  for (const k in carrier) h.set(k, carrier[k]);
  return { span, headers: h };
}

/** A NATS message's trace headers. */
function fromNats(h: MsgHdrs | undefined): TraceHeaders {
  if (!h) return {};
  return { traceparent: h.get("traceparent") || undefined, tracestate: h.get("tracestate") || undefined };
}

/**
 * The worker's work on one message (worker/dispatch.ts), from pull to ack: its parent is the
 * message's creation context (the replica's publish), which it also links to.
 */
export function traceWork(
  tracing: Tracing,
  msgHeaders: MsgHdrs | undefined,
  cfg: { region: string; functionId: string; functionVersionId: string },
  consumer: string,
): TraceSpan {
  return tracing.consume(
    fromNats(msgHeaders),
    `process ${workDestination(cfg.region, cfg.functionVersionId)}`,
    {
      "messaging.system": MESSAGING_SYSTEM,
      "messaging.operation.type": "process",
      "messaging.operation.name": "process",
      "messaging.destination.template": WORK_SUBJECT_TEMPLATE,
      "messaging.consumer.group.name": consumer,
      [ATTR.functionId]: cfg.functionId,
      [ATTR.functionVersionId]: cfg.functionVersionId,
    },
  );
}

/**
 * The worker's call to the inference server (worker/inference-call.ts): a client span whose
 * traceparent goes in `headers`, so an inference server that traces joins the trace under it.
 */
export function traceInference(
  work: TraceSpan,
  method: string,
  path: string,
  server: { host: string; port: number },
  headers: Record<string, string | string[]>,
): TraceSpan {
  const q = path.indexOf("?");
  const p = q === -1 ? path : path.slice(0, q);
  const span = work.child(`${method} ${p}`, SpanKind.CLIENT, {
    "http.request.method": method,
    "url.path": p,
    "server.address": server.host,
    "server.port": server.port,
  });
  span.inject(headers);
  return span;
}

/**
 * One of the worker's callbacks to the replica (worker/callback.ts): GET request-attach (the rest
 * of the body) or POST request-attach (the answer). Its traceparent, and the request id (so a
 * replica that relays the callback can name it), go in `headers`; HAProxy passes both untouched.
 */
export function traceCallback(
  work: TraceSpan,
  method: "GET" | "POST",
  target: { targetUri: string; proxyUri?: string | undefined },
  headers: Record<string, string>,
): TraceSpan {
  const span = work.child(`${method} request-attach`, SpanKind.CLIENT, {
    "http.request.method": method,
    "url.full": target.targetUri,
    [ATTR.attachKind]: method === "GET" ? "request" : "response",
    ...(target.proxyUri ? { [ATTR.callbackProxy]: target.proxyUri } : {}),
  });
  span.inject(headers);
  if (work.requestId) headers["nvcf-reqid"] = work.requestId;
  return span;
}

/**
 * A small answer sent over NATS to the replica that holds its request (worker/nats-answer.ts): a
 * client span under the work item's span, ended with the replica's reply (its status recorded).
 * The replica makes no span of its own for it (the message carries no headers).
 */
export function traceNatsAnswer(work: TraceSpan, subject: string): TraceSpan {
  return work.child(`send ${subject.replace(/[^.]+$/, "*")}`, SpanKind.CLIENT, {
    "messaging.system": MESSAGING_SYSTEM,
    "messaging.destination.name": subject,
    [ATTR.attachKind]: "response",
  });
}

/**
 * A replica's relay of a callback to the replica that holds its request (plane/relay.ts): a client
 * span under the callback's own span, whose traceparent replaces the worker's on the way.
 */
export function traceRelay(
  parent: TraceSpan,
  req: IncomingMessage,
  holder: string,
  to: string,
  headers: Record<string, string | string[]>,
): TraceSpan {
  const id = first(req.headers["nvcf-reqid"]);
  if (id) parent.identify(id);
  const span = parent.child(`relay ${req.method ?? "POST"} request-attach`, SpanKind.CLIENT, {
    "http.request.method": req.method ?? "POST",
    "url.full": to,
    [ATTR.relayHolder]: holder,
  });
  if (id) span.identify(id);
  span.inject(headers);
  return span;
}

function first(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}

/** A client's gRPC call on grpc-proxy (grpc-proxy/calls.ts), continuing its traceparent metadata. */
export function traceGrpcCall(tracing: Tracing, headers: IncomingHttpHeaders): TraceSpan {
  const path = first(headers[":path"]) ?? "/";
  const slash = path.lastIndexOf("/");
  return tracing.continueFrom(headers, path.slice(1), SpanKind.SERVER, {
    "rpc.system": "grpc",
    "rpc.service": path.slice(1, Math.max(1, slash)),
    "rpc.method": path.slice(slash + 1),
  });
}

/** The worker opening its tunnel to grpc-proxy (worker/stateful.ts): CONNECT, with its traceparent. */
export function traceTunnelOpen(work: TraceSpan, proxyUri: string): { span: TraceSpan; traceparent: string } {
  const span = work.child("CONNECT tunnel", SpanKind.CLIENT, {
    "http.request.method": "CONNECT",
    "url.full": proxyUri,
  });
  const h: { traceparent?: string } = {};
  span.inject(h);
  return { span, traceparent: h.traceparent ?? "" };
}

const tunnelSpans = new WeakMap<IncomingMessage, TraceSpan>();

/**
 * grpc-proxy taking a worker's tunnel (grpc-proxy/tunnels.ts), from its CONNECT to the 200, a
 * relay to the replica that holds the session, or a refusal (tunnelAnswered ends it).
 */
export function traceTunnel(tracing: Tracing, req: IncomingMessage): void {
  const span = tracing.continueFrom(req.headers, "CONNECT /v1/proxy", SpanKind.SERVER, {
    "http.request.method": "CONNECT",
    "client.address": req.socket.remoteAddress,
  });
  const id = first(req.headers["x-request-id"]);
  if (id) span.identify(id);
  tunnelSpans.set(req, span);
  // a tunnel whose connection ends unanswered (a relay that failed to connect) still ends its span
  req.socket.once("close", () =>
    tunnelAnswered(req, "closed", { err: "the connection closed before an answer" }),
  );
}

/** The CONNECT was answered: `result` as tunnels count it (ok, relayed, bad_token, ...); `err` if refused. */
export function tunnelAnswered(
  req: IncomingMessage,
  result: string,
  opts: { status?: number; err?: unknown; functionId?: string; functionVersionId?: string } = {},
): void {
  const span = tunnelSpans.get(req);
  if (!span) return;
  tunnelSpans.delete(req);
  const id = span.requestId;
  if (id && opts.functionId) span.identify(id, opts.functionId, opts.functionVersionId);
  span.set(ATTR.outcome, result).set("http.response.status_code", opts.status).end(opts.err);
}

/**
 * One gRPC call the worker passes from its tunnel to the inference server (worker/stateful.ts): a
 * client span under the call's span on grpc-proxy (its traceparent came through the tunnel), linked
 * to the session's work; its traceparent replaces that one on the way to the inference server.
 */
export function traceGrpcInference(
  work: TraceSpan,
  headers: IncomingHttpHeaders,
  server: { host: string; port: number },
  out: Record<string, string>,
): TraceSpan {
  const path = first(headers[":path"]) ?? "/";
  const slash = path.lastIndexOf("/");
  const span = work.childOf(headers, path.slice(1), SpanKind.CLIENT, {
    "rpc.system": "grpc",
    "rpc.service": path.slice(1, Math.max(1, slash)),
    "rpc.method": path.slice(slash + 1),
    "server.address": server.host,
    "server.port": server.port,
  });
  span.inject(out);
  return span;
}
