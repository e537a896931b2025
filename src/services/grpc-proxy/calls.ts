// One client gRPC call, a stream on a client's HTTP/2 connection: its shape is checked
// (admission.ts), its API key authorized for a gRPC function and counted against the key's bound
// (in-flight.ts), its session found or started (sessions.ts); if the worker's tunnel is not up yet
// the call waits for it (until the call's deadline, if any); then the stream passes through the
// tunnel as bytes (forwardStream: any method of the function's services, with metadata, trailers,
// deadlines, resets and flow control intact). A call that cannot go through is answered by
// grpc-proxy itself (trailers-only, with the session's nvcf-reqid and the refusal's code).
import {
  constants as h2,
  type ClientHttp2Session,
  type IncomingHttpHeaders,
  type ServerHttp2Stream,
} from "node:http2";
import { CallplaneError, GRPC_STATUS, toCallplaneError } from "../../lib/errors.js";
import {
  formatGrpcTimeout,
  forwardStream,
  GRPC,
  nextHopRequestHeaders,
  refuseStream,
  statusOfReset,
  type StreamResult,
} from "../../lib/grpc/index.js";
import { isUuid, newRequestId } from "../../lib/ids.js";
import type { Logger } from "../../lib/log.js";
import type { AuthCache } from "../../plane/auth-cache.js";
import type { HostNames } from "../../lib/http/index.js";
import { admitCall, grpcGrant } from "./admission.js";
import type { KeyInFlight } from "../../plane/key-limit.js";
import { first } from "./metadata.js";
import type { GrpcCallSeries, GrpcProxyMetrics } from "./metrics.js";
import type { Session } from "./session.js";
import { CLEAR_SESSION_COOKIE, resumeIdOf, sessionCookie, type SessionTable } from "./sessions.js";
import type { ProxyState } from "./state.js";
import { ATTR, traceGrpcCall, type TraceSpan } from "../../lib/tracing/index.js";
import { NVCF_HEADERS } from "../../lib/contract.js";

/** grpc-proxy's own refusals carry their stable code (docs/errors.md) in this metadata. */
export const REFUSAL_CODE_HEADER = "callplane-code";

/** Request headers that end here: the API key, and the session routing that only this hop reads. */
const DROP_UPSTREAM = new Set(["authorization", "cookie"]);

export interface CallDeps {
  auth: AuthCache;
  sessions: SessionTable;
  state: ProxyState;
  metrics: Pick<GrpcProxyMetrics, "begin" | "refusals">;
  logger: Logger;
  holderId: number;
  /** The host names the client port serves besides IP literals and localhost (global.hosts). */
  hosts: HostNames;
  /** Each key's calls in flight on this replica (grpcproxy.maxInFlightPerKey). */
  callBudget: KeyInFlight;
}

export class Calls {
  constructor(private readonly deps: CallDeps) {}

  /** A client's call, from its first HEADERS to its answer; never throws. */
  async onStream(
    stream: ServerHttp2Stream,
    headers: IncomingHttpHeaders,
    flags: number,
    rawHeaders: readonly string[],
  ): Promise<void> {
    const conn = stream.session;
    const started = performance.now();
    let session: Session | undefined;
    let fn: GrpcCallSeries | undefined;
    let began = false;
    let release: (() => void) | undefined;
    const span = this.deps.state.tracing && traceGrpcCall(this.deps.state.tracing, headers);
    try {
      if (this.deps.state.closing || !conn)
        throw new CallplaneError(
          "SHUTTING_DOWN",
          "this grpc-proxy replica is shutting down; retry on another connection",
        );
      const { deadlineMs } = admitCall(headers, rawHeaders, this.deps.hosts);
      const deadlineAt = deadlineMs === undefined ? undefined : performance.now() + deadlineMs;
      const apiKey = apiKeyOf(headers);
      const { functionId, pinned } = routingOf(headers);
      const grant = grpcGrant(await this.deps.auth.authorize(apiKey, functionId, pinned), pinned);
      release = this.deps.callBudget.acquire(grant.keyId).release;
      const resumeId = resumeIdOf(headers);
      session = resumeId
        ? await this.deps.sessions.resume(conn, resumeId, grant, functionId, pinned)
        : this.deps.sessions.sessionFor(conn, grant, functionId, pinned, span);
      span?.identify(session.requestId, functionId, session.functionVersionId);
      session.begin();
      began = true;
      fn = this.deps.metrics.begin(session);
      const tunnel =
        session.state === "open" && session.tunnel && !session.tunnel.closed
          ? session.tunnel
          : await waitForWorker(stream, deadlineMs, session);
      const result = await this.forward(stream, headers, flags, session, tunnel, deadlineAt, span);
      fn.end(result.outcome, result.grpcStatus, started, result.firstByteAt);
    } catch (err) {
      span?.fail(err);
      const e = this.refuse(stream, headers, err, session);
      fn?.end(e.code === "CLIENT_GONE" ? "client_gone" : "refused", GRPC_STATUS[e.code], started);
    } finally {
      if (began) session?.finish();
      fn?.inFlight.dec();
      release?.();
      span?.end();
    }
  }

