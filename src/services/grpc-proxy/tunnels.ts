// The worker side (contract §4.3): a worker's HTTP/1 CONNECT request, on the CONNECT listener
// (in-cluster) or inside the worker TLS listener (through the callback proxy). Its token claims the
// session waiting for it; once the 200 is out the roles invert: this replica opens an HTTP/2
// client session over the socket, the worker serves it, and every call of the session goes through
// it (calls.ts). A token minted by another replica (a shared connect address sent the worker here)
// is relayed, CONNECT request and all, to that replica: the token names its holder, the registry of
// live replicas gives its address.
import type { IncomingMessage } from "node:http";
import { connect as h2connect } from "node:http2";
import { connect as netConnect, type Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import { CallplaneError } from "../../lib/errors.js";
import { H2_SESSION_OPTIONS, widenWindow } from "../../lib/grpc/index.js";
import { rawProblem } from "../../lib/http/index.js";
import { holderHex, isUuid } from "../../lib/ids.js";
import type { Logger } from "../../lib/log.js";
import { dashIp, SOCKET_BUFFER_BYTES, splice } from "../../lib/net/index.js";
import { RELAYED_HEADER } from "../../plane/relay.js";
import { tokenHolder } from "../../plane/tokens.js";
import { bearerToken, first } from "./metadata.js";
import type { GrpcProxyMetrics } from "./metrics.js";
import type { Session } from "./session.js";
import type { SessionTable } from "./sessions.js";
import type { ProxyState } from "./state.js";
import { traceTunnel, tunnelAnswered } from "../../lib/tracing/index.js";

export const CONNECT_PATH = "/v1/proxy";

export interface TunnelDeps {
  sessions: SessionTable;
  state: ProxyState;
  metrics: Pick<GrpcProxyMetrics, "tunnels">;
  logger: Logger;
  holderId: number;
  /** The replica's own address (the tunnel's HTTP/2 authority names it). */
  listenHost: string;
}

export class Tunnels {
  constructor(private readonly deps: TunnelDeps) {}

  /** A worker's CONNECT request (the HTTP server's "connect" event). */
  onConnect(req: IncomingMessage, socket: Socket, head: Buffer): void {
    const { sessions, state } = this.deps;
    socket.on("error", () => undefined);
    if (state.tracing) traceTunnel(state.tracing, req);
    const token = bearerToken(req.headers);
    if (!token) {
      this.refuse(
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
      this.refuse(
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
    const session = sessions.claim(token, requestId);
    if (!session) {
      const holder = tokenHolder(token);
      if (
        state.relay &&
        state.replicas &&
        holder !== undefined &&
        !sessions.isOwnToken(token) &&
        req.headers[RELAYED_HEADER] === undefined
      ) {
        void this.relay(req, socket, head, holder);
        return;
      }
      this.refuse(
        socket,
        new CallplaneError(
          "CONNECT_TOKEN_INVALID",
          `HTTP CONNECT request is missing valid auth: the token for request ${requestId} is unknown here, already used, expired (${Math.round(sessions.tokenTtlMs / 1000)} s) or for another request`,
        ),
        "bad_token",
        req,
      );
      return;
    }
    this.deps.metrics.tunnels.inc({ result: "ok" });
    socket.setNoDelay(true);
    socket.setTimeout(0);
    // Node's HTTP server accepts sockets half-open; an HTTP/2 session over one never notices the
    // worker's end of the tunnel closing (calls on it would hang), so the socket closes with it.
    socket.allowHalfOpen = false;
    socket.once("end", () => socket.destroy());
    sessions.opened(session);
    // HTTP/2 takes the socket over only once the 200 is written out: a TLS socket with a write still
    // in flight, handed to an HTTP/2 session, aborts the process (node_http2.cc is_write_in_progress)
    socket.write("HTTP/1.1 200 Connection Established\r\n\r\n", () =>
      this.attach(session, socket, head, requestId),
    );
    this.deps.logger.info(
      {
        requestId,
        worker: socket.remoteAddress,
        // through the callback proxy (the worker TLS listener), or straight to the CONNECT listener
        via: (socket as TLSSocket).encrypted ? "worker-tls" : "connect",
        functionId: session.functionId,
      },
      "tunnel open",
    );
    tunnelAnswered(req, "ok", {
      status: 200,
      functionId: session.functionId,
      functionVersionId: session.functionVersionId,
    });
  }

  /** The 200 is out: an HTTP/2 client session over the worker's socket becomes the session's tunnel. */
  private attach(session: Session, socket: Socket, head: Buffer, requestId: string): void {
    if (socket.destroyed || session.state === "closed") {
      socket.destroy();
      session.end(undefined, "tunnel closed before it was up");
      return;
    }
    // bytes the worker sent right after its CONNECT belong to the HTTP/2 session
    if (head.length) socket.unshift(head);
    const tunnel = h2connect(`http://${dashIp(this.deps.listenHost)}.tunnel`, {
      ...H2_SESSION_OPTIONS,
      createConnection: () => socket,
    });
    tunnel.on("error", (err: Error) =>
      this.deps.logger.debug({ requestId, err: err.message }, "tunnel error"),
    );
    tunnel.once("connect", () => widenWindow(tunnel));
    session.attach(tunnel);
  }

  /** Pipes a tunnel meant for another replica to it, CONNECT request and all. */
  async relay(req: IncomingMessage, socket: Socket, head: Buffer, holder: number): Promise<void> {
    const entry = await this.deps.state.replicas!.lookup(holder).catch(() => undefined);
    if (!entry) {
      this.refuse(
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
    splice(socket, up, {
      onReady: () => {
        up.setNoDelay(true);
        up.write(relayedConnect(req, this.deps.holderId));
        this.deps.metrics.tunnels.inc({ result: "relayed" });
        tunnelAnswered(req, "relayed", { status: 200 });
      },
      head,
      failureAnswer: (f) =>
        f.bytesDown === 0
          ? rawProblem(
              new CallplaneError(
                "HOLDER_GONE",
                `the grpc-proxy replica ${holderHex(holder)} that holds this session does not answer at ${entry.relayUrl} (${f.error?.message}); give up on this session`,
              ),
            )
          : undefined,
      afterUpstreamClose: "destroy-client",
      onEnd: (end) =>
        this.deps.logger.info(
          {
            holder: holderHex(holder),
            to: entry.relayUrl,
            requestId: first(req.headers["x-request-id"]),
            bytesToWorker: end.bytesDown,
            durationMs: Math.round(performance.now() - started),
          },
          "relayed a tunnel to the replica that holds it",
        ),
    });
  }

  private refuse(socket: Socket, e: CallplaneError, result: string, req: IncomingMessage): void {
    this.deps.metrics.tunnels.inc({ result });
    tunnelAnswered(req, result, { status: e.status, err: e });
    this.deps.logger.info(
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
}

/** The worker's CONNECT request as it came, marked as relayed by this replica (never relayed twice). */
function relayedConnect(req: IncomingMessage, holderId: number): string {
  const lines = [`CONNECT ${req.url ?? CONNECT_PATH} HTTP/1.1`];
  for (let i = 0; i < req.rawHeaders.length; i += 2)
    lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}`);
  lines.push(`${RELAYED_HEADER}: ${holderHex(holderId)}`);
  return `${lines.join("\r\n")}\r\n\r\n`;
}
