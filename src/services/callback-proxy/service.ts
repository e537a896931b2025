// The worker callback proxy: a TLS front door for workers in other networks. Each callback is a
// forward-proxy request (absolute-form target, inside the TLS session to the proxy) that names the
// pod holding the request; the proxy checks it (target.ts), opens its own TLS session to that pod
// (verifying the pod certificate against the stack CA and the pod name), and streams both ways
// with backpressure. Everything else is refused before any connection upstream is opened, and
// every callback is one JSON access-log line.
//
// This file is the lifecycle shell: it builds the shared context (context.ts), the HTTP server for
// callbacks (callbacks.ts) and CONNECT tunnels (connect.ts), the TLS front door that routes gRPC
// tunnels by server name (sni-tunnels.ts), and starts and stops them.
import {
  createServer as createHttpServer,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import type { Socket } from "node:net";
import { createSecureContext, type TLSSocket } from "node:tls";
import { silentLogger } from "../../lib/log.js";
import { createRegistry } from "../../lib/metrics.js";
import { parseCidr } from "../../lib/net/index.js";
import { createTlsFrontend } from "../../lib/tls/index.js";
import type { TlsMaterial } from "../../lib/tls/index.js";
import { HttpCallbacks, podAgent } from "./callbacks.js";
import { handleConnect } from "./connect.js";
import { createMetrics, type CallbackProxyOptions, type ProxyContext } from "./context.js";
import { grpcPod, routeGrpc } from "./sni-tunnels.js";

export type { CallbackProxyOptions } from "./context.js";

/** While draining, how long a callback connection may sit idle before the proxy ends it. */
const IDLE_DRAIN_MS = 2000;

// The server name decides, before any HTTP is parsed: a grpc-proxy pod name is a gRPC tunnel,
// anything else (invocation.<workerDomain>, or no name) an HTTP callback.
function routeConnection(
  ctx: ProxyContext,
  callbacks: HttpCallbacks,
  server: Server,
  socket: TLSSocket,
): void {
  const label = grpcPod(ctx, socket.servername);
  if (label !== undefined && label !== "invocation") routeGrpc(ctx, socket, label, performance.now());
  else {
    callbacks.adopt(socket);
    server.emit("connection", socket);
  }
}

export function createCallbackProxy(opts: CallbackProxyOptions) {
  const registry = opts.registry ?? createRegistry("callback-proxy");
  // one context per CA bundle, not one parsed per connection
  const podContext = createSecureContext({ ca: opts.podCa });
  const ctx: ProxyContext = {
    opts,
    logger: opts.logger ?? silentLogger(),
    rules: {
      serviceDomain: opts.serviceDomain,
      port: opts.podPort,
      podNetworks: opts.podNetworks.map(parseCidr),
    },
    metrics: createMetrics(registry),
    pod: { context: podContext, agent: podAgent(opts, podContext) },
    workers: new WeakMap(),
  };
  const callbacks = new HttpCallbacks(ctx);

  const server = createHttpServer(
    {
      maxHeaderSize: opts.maxHeaderBytes,
      keepAliveTimeout: 65_000,
      headersTimeout: opts.timeouts.headersMs,
      requestTimeout: 0,
      // how often Node looks for heads that take longer than headersTimeout (slowloris); its
      // default, 30 s, would let a slow client hold a connection far past the limit
      connectionsCheckingInterval: Math.min(1000, opts.timeouts.headersMs),
      // a callback without Host is allowed (the target names the pod); Node would answer a bare 400
      requireHostHeader: false,
    },
    (req, res) => callbacks.handle(req, res),
  );
  // A connection with no bytes either way for longer than the callback idle timeout ends. It is a
  // little longer than that timeout, so that a stalled pod is answered 504 before the worker's
  // connection is cut.
  server.timeout = opts.timeouts.idleMs + 5000;
  // The HTTP server never listens itself (the TLS front door hands it connections), and Node starts
  // its check for heads that arrive too slowly (headersTimeout) on 'listening' only.
  server.emit("listening");
  server.on("connect", (req: IncomingMessage, socket: Socket, head: Buffer) =>
    handleConnect(ctx, req, socket, head),
  );
  server.on("checkExpectation", (req: IncomingMessage, res: ServerResponse) =>
    callbacks.refuseExpectation(req, res),
  );
  server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) =>
    callbacks.refuseUnparsable(err, socket),
  );

  const frontend = createTlsFrontend({
    tls: { cert: opts.frontend.cert, key: opts.frontend.key, ALPNProtocols: ["http/1.1"] },
    route: (socket) => routeConnection(ctx, callbacks, server, socket),
  });

  return {
    server: frontend.server,
    registry,
    async listen(): Promise<URL> {
      const url = await frontend.listen(opts.listen.host, opts.listen.port);
      ctx.logger.info(
        {
          url: url.origin,
          podNetworks: opts.podNetworks,
          upstreamTls: opts.upstreamTls,
          connect: opts.connectEnabled,
          grpcPodPort: opts.grpcPodPort,
        },
        "callback proxy listening",
      );
      return url;
    },
    /** New frontend certificate: new TLS sessions use it, live ones keep theirs. */
    setFrontend(m: TlsMaterial): void {
      frontend.setCertificate(m.cert!, m.key!);
    },
    /** New CA bundle for pod certificates. */
    setPodCa(ca: string): void {
      ctx.pod.context = createSecureContext({ ca });
      const old = ctx.pod.agent;
      ctx.pod.agent = podAgent(opts, ctx.pod.context);
      void old.close();
    },
    /** Whether a stop has begun (the admin listener's /health then answers 503). */
    get draining(): boolean {
      return callbacks.draining;
    },
    /**
     * Drains as balancers expect: readiness fails at once and every answer asks for Connection:
     * close; callbacks are still taken for `drainDelayMs`, then no new connections, and those in
     * flight (and gRPC tunnels) get `graceMs` to end.
     *
     * Idle connections are not closed the moment the drain begins: a server that closes a
     * kept-alive connection races the worker's next request on it, which then fails unanswered
     * (seen in the fault suite: a worker's answer lost, its client waiting). A worker that sends
     * one more callback on it gets its answer with Connection: close; one that leaves it idle for
     * IDLE_DRAIN_MS after the drain delay has moved on to another proxy, and it is ended then.
     */
    async close(graceMs = 10_000, drainDelayMs = 0): Promise<void> {
      callbacks.draining = true;
      if (drainDelayMs > 0) await new Promise((r) => setTimeout(r, drainDelayMs));
      // with no drain delay (the whole stack stops) nothing is coming: idle connections end at once
      const idleMs = drainDelayMs > 0 ? IDLE_DRAIN_MS : 0;
      callbacks.endIdle(idleMs);
      const sweep = setInterval(() => callbacks.endIdle(idleMs), 250);
      await frontend.close(graceMs);
      clearInterval(sweep);
      server.close();
      await ctx.pod.agent.close();
    },
    destroy(): void {
      frontend.destroy();
      server.close();
      void ctx.pod.agent.destroy();
    },
  };
}

export type CallbackProxy = ReturnType<typeof createCallbackProxy>;
