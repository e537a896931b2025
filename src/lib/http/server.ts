// The small HTTP layer every service shares: a router on core node:http, JSON and problem+json
// answers, body limits counted while streaming, /health and /metrics, and the two ways to stop:
// close() drains (late requests get 503 with Connection: close), destroy() cuts every connection.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createTlsServer, type ServerOptions as HttpsServerOptions } from "node:https";
import type { Socket } from "node:net";
import { CallplaneError } from "../errors.js";
import type { Logger } from "../log.js";
import type { Registry } from "../metrics.js";
import { SOCKET_BUFFER_BYTES, formatHostPort, widenSocketBuffers, type HostPort } from "../net/index.js";
import { HANDSHAKE_OPTIONS, limitHandshake } from "../tls/index.js";
import { traceHttpServer, type Tracing } from "../tracing/index.js";
import { requireHostServed, type HostNames } from "./hosts.js";
import type { Router } from "./router.js";
import { HttpServerMetrics } from "./server-metrics.js";
import { rawProblem, sendJson, sendProblem, writeProblem } from "./problem.js";

export interface HttpServiceOptions {
  name: string;
  listen: HostPort;
  logger: Logger;
  registry: Registry;
  router: Router;
  /** TLS options: serve HTTPS instead of HTTP. */
  tls?: HttpsServerOptions;
  /** Whether GET /metrics is served (default true); a listener for other parties turns it off. */
  metrics?: boolean;
  /** Extra readiness check for GET /health (true = ready). */
  ready?: () => boolean;
  /** The largest request head, in bytes (16 KiB by default); a larger one is answered 431. */
  maxHeaderSize?: number;
  /**
   * How long a whole request (head and body) may take to arrive; 0 for no limit. Services whose
   * bodies are small set it, so a client that stops sending cannot hold a connection; services
   * that stream bodies of any size leave it off.
   */
  requestTimeoutMs?: number;
  /**
   * The host names this listener serves besides IP literals and localhost (lib/http/hosts.ts); a
   * request naming another is refused with HOST_NOT_SERVED. Undefined: any Host (listeners only
   * other services reach, by address).
   */
  hosts?: HostNames;
  /**
   * No browser may use this listener: a request with an `Origin` header (which only browsers send,
   * on every cross-origin request and every POST) is refused with ORIGIN_REFUSED, right after the
   * Host check and before anything else.
   */
  refuseBrowsers?: boolean;
  /** Each routed request gets a server span (continuing the caller's traceparent); none without. */
  tracing?: Tracing | undefined;
}

/**
 * The raw answer to a request that Node's parser refused before any handler saw it (the server's
 * `clientError`): a problem body, then the connection closes.
 */
export function clientErrorAnswer(err: NodeJS.ErrnoException): { status: number; raw: string } {
  const [status, code, detail]: [number, "HEADERS_TOO_LARGE" | "REQUEST_TIMEOUT" | "BAD_REQUEST", string] =
    err.code === "HPE_HEADER_OVERFLOW"
      ? [431, "HEADERS_TOO_LARGE", "the request head is larger than the limit; send fewer or smaller headers"]
      : err.code === "ERR_HTTP_REQUEST_TIMEOUT"
        ? [
            408,
            "REQUEST_TIMEOUT",
            "the request did not arrive in time; send the head and body without pausing",
          ]
        : [400, "BAD_REQUEST", `malformed HTTP request (${err.code ?? err.message})`];
  return { status, raw: rawProblem(new CallplaneError(code, detail)) };
}

/** How many Host headers a request carries. */
function hostCount(raw: readonly string[]): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) if (raw[i].length === 4 && raw[i].toLowerCase() === "host") n++;
  return n;
}

/** Answers an `Expect` other than `100-continue` (Node's server would send a bare 417). */
export function expectationFailed(req: IncomingMessage, res: ServerResponse): void {
  writeProblem(
    res,
    new CallplaneError(
      "EXPECTATION_FAILED",
      `Expect: ${req.headers.expect ?? ""} is not supported; only Expect: 100-continue is`,
    ),
    { connection: "close" },
  );
  req.resume();
}

/**
 * Answers a request Node's parser refused (the server's `clientError`) and closes the connection
 * both ways: a client that keeps its side open cannot hold it, nor the handler of a request whose
 * body was cut short. A response already under way is cut instead of being corrupted.
 */
export function answerClientError(err: NodeJS.ErrnoException, socket: Socket): number | undefined {
  const inFlight = (socket as Socket & { _httpMessage?: ServerResponse })._httpMessage;
  if (err.code === "ECONNRESET" || err.code === "EPIPE" || !socket.writable || inFlight?.headersSent) {
    socket.destroy();
    return undefined;
  }
  const { status, raw } = clientErrorAnswer(err);
  socket.end(raw);
  socket.destroySoon();
  return status;
}