  /** Passes the call through the worker's tunnel and its answer back. */
  private async forward(
    stream: ServerHttp2Stream,
    headers: IncomingHttpHeaders,
    flags: number,
    session: Session,
    tunnel: ClientHttp2Session,
    deadlineAt: number | undefined,
    span: TraceSpan | undefined,
  ): Promise<StreamResult> {
    const extra: Record<string, string> = { [NVCF_HEADERS.reqId]: session.requestId };
    const upstream: Record<string, string> = { [NVCF_HEADERS.reqId]: session.requestId };
    // the worker's call to the inference server goes under this call's span
    span?.inject(upstream);
    // what is left of the call's deadline after the wait for the worker, in a form every server's
    // timer holds (a client's 2147484S would overflow a 32-bit one)
    if (deadlineAt !== undefined)
      upstream["grpc-timeout"] = formatGrpcTimeout(deadlineAt - performance.now());
    if (!session.cookieSent) {
      session.cookieSent = true;
      extra["set-cookie"] = sessionCookie(session.requestId);
    }
    const result: StreamResult = await forwardStream(
      stream,
      headers,
      !!(flags & h2.NGHTTP2_FLAG_END_STREAM),
      tunnel,
      nextHopRequestHeaders(headers, DROP_UPSTREAM, upstream),
      {
        responseHeaders: extra,
        failure: (code, gone) => ({
          grpcStatus:
            gone || code === h2.NGHTTP2_NO_ERROR || code === h2.NGHTTP2_REFUSED_STREAM
              ? GRPC.UNAVAILABLE
              : statusOfReset(code),
          httpStatus: 503,
          message: gone
            ? `the worker's tunnel for session ${session.requestId} closed during the call; retry (a call without nvcf-reqid starts a new session)`
            : `the worker reset the call (HTTP/2 code ${code})`,
        }),
      },
    );
    span
      ?.set("rpc.grpc.status_code", result.grpcStatus === undefined ? undefined : Number(result.grpcStatus))
      .set(ATTR.outcome, result.outcome);
    return result;
  }

  /** Answers a call that did not go through, from grpc-proxy itself; says with which error. */
  private refuse(
    stream: ServerHttp2Stream,
    headers: IncomingHttpHeaders,
    err: unknown,
    session: Session | undefined,
  ): CallplaneError {
    const { logger } = this.deps;
    const e = toCallplaneError(err);
    if (e.code === "INTERNAL") logger.error({ err, requestId: session?.requestId }, "call failed");
    else if (e.code !== "CLIENT_GONE")
      logger.info({ requestId: session?.requestId, code: e.code, reason: e.message }, "call refused");
    this.deps.metrics.refusals.inc({ code: e.code });
    const extra: Record<string, string> = {
      [NVCF_HEADERS.reqId]: session?.requestId ?? newRequestId(this.deps.holderId),
      [REFUSAL_CODE_HEADER]: e.code,
    };
    if (e.code === "SESSION_NOT_FOUND") extra["set-cookie"] = CLEAR_SESSION_COOKIE;
    refuseStream(
      stream,
      headers,
      { grpcStatus: GRPC_STATUS[e.code], httpStatus: e.status, message: e.message },
      extra,
    );
    return e;
  }
}

/** A call that arrives before its session's tunnel waits for it (until the call's deadline, if any). */
export async function waitForWorker(
  stream: ServerHttp2Stream,
  deadlineMs: number | undefined,
  session: Session,
): Promise<ClientHttp2Session> {
  const ended = new AbortController();
  const onClose = () =>
    ended.abort(
      new CallplaneError("CLIENT_GONE", "the client cancelled the call while it waited for its worker"),
    );
  stream.once("close", onClose);
  const deadline =
    deadlineMs === undefined
      ? undefined
      : setTimeout(
          () =>
            ended.abort(
              new CallplaneError(
                "WORKER_LINK_TIMEOUT",
                `failed to establish link to worker within the call's deadline (${deadlineMs} ms)`,
              ),
            ),
          deadlineMs,
        );
  try {
    return await session.waitForTunnel(ended.signal);
  } finally {
    clearTimeout(deadline);
    stream.off("close", onClose);
  }
}

function apiKeyOf(headers: IncomingHttpHeaders): string {
  const h = first(headers.authorization);
  if (!h)
    throw new CallplaneError(
      "UNAUTHENTICATED",
      "the call has no authorization metadata: send authorization: Bearer <API key>",
    );
  const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
  if (!m)
    throw new CallplaneError(
      "UNAUTHENTICATED",
      "the authorization metadata must use the Bearer scheme: authorization: Bearer <API key>",
    );
  return m[1];
}

/** The function a call is for (function-id) and the version it pins (function-version-id), checked. */
function routingOf(headers: IncomingHttpHeaders): { functionId: string; pinned: string | undefined } {
  const functionId = first(headers["function-id"]);
  if (!functionId)
    throw new CallplaneError(
      "FUNCTION_ID_REQUIRED",
      "the call has no function-id metadata: send function-id: <function id> (and optionally function-version-id)",
    );
  if (!isUuid(functionId))
    throw new CallplaneError("FUNCTION_NOT_FOUND", `function-id "${functionId.slice(0, 60)}" is not a UUID`);
  const pinned = first(headers["function-version-id"]);
  if (pinned !== undefined && !isUuid(pinned))
    throw new CallplaneError(
      "VERSION_NOT_FOUND",
      `function-version-id "${pinned.slice(0, 60)}" is not a UUID`,
    );
  return { functionId, pinned };
}
