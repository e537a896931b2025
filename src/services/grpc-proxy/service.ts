// grpc-proxy: clients invoke functions over gRPC (contract §4). A client's HTTP/2 connection and
// function routing (function-id, function-version-id metadata) make a session: the first call
// puts one work message on the version's queue, carrying a single-use CONNECT token (30 s) and the
// address of this replica's tunnel listener; the worker that takes it opens a tunnel back
// (HTTP/1 CONNECT, §4.3), over which the roles invert: this replica is the HTTP/2 client, the
// worker serves it and passes each call to the inference server. Every call of the session reuses
// that tunnel; calls pass through as bytes (any service, any method), with metadata, trailers,
// deadlines, resets and flow control intact.
//
// Tunnels can reach this replica three ways: directly on its CONNECT listener (in-cluster), on its
// worker TLS listener through the callback proxy (another network), or relayed from another
// replica that a shared connect address sent them to (the token names its holder, the registry of
// live replicas gives its address).
import { create, toBinary } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { RequestError, type NatsConnection } from "@nats-io/transport-node";
import type { IncomingMessage } from "node:http";
import {
  connect as h2connect,
  constants as h2,
  createSecureServer,
  createServer as createH2Server,
  type Http2SecureServer,
  type Http2Server,
  type Http2Session,
  type IncomingHttpHeaders,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from "node:http2";
import { connect as netConnect, isIPv4, type Socket } from "node:net";
import { createServer as createTlsServer, type Server as TlsServer, type TLSSocket } from "node:tls";
import { WorkerInvokeFunctionRequestSchema } from "../../gen/nvcf/worker_pb.js";
import { CallplaneError, GRPC_STATUS, toCallplaneError } from "../../lib/errors.js";
import { GRPC, grpcTimeoutMs, refuseStream, statusOfReset } from "../../lib/grpc.js";
import {
  H2_SESSION_OPTIONS,
  forwardStream,
  nextHopRequestHeaders,
  widenWindow,
  type StreamResult,
} from "../../lib/h2-forward.js";
import { Router, createHttpService, rawProblem } from "../../lib/http.js";
import { holderHex, isUuid, newHolderId, newRequestId } from "../../lib/ids.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { Counter, Gauge, createRegistry, type Registry } from "../../lib/metrics.js";
import {
  SOCKET_BUFFER_BYTES,
  dashIp,
  formatHostPort,
  widenSocketBuffers,
  type HostPort,
} from "../../lib/net.js";
import { connectNats, subjects, type QueueLimits } from "../../lib/queue.js";
import { TlsReloader } from "../../lib/tls-reload.js";
import { createAuthCache, type AuthCacheSettings, type Grant } from "../../plane/auth-cache.js";
import { PendingTable } from "../../plane/pending.js";
import { REGISTRY_BUCKETS, ReplicaRegistry } from "../../plane/registry.js";
import { RELAYED_HEADER } from "../../plane/relay.js";
import { TokenTable, tokenHolder } from "../../plane/tokens.js";
import { WorkPublisher, askApiForQueue } from "../../plane/work-queue.js";
import type { NatsAccess } from "../../lib/nats-auth.js";
import { Session } from "./session.js";

export const CONNECT_PATH = "/v1/proxy";
export const SESSION_COOKIE = "nvcf-request-id";

export interface GrpcProxyOptions {
  /** The client listener (the pod's address, port 10081). */
  listen: HostPort;
  /** The HTTP/1 CONNECT listener for in-cluster workers (10086; 0 picks one). */
  connectPort: number;
  /** Workers through the callback proxy: a TLS listener with the pod certificate (10084). */
  workerTls?: { port: number; certFile: string; keyFile: string } | undefined;
  /** TLS with ALPN h2 on the client listener, instead of cleartext HTTP/2. */
  clientTls?: { certFile: string; keyFile: string } | undefined;
  region: string;
  serviceDomain: string;
  /** How this replica reaches NATS (natsAccess(config, "grpc-proxy")). */
  nats: NatsAccess;
  apiUrl: string;
  serviceToken: string;
  queue: QueueLimits;
  authCache?: AuthCacheSettings;
  /** A connect URL shared by every replica (grpcproxy.workerConnectBaseURL), instead of the pod's own. */
  sharedConnectUrl?: string | undefined;
  /** Workers reach this replica through the callback proxy: the name its SNI routing reads. */
  callbackProxy?: { workerDomain: string; port: number } | undefined;
  /** A session with no call in flight this long closes (30 s). */
  sessionIdleMs?: number;
  /** How long a CONNECT token is valid, and so how long a call waits for its worker (30 s). */
  connectTokenTtlMs?: number;
  relay?: { enabled: boolean; registryTtlMs?: number };
  holderId?: number;
  logger?: Logger;
  registry?: Registry;
}

export interface GrpcProxyUrls {
  client: URL;
  connect: URL;
  workerTls: URL | undefined;
}

/** Request headers that end here: the API key, and the session routing that only this hop reads. */
const DROP_UPSTREAM = new Set(["authorization", "cookie"]);

const first = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

function cookieValue(header: string | string[] | undefined, name: string): string | undefined {
  for (const h of Array.isArray(header) ? header : header ? [header] : []) {
    for (const part of h.split(";")) {
      const i = part.indexOf("=");
      if (i !== -1 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim();
    }
  }
  return undefined;
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

export function createGrpcProxy(opts: GrpcProxyOptions) {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("grpc-proxy");
  const holderId = opts.holderId ?? newHolderId();
  const idleMs = opts.sessionIdleMs ?? 30_000;
  const tokenTtlMs = opts.connectTokenTtlMs ?? 30_000;
  const auth = createAuthCache(opts, logger, registry);
  const calls = new Counter({
    name: "callplane_grpc_calls_total",
    help: "Client gRPC calls by outcome (ok: passed through and answered; refused: answered by grpc-proxy itself; reset; failed: the tunnel failed)",
    labelNames: ["outcome"],
    registers: [registry],
  });
  const tunnels = new Counter({
    name: "callplane_grpc_tunnels_total",
    help: "Worker CONNECT requests by result",
    labelNames: ["result"],
    registers: [registry],
  });
  const openSessions = new Gauge({
    name: "callplane_grpc_sessions_open",
    help: "Worker sessions with a tunnel to this replica",
    registers: [registry],
  });
  const waitingSessions = new Gauge({
    name: "callplane_grpc_sessions_waiting",
    help: "Sessions waiting for their worker's tunnel",
    registers: [registry],
  });

  const tokens = new TokenTable<Session>(holderId, tokenTtlMs);
  const waiting = new PendingTable<Session>(waitingSessions);
  const sessions = new Map<string, Session>();
  const byConnection = new WeakMap<Http2Session, Map<string, Session>>();
  const clientSessions = new Set<ServerHttp2Session>();
  let nc: NatsConnection | undefined;
  let publisher: WorkPublisher | undefined;
  let replicas: ReplicaRegistry | undefined;
  let connectUri = "";
  let closing = false;
  // readiness has failed (a stop began); calls are still taken until the drain delay is over
  let draining = false;
  /** destroy(): NATS is being closed under everything, so nothing publishes any more. */
  let destroyed = false;
  const reloaders: TlsReloader[] = [];

  // ------------------------------------------------------------------ sessions

  function workMessage(s: Session, token: string, grant: Pick<Grant, "ncaId" | "subject">): Uint8Array {
    return toBinary(
      WorkerInvokeFunctionRequestSchema,
      create(WorkerInvokeFunctionRequestSchema, {
        requestId: s.requestId,
        ncaId: grant.ncaId,
        subject: grant.subject,
        requestTime: timestampFromMs(Date.now()),
        // the worker checks a reconnect against the function it serves
        requestHeaders: [
          { key: "function-id", value: s.functionId },
          { key: "function-version-id", value: s.functionVersionId },
        ],
        statefulConfig: {
          nvcfRegionOfInvoker: opts.region,
          connectionConfigs: [
            {
              config: {
                case: "http1Config",
                value: { proxyURI: connectUri, proxyAuthorizationToken: token },
              },
            },
          ],
        },
      }),
    );
  }

  function newSession(requestId: string, functionId: string, functionVersionId: string): Session {
    const s = new Session(requestId, functionId, functionVersionId, idleMs, (ended, why) => {
      tokens.delete(ended.token);
      if (waiting.release(ended)) {
        // never reached by a worker: take the work back (a resumption queued none)
        if (!ended.resumed && !destroyed)
          publisher?.cancel(ended.functionVersionId, ended.requestId, why, ended.seq);
      } else openSessions.dec();
      if (sessions.get(ended.requestId) === ended) sessions.delete(ended.requestId);
      logger.info({ requestId: ended.requestId, functionId: ended.functionId, why }, "session ended");
    });
    s.token = tokens.mint(s);
    sessions.set(requestId, s);
    waiting.add(s, tokenTtlMs, () =>
      s.end(
        new CallplaneError(
          "WORKER_LINK_TIMEOUT",
          `failed to establish link to worker: no worker of function ${functionId} (version ${functionVersionId}) connected within ${Math.round(tokenTtlMs / 1000)} s; check that the function is deployed and its instances are ACTIVE (callplane deploy get)`,
        ),
        "no worker in time",
      ),
    );
    return s;
  }

  /** The session a call on this connection with this routing belongs to, started if need be. */
  function sessionFor(
    conn: Http2Session,
    grant: Grant,
    functionId: string,
    pinned: string | undefined,
  ): Session {
    let routes = byConnection.get(conn);
    if (!routes) {
      routes = new Map();
      byConnection.set(conn, routes);
    }
    const route = `${functionId}|${pinned ?? ""}`;
    const known = routes.get(route);
    if (known && known.state !== "closed") return known;
    const versions = grant.functionVersions;
    const version =
      versions.length === 1 ? versions[0] : versions[Math.floor(Math.random() * versions.length)];
    const s = newSession(newRequestId(holderId), functionId, version.functionVersionId);
    routes.set(route, s);
    publisher!.publish(version.functionVersionId, s.requestId, workMessage(s, s.token!, grant)).then(
      (seq) => {
        s.seq = seq;
        logger.debug({ requestId: s.requestId, functionId, seq }, "session queued");
      },
      (err: unknown) => s.end(toCallplaneError(err), "publish failed"),
    );
    return s;
  }

  /** A call that names a session (nvcf-reqid): the one held here, or the worker asked for a tunnel here. */
  async function resume(
    conn: Http2Session,
    requestId: string,
    grant: Grant,
    functionId: string,
    pinned: string | undefined,
  ): Promise<Session> {
    const notFound = (why: string) =>
      new CallplaneError(
        "SESSION_NOT_FOUND",
        `no existing session found: ${why}; call without nvcf-reqid to start a new one`,
      );
    if (!isUuid(requestId))
      throw notFound(`nvcf-reqid ${JSON.stringify(requestId.slice(0, 60))} is not a request id`);
    const held = sessions.get(requestId);
    const fits = (s: Session) =>
      s.functionId === functionId && (pinned === undefined || s.functionVersionId === pinned);
    if (held && held.state !== "closed") {
      if (!fits(held)) throw notFound(`session ${requestId} belongs to another function`);
      byConnection.get(conn)?.set(`${functionId}|${pinned ?? ""}`, held);
      return held;
    }
    // Held by another replica, or by this one before its tunnel closed: the worker that serves it
    // (if any) opens one more tunnel, to this replica. The reconnect subject names the version
    // (workers may hear only their own), so each version the key may call is asked in turn.
    const versions = pinned ? [pinned] : grant.functionVersions.map((v) => v.functionVersionId);
    let s: Session | undefined;
    let failure: CallplaneError = notFound(`no worker holds session ${requestId} any more`);
    for (const version of versions) {
      const candidate = newSession(requestId, functionId, version);
      candidate.resumed = true;
      try {
        const reply = await nc!.request(
          subjects.reconnect(version, requestId),
          workMessage(candidate, candidate.token!, grant),
          { timeout: 3000 },
        );
        const refusal = reply.string();
        if (refusal) throw notFound(refusal);
        s = candidate;
        break;
      } catch (err) {
        const noOne = err instanceof RequestError && err.isNoResponders();
        if (!noOne)
          failure =
            err instanceof CallplaneError
              ? err
              : new CallplaneError(
                  "UNAVAILABLE",
                  `asking the worker of session ${requestId} to reconnect failed; retry`,
                  { cause: err },
                );
        candidate.end(failure, "reconnect refused");
        if (!noOne) break;
      }
    }
    if (!s) throw failure;
    byConnection.get(conn)?.set(`${functionId}|${pinned ?? ""}`, s);
    return s;
  }

  // ------------------------------------------------------------------ client calls

  async function onStream(
    stream: ServerHttp2Stream,
    headers: IncomingHttpHeaders,
    flags: number,
  ): Promise<void> {
    const conn = stream.session;
    let session: Session | undefined;
    let began = false;
    try {
      if (closing || !conn)
        throw new CallplaneError(
          "SHUTTING_DOWN",
          "this grpc-proxy replica is shutting down; retry on another connection",
        );
      const apiKey = apiKeyOf(headers);
      const functionId = first(headers["function-id"]);
      if (!functionId)
        throw new CallplaneError(
          "FUNCTION_ID_REQUIRED",
          "the call has no function-id metadata: send function-id: <function id> (and optionally function-version-id)",
        );
      if (!isUuid(functionId))
        throw new CallplaneError(
          "FUNCTION_NOT_FOUND",
          `function-id "${functionId.slice(0, 60)}" is not a UUID`,
        );
      const pinned = first(headers["function-version-id"]);
      if (pinned !== undefined && !isUuid(pinned))
        throw new CallplaneError(
          "VERSION_NOT_FOUND",
          `function-version-id "${pinned.slice(0, 60)}" is not a UUID`,
        );
      const grant = await auth.authorize(apiKey, functionId, pinned);
      const resumeId = first(headers["nvcf-reqid"]) ?? cookieValue(headers.cookie, SESSION_COOKIE);
      session = resumeId
        ? await resume(conn, resumeId, grant, functionId, pinned)
        : sessionFor(conn, grant, functionId, pinned);
      session.begin();
      began = true;
      const tunnel =
        session.state === "open" && session.tunnel && !session.tunnel.closed
          ? session.tunnel
          : await waitForWorker(stream, headers, session);
      const extra: Record<string, string> = { "nvcf-reqid": session.requestId };
      if (!session.cookieSent) {
        session.cookieSent = true;
        extra["set-cookie"] = `${SESSION_COOKIE}=${session.requestId}; Path=/; HttpOnly`;
      }
      const result: StreamResult = await forwardStream(
        stream,
        headers,
        !!(flags & h2.NGHTTP2_FLAG_END_STREAM),
        tunnel,
        nextHopRequestHeaders(headers, DROP_UPSTREAM, { "nvcf-reqid": session.requestId }),
        {
          responseHeaders: extra,
          failure: (code, gone) => ({
            grpcStatus:
              gone || code === h2.NGHTTP2_NO_ERROR || code === h2.NGHTTP2_REFUSED_STREAM
                ? GRPC.UNAVAILABLE
                : statusOfReset(code),
            httpStatus: 503,
            message: gone
              ? `the worker's tunnel for session ${session!.requestId} closed during the call; retry (a call without nvcf-reqid starts a new session)`
              : `the worker reset the call (HTTP/2 code ${code})`,
          }),
        },
      );
      calls.inc({ outcome: result.outcome });
    } catch (err) {
      const e = toCallplaneError(err);
      if (e.code === "INTERNAL") logger.error({ err, requestId: session?.requestId }, "call failed");
      else if (e.code !== "CLIENT_GONE")
        logger.info({ requestId: session?.requestId, code: e.code, reason: e.message }, "call refused");
      calls.inc({ outcome: e.code === "CLIENT_GONE" ? "client_gone" : "refused" });
      const extra: Record<string, string> = { "nvcf-reqid": session?.requestId ?? newRequestId(holderId) };
      if (e.code === "SESSION_NOT_FOUND") extra["set-cookie"] = `${SESSION_COOKIE}=; Path=/; Max-Age=0`;
      refuseStream(
        stream,
        headers,
        { grpcStatus: GRPC_STATUS[e.code], httpStatus: e.status, message: e.message },
        extra,
      );
    } finally {
      if (began) session?.finish();
    }
  }

  /** A call that arrives before its session's tunnel waits for it (until the call's deadline, if any). */
  async function waitForWorker(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, session: Session) {
    const ended = new AbortController();
    const onClose = () =>
      ended.abort(
        new CallplaneError("CLIENT_GONE", "the client cancelled the call while it waited for its worker"),
      );
    stream.once("close", onClose);
    const deadlineMs = grpcTimeoutMs(headers["grpc-timeout"]);
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

  function attachClientServer(server: Http2Server | Http2SecureServer): void {
    // small calls one at a time: no Nagle delay on any hop (HTTP/2 sockets cannot be touched once
    // the session has them)
    server.on("connection", (sock: Socket) => sock.setNoDelay(true));
    server.on("session", (s: ServerHttp2Session) => {
      widenWindow(s);
      clientSessions.add(s);
      s.once("close", () => clientSessions.delete(s));
      s.on("error", () => undefined);
    });
    server.on("stream", (stream: ServerHttp2Stream, headers: IncomingHttpHeaders, flags: number) => {
      stream.on("error", () => undefined);
      void onStream(stream, headers, flags);
    });
  }

  let clientTlsReloader: TlsReloader | undefined;
  let clientServer: Http2Server | Http2SecureServer;
  if (opts.clientTls) {
    clientTlsReloader = new TlsReloader(
      "grpc-client-listener",
      { certFile: opts.clientTls.certFile, keyFile: opts.clientTls.keyFile },
      (m) =>
        (clientServer as Http2SecureServer).setSecureContext({
          cert: m.cert,
          key: m.key,
          minVersion: "TLSv1.2",
        }),
      logger,
      registry,
    );
    reloaders.push(clientTlsReloader);
    clientServer = createSecureServer({
      ...H2_SESSION_OPTIONS,
      cert: clientTlsReloader.material.cert,
      key: clientTlsReloader.material.key,
      minVersion: "TLSv1.2",
      ALPNProtocols: ["h2"],
    });
    clientServer.prependListener("secureConnection", widenSocketBuffers);
  } else {
    clientServer = createH2Server({ ...H2_SESSION_OPTIONS });
  }
  attachClientServer(clientServer);

  // ------------------------------------------------------------------ worker tunnels

  function answer(socket: Socket, e: CallplaneError, result: string, req: IncomingMessage): void {
    tunnels.inc({ result });
    logger.info(
      {
        worker: socket.remoteAddress,
        requestId: first(req.headers["x-request-id"]),
        status: e.status,
        reason: e.message,
      },
      "tunnel refused",
    );
    socket.end(rawProblem(e));
  }

  function onConnect(req: IncomingMessage, socket: Socket, head: Buffer): void {
    socket.on("error", () => undefined);
    const authz = first(req.headers.authorization);
    const token = authz ? /^Bearer\s+(\S+)\s*$/i.exec(authz)?.[1] : undefined;
    if (!token) {
      answer(
        socket,
        new CallplaneError(
          "CONNECT_UNAUTHENTICATED",
          "HTTP CONNECT request is missing valid auth: send Authorization: Bearer <proxyAuthorizationToken from the work message>",
        ),
        "unauthenticated",
        req,
      );
      return;
    }
    const requestId = first(req.headers["x-request-id"]);
    if (!requestId || !isUuid(requestId)) {
      answer(
        socket,
        new CallplaneError(
          "CONNECT_REQUEST_ID_INVALID",
          `send X-Request-ID: <the work message's requestId>${requestId ? `, not ${JSON.stringify(requestId.slice(0, 60))}` : ""}`,
        ),
        "bad_request_id",
        req,
      );
      return;
    }
    const session = tokens.take(token, (s) => s.requestId === requestId && s.state === "waiting");
    if (!session) {
      const holder = tokenHolder(token);
      if (
        replicas &&
        holder !== undefined &&
        !tokens.isOwn(token) &&
        req.headers[RELAYED_HEADER] === undefined
      ) {
        void relayTunnel(req, socket, head, holder);
        return;
      }
      answer(
        socket,
        new CallplaneError(
          "CONNECT_TOKEN_INVALID",
          `HTTP CONNECT request is missing valid auth: the token for request ${requestId} is unknown here, already used, expired (${Math.round(tokenTtlMs / 1000)} s) or for another request`,
        ),
        "bad_token",
        req,
      );
      return;
    }
    session.token = undefined;
    tunnels.inc({ result: "ok" });
    socket.setNoDelay(true);
    socket.setTimeout(0);
    // Node's HTTP server accepts sockets half-open; an HTTP/2 session over one never notices the
    // worker's end of the tunnel closing (calls on it would hang), so the socket closes with it.
    socket.allowHalfOpen = false;
    socket.once("end", () => socket.destroy());
    waiting.release(session);
    openSessions.inc();
    // HTTP/2 takes the socket over only once the 200 is written out: a TLS socket with a write still
    // in flight, handed to an HTTP/2 session, aborts the process (node_http2.cc is_write_in_progress)
    socket.write("HTTP/1.1 200 Connection Established\r\n\r\n", () => {
      if (socket.destroyed || session.state === "closed") {
        socket.destroy();
        session.end(undefined, "tunnel closed before it was up");
        return;
      }
      // bytes the worker sent right after its CONNECT belong to the HTTP/2 session
      if (head.length) socket.unshift(head);
      const tunnel = h2connect(`http://${dashIp(opts.listen.host)}.tunnel`, {
        ...H2_SESSION_OPTIONS,
        createConnection: () => socket,
      });
      tunnel.on("error", (err: Error) => logger.debug({ requestId, err: err.message }, "tunnel error"));
      tunnel.once("connect", () => widenWindow(tunnel));
      session.attach(tunnel);
    });
    logger.info(
      {
        requestId,
        worker: socket.remoteAddress,
        // through the callback proxy (the worker TLS listener), or straight to the CONNECT listener
        via: (socket as TLSSocket).encrypted ? "worker-tls" : "connect",
        functionId: session.functionId,
      },
      "tunnel open",
    );
  }

  /** Pipes a tunnel meant for another replica to it, CONNECT request and all. */
  async function relayTunnel(
    req: IncomingMessage,
    socket: Socket,
    head: Buffer,
    holder: number,
  ): Promise<void> {
    const entry = await replicas!.lookup(holder).catch(() => undefined);
    if (!entry) {
      answer(
        socket,
        new CallplaneError(
          "HOLDER_GONE",
          `the grpc-proxy replica ${holderHex(holder)} that holds this session is not in the registry of live replicas; give up on this session`,
        ),
        "holder_gone",
        req,
      );
      return;
    }
    const to = new URL(entry.relayUrl);
    const up = netConnect({
      host: to.hostname,
      port: Number(to.port),
      ...({ highWaterMark: SOCKET_BUFFER_BYTES } as object),
    });
    const started = performance.now();
    let bytes = 0;
    up.once("connect", () => {
      up.setNoDelay(true);
      const lines = [`CONNECT ${req.url ?? CONNECT_PATH} HTTP/1.1`];
      for (let i = 0; i < req.rawHeaders.length; i += 2)
        lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}`);
      lines.push(`${RELAYED_HEADER}: ${holderHex(holderId)}`);
      up.write(`${lines.join("\r\n")}\r\n\r\n`);
      if (head.length) up.write(head);
      up.on("data", (d: Buffer) => (bytes += d.length));
      up.pipe(socket);
      socket.pipe(up);
      tunnels.inc({ result: "relayed" });
    });
    up.once("error", (err) => {
      if (bytes === 0 && !socket.destroyed)
        socket.end(
          rawProblem(
            new CallplaneError(
              "HOLDER_GONE",
              `the grpc-proxy replica ${holderHex(holder)} that holds this session does not answer at ${entry.relayUrl} (${err.message}); give up on this session`,
            ),
          ),
        );
      else socket.destroy();
    });
    socket.once("close", () => up.destroy());
    up.once("close", () => {
      socket.destroy();
      logger.info(
        {
          holder: holderHex(holder),
          to: entry.relayUrl,
          requestId: first(req.headers["x-request-id"]),
          bytesToWorker: bytes,
          durationMs: Math.round(performance.now() - started),
        },
        "relayed a tunnel to the replica that holds it",
      );
    });
  }

  const connectHttp = createHttpService({
    name: "grpc-proxy-connect",
    listen: { host: opts.listen.host, port: opts.connectPort },
    logger,
    registry,
    router: new Router(),
    ready: () => nc !== undefined && !nc.isClosed() && !closing && !draining,
  });
  connectHttp.server.on("connect", onConnect);

  // Through the callback proxy: TLS with the pod certificate, then the same CONNECT inside.
  let workerTls: TlsServer | undefined;
  const workerTlsSockets = new Set<TLSSocket>();
  if (opts.workerTls) {
    const r = new TlsReloader(
      "grpc-worker-listener",
      { certFile: opts.workerTls.certFile, keyFile: opts.workerTls.keyFile },
      (m) => workerTls?.setSecureContext({ cert: m.cert, key: m.key, minVersion: "TLSv1.2" }),
      logger,
      registry,
    );
    reloaders.push(r);
    workerTls = createTlsServer({
      cert: r.material.cert,
      key: r.material.key,
      minVersion: "TLSv1.2",
      ALPNProtocols: ["http/1.1"],
    });
    workerTls.on("secureConnection", (s: TLSSocket) => {
      widenSocketBuffers(s);
      workerTlsSockets.add(s);
      s.once("close", () => workerTlsSockets.delete(s));
      connectHttp.server.emit("connection", s);
    });
    workerTls.on("tlsClientError", (err) =>
      logger.debug({ err: err.message }, "worker TLS handshake failed"),
    );
  }

  function listenOn(
    server: {
      listen(port: number, host: string, cb: () => void): unknown;
      once(e: string, f: (err: Error) => void): unknown;
      off(e: string, f: (err: Error) => void): unknown;
      address(): unknown;
    },
    port: number,
    scheme: string,
  ): Promise<URL> {
    return new Promise((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, opts.listen.host, () => {
        server.off("error", reject);
        const a = server.address() as { port: number } | null;
        resolve(new URL(`${scheme}://${formatHostPort({ host: opts.listen.host, port: a?.port ?? port })}`));
      });
    });
  }

  let urls: GrpcProxyUrls | undefined;

  return {
    holderId,
    registry,
    get connectUri() {
      return connectUri;
    },
    get urls() {
      return urls;
    },
    async listen(): Promise<URL> {
      nc = await connectNats(opts.nats, `grpc-proxy-${holderHex(holderId)}`, logger);
      publisher = new WorkPublisher(
        nc,
        opts.region,
        opts.queue,
        logger,
        askApiForQueue(opts.apiUrl, opts.serviceToken),
      );
      const connect = await connectHttp.listen();
      const tlsUrl = workerTls ? await listenOn(workerTls, opts.workerTls!.port, "https") : undefined;
      const client = await listenOn(clientServer, opts.listen.port, opts.clientTls ? "https" : "http");
      if (opts.sharedConnectUrl) {
        connectUri = opts.sharedConnectUrl;
      } else {
        if (!isIPv4(opts.listen.host) || opts.listen.host === "0.0.0.0")
          throw new Error(
            `cannot build the pod address from listen host ${opts.listen.host}: listen on the pod's IPv4 address (POD_IP) or set grpcproxy.workerConnectBaseURL`,
          );
        connectUri = opts.callbackProxy
          ? `https://${dashIp(opts.listen.host)}.${opts.callbackProxy.workerDomain}:${opts.callbackProxy.port}${CONNECT_PATH}`
          : `http://${dashIp(opts.listen.host)}.grpc-headless.${opts.serviceDomain}:${connect.port}${CONNECT_PATH}`;
      }
      if (opts.relay?.enabled) {
        replicas = new ReplicaRegistry(
          nc,
          { holder: holderId, relayUrl: connect.origin },
          logger,
          opts.relay.registryTtlMs,
          REGISTRY_BUCKETS.grpcProxy,
          opts.queue.replicas,
        );
        await replicas.start();
      }
      urls = { client, connect, workerTls: tlsUrl };
      logger.info(
        {
          client: client.origin,
          connect: connect.origin,
          workerTls: tlsUrl?.origin,
          connectUri,
          holder: holderHex(holderId),
          relay: !!replicas,
        },
        "grpc-proxy listening; workers open tunnels at the connect URI",
      );
      return client;
    },
    /**
     * Graceful stop, as balancers expect it: readiness fails at once (/health 503), calls and new
     * sessions are still taken for the drain delay (the balancer has not noticed yet), then GOAWAY to
     * every client and no new sessions; calls in flight finish within the grace.
     */
    async close(graceMs = 30_000, drainDelayMs = 0): Promise<void> {
      draining = true;
      if (drainDelayMs > 0) await new Promise((r) => setTimeout(r, drainDelayMs));
      closing = true;
      clientServer.close();
      for (const s of clientSessions) s.close();
      const deadline = Date.now() + graceMs;
      while (clientSessions.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      for (const s of clientSessions) s.destroy();
      for (const s of [...sessions.values()])
        s.end(new CallplaneError("SHUTTING_DOWN", "grpc-proxy is stopping"), "replica stopping");
      await replicas?.close();
      workerTls?.close();
      for (const s of workerTlsSockets) s.destroy();
      await connectHttp.close(1000);
      for (const r of reloaders) r.close();
      tokens.close();
      await auth.close();
      await nc?.drain().catch(() => undefined);
    },
    destroy(): void {
      closing = true;
      destroyed = true;
      clientServer.close();
      for (const s of clientSessions) s.destroy();
      for (const s of [...sessions.values()]) {
        s.end(new CallplaneError("SHUTTING_DOWN", "grpc-proxy stopped"), "replica destroyed");
        s.tunnel?.destroy();
      }
      workerTls?.close();
      for (const s of workerTlsSockets) s.destroy();
      connectHttp.destroy();
      for (const r of reloaders) r.close();
      tokens.close();
      auth.destroy();
      // closed after the work just aborted has run its last steps (acks, unsubscribes): a publish
      // made while nats.js closes is flushed after its socket ended, an uncaught "write after end"
      setImmediate(() => void nc?.close());
    },
  };
}

export type GrpcProxy = ReturnType<typeof createGrpcProxy>;