export interface HttpService {
  readonly server: Server;
  readonly draining: boolean;
  listen(): Promise<URL>;
  /**
   * Drains the way load balancers and Kubernetes expect. At once: /health answers 503 "draining"
   * (readiness fails first), and every response asks for `Connection: close`, so clients move to
   * other replicas; idle keep-alive connections close when the delay ends. For `delayMs` requests are still served
   * (the balancer has not noticed yet); after it, new requests get 503 SHUTTING_DOWN, except on
   * routes marked duringDrain. It keeps listening until the work in flight has finished, or for
   * `graceMs`, then closes every connection.
   */
  close(graceMs?: number, delayMs?: number): Promise<void>;
  destroy(): void;
}

export function createHttpService(opts: HttpServiceOptions): HttpService {
  const { logger, router, registry } = opts;
  const metrics = new HttpServerMetrics(registry);
  let draining = false;
  // after the drain delay: new requests are refused
  let refusing = false;
  let inFlight = 0;
  let idleWaiters: Array<() => void> = [];
  const sockets = new Set<Socket>();

  const handle = (req: IncomingMessage, res: ServerResponse): void => {
    const started = process.hrtime.bigint();
    const rawUrl = req.url ?? "/";
    const q = rawUrl.indexOf("?");
    const path = q === -1 ? rawUrl : rawUrl.slice(0, q);
    const query = new URLSearchParams(q === -1 ? "" : rawUrl.slice(q + 1));
    const method = req.method ?? "GET";
    let routeLabel = "unmatched";
    inFlight++;
    res.once("close", () => {
      inFlight--;
      // status 0: no answer went out (the client left first)
      const status = res.headersSent ? res.statusCode : 0;
      metrics.record(routeLabel, method, status, Number(process.hrtime.bigint() - started) / 1e9);
      if (inFlight === 0 && idleWaiters.length) {
        const w = idleWaiters;
        idleWaiters = [];
        for (const f of w) f();
      }
    });
    const log = logger;
    if (draining) res.shouldKeepAlive = false;
    if (req.headers.host === undefined && req.httpVersionMajor === 1 && req.httpVersionMinor >= 1) {
      // (Node's own check would answer a bare 400 with no body)
      sendProblem(res, new CallplaneError("BAD_REQUEST", "an HTTP/1.1 request needs a Host header"), log, {
        connection: "close",
      });
      return;
    }
    if (hostCount(req.rawHeaders) > 1) {
      // Node keeps the first and drops the rest; which one a proxy in front used is unknown
      sendProblem(
        res,
        new CallplaneError("BAD_REQUEST", "the request has more than one Host header; send exactly one"),
        log,
        { connection: "close" },
      );
      return;
    }
    // An HTTP/1.0 request without Host (a load balancer's health check) names no host a page could
    // have rebound; HTTP/1.1 without Host was refused above, and browsers always send one.
    if (opts.hosts !== undefined && req.headers.host !== undefined) {
      try {
        requireHostServed(req.headers.host, opts.hosts, opts.name);
      } catch (err) {
        sendProblem(res, err, log, { connection: "close" });
        return;
      }
    }
    if (opts.refuseBrowsers && req.headers.origin !== undefined) {
      sendProblem(
        res,
        new CallplaneError(
          "ORIGIN_REFUSED",
          `${opts.name} takes no request from a web browser (this one carries Origin: ${JSON.stringify(req.headers.origin.slice(0, 100))}); use \`callplane init\` or another client that is not a browser`,
        ),
        log,
        { connection: "close" },
      );
      return;
    }
    const te = req.headers["transfer-encoding"];
    if (te !== undefined && te.trim().toLowerCase() !== "chunked") {
      // Node's parser de-chunks `gzip, chunked` and passes the gzip bytes on as if they were the
      // body; no callplane service decodes transfer codings, so only plain chunked is taken
      sendProblem(
        res,
        new CallplaneError(
          "BAD_REQUEST",
          `Transfer-Encoding ${JSON.stringify(te.slice(0, 60))} is not supported; send the body plain or with Transfer-Encoding: chunked`,
        ),
        log,
        { connection: "close" },
      );
      return;
    }
    const get = method === "GET" || method === "HEAD";
    if (get && path === "/health") {
      routeLabel = "/health";
      const ok = !draining && (opts.ready?.() ?? true);
      sendJson(res, ok ? 200 : 503, {
        status: ok ? "ok" : draining ? "draining" : "starting",
        service: opts.name,
      });
      return;
    }
    if (get && path === "/metrics" && opts.metrics !== false) {
      routeLabel = "/metrics";
      registry
        .metrics()
        .then((text) => {
          res.writeHead(200, { "content-type": registry.contentType });
          res.end(text);
        })
        .catch((err: unknown) => sendProblem(res, err, log));
      return;
    }
    const m = router.match(method, path);
    if (!m && (path === "/health" || (path === "/metrics" && opts.metrics !== false))) {
      sendProblem(
        res,
        new CallplaneError("METHOD_NOT_ALLOWED", `${method} is not allowed on ${path}; use GET`),
        log,
        { allow: "GET, HEAD" },
      );
      return;
    }
    if (!m) {
      sendProblem(res, new CallplaneError("NOT_FOUND", `no route for ${method} ${path}`), log);
      return;
    }
    if ("allowed" in m) {
      sendProblem(
        res,
        new CallplaneError(
          "METHOD_NOT_ALLOWED",
          `${method} is not allowed on ${path}; use ${m.allowed.join(", ")}`,
        ),
        log,
        {
          allow: m.allowed.join(", "),
        },
      );
      return;
    }
    routeLabel = m.route.pattern;
    if (refusing && !m.route.duringDrain) {
      sendProblem(
        res,
        new CallplaneError("SHUTTING_DOWN", `${opts.name} is shutting down; retry on another replica`),
        log,
        {
          connection: "close",
        },
      );
      return;
    }
    let result: Promise<void> | void;
    try {
      const span = opts.tracing && traceHttpServer(opts.tracing, req, res, m.route.pattern);
      result = m.route.handler({ req, res, params: m.params, query, log, span });
    } catch (err) {
      sendProblem(res, err, log);
      return;
    }
    if (result) result.catch((err: unknown) => sendProblem(res, err, log));
  };

  const requestTimeout = opts.requestTimeoutMs ?? 0;
  const serverOptions = {
    maxHeaderSize: opts.maxHeaderSize ?? 16 * 1024,
    // 65 s, above the idle timeouts of the clients that pool connections to us (undici: 4–30 s, load
    // balancers: 60 s), so a client never sends a request on a connection this side is closing
    keepAliveTimeout: 65_000,
    // given here, not set on the server afterwards: Node 20 ignores later changes to these two
    headersTimeout: requestTimeout > 0 ? Math.min(30_000, requestTimeout) : 30_000,
    requestTimeout,
    // answered by handle() with a problem body
    requireHostHeader: false,
    // how often Node looks for requests past headersTimeout or requestTimeout (default 30 s)
    connectionsCheckingInterval: 5_000,
    // bodies stream through these servers: buffers of a few TLS records, not one (plain sockets
    // take it from here; TLS sockets are widened once their session is up, below)
    highWaterMark: SOCKET_BUFFER_BYTES,
  };
  let server: Server;
  if (opts.tls) {
    const tls = createTlsServer({ ...HANDSHAKE_OPTIONS, ...opts.tls, ...serverOptions }, handle);
    limitHandshake(tls);
    tls.prependListener("secureConnection", widenSocketBuffers);
    server = tls;
  } else {
    server = createServer(serverOptions, handle);
  }
  // no count of header fields beyond the head's size limit: past Node's default count (2000 lines),
  // later fields, Authorization or Content-Type among them, would be dropped without a word
  server.maxHeadersCount = 0;
  server.on("checkExpectation", expectationFailed);
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.once("close", () => sockets.delete(s));
  });
  server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) => {
    answerClientError(err, socket);
  });

  return {
    server,
    get draining() {
      return draining;
    },
    listen() {
      return new Promise<URL>((resolve, reject) => {
        const onError = (err: Error) => reject(err);
        server.once("error", onError);
        server.listen(opts.listen.port, opts.listen.host, () => {
          server.off("error", onError);
          const addr = server.address();
          const port = typeof addr === "object" && addr ? addr.port : opts.listen.port;
          const url = new URL(
            `${opts.tls ? "https" : "http"}://${formatHostPort({ host: opts.listen.host, port })}`,
          );
          logger.info({ url: url.origin }, `${opts.name} listening`);
          resolve(url);
        });
      });
    },
    async close(graceMs = 10_000, delayMs = 0) {
      if (draining) return;
      draining = true;
      // Responses not yet begun ask for Connection: close too.
      for (const s of sockets) {
        const current = (s as Socket & { _httpMessage?: ServerResponse })._httpMessage;
        if (current && !current.headersSent) current.shouldKeepAlive = false;
      }
      // Idle keep-alive connections close once the balancer has had the delay to notice, not at
      // once: closing one races the next request a balancer sends on it (HAProxy then drops its
      // client's connection unanswered; seen in the fault suite's rolling restart). With no delay
      // nothing will be sent, and they close now.
      if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
      server.closeIdleConnections();
      refusing = true;
      // Keep listening while draining: work in flight may still need new connections (a worker's
      // callback for a request this replica holds), and late clients get a clear 503 with
      // Connection: close instead of a refused connection. The listener closes once the work is done.
      server.closeIdleConnections();
      if (inFlight > 0) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, graceMs);
          t.unref();
          idleWaiters.push(() => {
            clearTimeout(t);
            resolve();
          });
        });
      }
      server.close();
      for (const s of sockets) s.destroy();
    },
    destroy() {
      draining = true;
      refusing = true;
      server.close();
      for (const s of sockets) s.destroy();
    },
  };
}
