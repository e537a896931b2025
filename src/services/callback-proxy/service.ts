// The worker callback proxy: a TLS front door for workers in other networks. Each callback is a
// forward-proxy request (absolute-form target, inside the TLS session to the proxy) that names the
// pod holding the request; the proxy checks it (target.ts), opens its own TLS session to that pod
// (verifying the pod certificate against the stack CA and the pod name), and streams both ways
// with backpressure. Everything else is refused before any connection upstream is opened, and
// every callback is one JSON access-log line.
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from "node:http";
import { connect as netConnect, type Socket } from "node:net";
import {
  checkServerIdentity,
  connect as tlsConnect,
  createSecureContext,
  type PeerCertificate,
  type SecureContext,
  type TLSSocket,
} from "node:tls";
import { Agent } from "undici";
import { CallplaneError, toCallplaneError } from "../../lib/errors.js";
import { forward, forwardHeaders } from "../../lib/forward.js";
import { countHeader } from "../../lib/headers.js";
import { answerClientError, rawProblem, writeProblem } from "../../lib/http.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { Counter, Histogram, LATENCY_BUCKETS, createRegistry, type Registry } from "../../lib/metrics.js";
import { SOCKET_BUFFER_BYTES, cidrContains, parseCidr, undashIp, type HostPort } from "../../lib/net.js";
import { createTlsFrontend } from "../../lib/tls-frontend.js";
import { podNameLookup } from "../../lib/pod-lookup.js";
import type { TlsMaterial } from "../../lib/tls-reload.js";
import { checkAuthority, checkTarget, type PodTarget, type TargetRules } from "./target.js";

export interface CallbackProxyOptions {
  listen: HostPort;
  serviceDomain: string;
  /** The domain workers reach the proxy under: `<dashed-ip>.<workerDomain>` names a gRPC tunnel. */
  workerDomain?: string;
  /**
   * gRPC tunnels: the port of each grpc-proxy pod's worker TLS listener. Unset, a connection for
   * `<dashed-ip>.<workerDomain>` is refused.
   */
  grpcPodPort?: number | undefined;
  podNetworks: string[];
  /** true: TLS to the pod's worker listener (verified); false: plain HTTP to its plain port. */
  upstreamTls: boolean;
  podPort: number;
  connectEnabled: boolean;
  /** Frontend certificate and key (for *.<workerDomain>). */
  frontend: { cert: string; key: string };
  /** CA bundle that pod certificates must chain to. */
  podCa: string;
  timeouts: { headersMs: number; idleMs: number; connectMs: number };
  maxHeaderBytes: number;
  connectionsPerPod: number;
  logger?: Logger;
  registry?: Registry;
}

const MAX_HEADERS = 100;
/** While draining, how long a callback connection may sit idle before the proxy ends it. */
const IDLE_DRAIN_MS = 2000;
// never dropped because a Connection header lists them: the callback needs them
const PROTECTED = new Set(["authorization", "content-type", "content-length", "host"]);
const DROP_UPSTREAM = new Set(["host"]);
const SERVER_AUTH = "1.3.6.1.5.5.7.3.1";

type Outcome =
  | "forwarded"
  | "refused_path"
  | "refused_target"
  | "refused_forbidden"
  | "refused_method"
  | "refused_host"
  | "refused_framing"
  | "refused_headers"
  | "refused_connect"
  | "upstream_error"
  | "upstream_timeout"
  | "client_gone"
  | "tunnel"
  | "grpc_tunnel"
  | "refused_grpc";

/** Node's own check of the name against the subject alternative names, plus serverAuth usage. */
function checkPodIdentity(host: string, cert: PeerCertificate): Error | undefined {
  const err = checkServerIdentity(host, cert);
  if (err) return err;
  const eku = (cert as PeerCertificate & { ext_key_usage?: string[] }).ext_key_usage;
  if (eku && !eku.includes(SERVER_AUTH))
    return new Error(`the certificate of ${host} is not for server authentication`);
  return undefined;
}

export function createCallbackProxy(opts: CallbackProxyOptions) {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("callback-proxy");
  const rules: TargetRules = {
    serviceDomain: opts.serviceDomain,
    port: opts.podPort,
    podNetworks: opts.podNetworks.map(parseCidr),
  };
  const callbacks = new Counter({
    name: "callplane_proxy_callbacks_total",
    help: "Worker callbacks by outcome",
    labelNames: ["outcome"],
    registers: [registry],
  });
  const bytes = new Counter({
    name: "callplane_proxy_bytes_total",
    help: "Body bytes forwarded, by direction",
    labelNames: ["direction"],
    registers: [registry],
  });
  const duration = new Histogram({
    name: "callplane_proxy_callback_duration_seconds",
    help: "Duration of forwarded callbacks",
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  let podCa = opts.podCa;
  // one context per CA bundle, not one parsed per connection
  let podContext: SecureContext = createSecureContext({ ca: podCa });

  const makeAgent = () =>
    new Agent({
      connections: opts.connectionsPerPod,
      keepAliveTimeout: 30_000,
      connect: {
        timeout: opts.timeouts.connectMs,
        // large bodies stream through each connection: 256 KiB buffers (undici's TLS default: 16)
        ...({ highWaterMark: SOCKET_BUFFER_BYTES } as object),
        secureContext: podContext,
        rejectUnauthorized: true,
        // the pod's address comes from its name, never from DNS
        lookup: podNameLookup(),
        checkServerIdentity: checkPodIdentity,
      },
    });
  // a new CA bundle gets a new agent (and with it a new TLS session cache), so no session
  // verified under the old bundle is resumed; requests in flight finish on the old one
  let agent = makeAgent();

  // Targets that passed the checks, by their exact request-target text: a pod is called back many
  // times, and the checks need not run again for the same string. Bounded; refusals never cached.
  const accepted = new Map<string, PodTarget & { path: string }>();
  const remember = (url: string, t: PodTarget & { path: string }) => {
    if (accepted.size >= 4096) accepted.clear();
    accepted.set(url, t);
    return t;
  };

  // The worker's address, read when its request arrives: by the time a long callback is logged,
  // Node may have let go of the request's socket.
  const workers = new WeakMap<IncomingMessage, string>();
  function workerOf(req: IncomingMessage): string {
    let w = workers.get(req);
    if (w === undefined) {
      const s = req.socket as Socket | null;
      w = s ? `${s.remoteAddress ?? "?"}:${s.remotePort ?? "?"}` : "?";
      workers.set(req, w);
    }
    return w;
  }

  function log(req: IncomingMessage, fields: Record<string, unknown>): void {
    logger.info(
      {
        worker: workerOf(req),
        method: req.method,
        ...fields,
      },
      "callback",
    );
  }

  function refuse(
    req: IncomingMessage,
    res: ServerResponse,
    err: CallplaneError,
    outcome: Outcome,
    started: number,
    target?: string,
  ): void {
    callbacks.inc({ outcome });
    const close = outcome === "refused_framing" || outcome === "refused_headers";
    if (!res.headersSent) {
      writeProblem(res, err, {
        ...(close ? { connection: "close" } : {}),
        ...(err.code === "CONNECT_DISABLED" ? { allow: "GET, POST" } : {}),
      });
    } else {
      res.destroy();
    }
    if (close) res.once("finish", () => req.socket.destroy());
    else req.resume();
    log(req, {
      target,
      path: req.url?.slice(0, 200),
      status: err.status,
      outcome,
      reason: err.message,
      bytesIn: 0,
      bytesOut: 0,
      durationMs: Math.round(performance.now() - started),
    });
  }

  function upstreamHeaders(req: IncomingMessage, target: PodTarget): Record<string, string | string[]> {
    const out = forwardHeaders(req, PROTECTED, DROP_UPSTREAM);
    out.host = target.authority;
    const fwd = req.socket.remoteAddress;
    if (fwd) out["x-forwarded-for"] = fwd;
    return out;
  }

  function handle(req: IncomingMessage, res: ServerResponse): void {
    workerOf(req);
    const socket = req.socket;
    idleSince.set(socket, undefined);
    res.once("close", () => {
      if (idleSince.has(socket)) idleSince.set(socket, performance.now());
    });
    // draining: each worker is told to take its next callback elsewhere (through the balancer)
    if (draining) res.shouldKeepAlive = false;
    const started = performance.now();
    const url = req.url ?? "";
    // 1. the target: path first (404 for anything but the callback), then the pod address
    let target: PodTarget & { path: string };
    try {
      target = accepted.get(url) ?? remember(url, checkTarget(url, rules));
    } catch (err) {
      const e = toCallplaneError(err);
      refuse(
        req,
        res,
        e,
        e.code === "NOT_FOUND"
          ? "refused_path"
          : e.code === "PROXY_TARGET_FORBIDDEN"
            ? "refused_forbidden"
            : "refused_target",
        started,
      );
      return;
    }
    const method = req.method ?? "";
    if (method !== "GET" && method !== "POST") {
      refuse(
        req,
        res,
        new CallplaneError("METHOD_NOT_ALLOWED", `only GET and POST reach ${target.path}`),
        "refused_method",
        started,
        target.podName,
      );
      return;
    }
    // 2. the Host header must name the same pod as the target (RFC 9112 lets a proxy ignore it; a
    // disagreement is a sign of a confused client or an attack, so it is refused)
    // (Node keeps only the first of several Host headers, so more than one is refused outright)
    const host = req.headers.host?.toLowerCase();
    const hosts = countHeader(req.rawHeaders, "host");
    if (hosts > 1 || (host !== undefined && host !== target.authority && host !== target.podName)) {
      refuse(
        req,
        res,
        new CallplaneError(
          "PROXY_HOST_MISMATCH",
          hosts > 1
            ? `the request has ${hosts} Host headers; send one, naming the target ${target.authority}`
            : `the Host header (${(host ?? "").slice(0, 100)}) does not name the target ${target.authority}`,
        ),
        "refused_host",
        started,
        target.podName,
      );
      return;
    }
    // 3. framing: Node's parser already refuses CL+TE together, bad chunk sizes and bare LFs; it
    // accepts odd Transfer-Encoding values (",chunked"), which a proxy must not pass on
    const te = req.headers["transfer-encoding"];
    if (te !== undefined && te.trim().toLowerCase() !== "chunked") {
      refuse(
        req,
        res,
        new CallplaneError(
          "PROXY_FRAMING_INVALID",
          `Transfer-Encoding ${JSON.stringify(te.slice(0, 60))} is not plain chunked`,
        ),
        "refused_framing",
        started,
        target.podName,
      );
      return;
    }
    const cl = req.headers["content-length"];
    if (cl !== undefined && !/^\d{1,15}$/.test(cl)) {
      refuse(
        req,
        res,
        new CallplaneError(
          "PROXY_FRAMING_INVALID",
          `Content-Length ${JSON.stringify(cl.slice(0, 60))} is not a single decimal number`,
        ),
        "refused_framing",
        started,
        target.podName,
      );
      return;
    }
    if (req.rawHeaders.length / 2 > MAX_HEADERS) {
      refuse(
        req,
        res,
        new CallplaneError("HEADERS_TOO_LARGE", `more than ${MAX_HEADERS} header fields`),
        "refused_headers",
        started,
        target.podName,
      );
      return;
    }
    forwardCallback(req, res, target, started);
  }

  function forwardCallback(
    req: IncomingMessage,
    res: ServerResponse,
    target: PodTarget & { path: string },
    started: number,
  ): void {
    forward(req, res, {
      dispatcher: agent,
      origin: `${opts.upstreamTls ? "https" : "http"}://${target.authority}`,
      path: target.path,
      headers: upstreamHeaders(req, target),
      idleMs: opts.timeouts.idleMs,
      onFailure(result) {
        result.reason ??= describeUpstreamError(result.error!, target);
        return new CallplaneError(
          result.outcome === "upstream_timeout" ? "UPSTREAM_TIMEOUT" : "UPSTREAM_UNAVAILABLE",
          `${result.reason}; the worker should give up on this request`,
        );
      },
    })
      .then((r) => {
        callbacks.inc({ outcome: r.outcome });
        bytes.inc({ direction: "to_pod" }, r.bytesIn);
        bytes.inc({ direction: "to_worker" }, r.bytesOut);
        const ms = performance.now() - started;
        duration.observe(ms / 1000);
        log(req, {
          target: target.podName,
          path: target.path,
          status: r.status,
          outcome: r.outcome,
          ...(r.reason ? { reason: r.reason } : {}),
          bytesIn: r.bytesIn,
          bytesOut: r.bytesOut,
          durationMs: Math.round(ms),
        });
      })
      .catch((err: unknown) => logger.error({ err }, "forwarding failed unexpectedly"));
  }

  function describeUpstreamError(err: Error, target: PodTarget): string {
    const code = (err as NodeJS.ErrnoException).code ?? "";
    if (code === "ECONNREFUSED")
      return `nothing listens at ${target.ip}:${target.port} (the pod ${target.podName} is gone or not ready)`;
    if (code === "UND_ERR_CONNECT_TIMEOUT" || code === "ETIMEDOUT")
      return `connecting to ${target.podName} (${target.ip}:${target.port}) timed out`;
    if (
      code.startsWith("ERR_TLS") ||
      code.includes("CERT") ||
      /certificate|self.signed|altnames|verify/i.test(err.message)
    ) {
      return `the certificate of ${target.podName} failed verification: ${err.message}`;
    }
    if (code === "UND_ERR_SOCKET" || code === "ECONNRESET")
      return `the connection to ${target.podName} broke: ${err.message}`;
    return `forwarding to ${target.podName} failed: ${err.message}`;
  }

  function handleConnect(req: IncomingMessage, socket: Socket, head: Buffer): void {
    workerOf(req);
    const started = performance.now();
    const answer = (e: CallplaneError, outcome: Outcome) => {
      callbacks.inc({ outcome });
      socket.end(rawProblem(e));
      log(req, {
        target: req.url?.slice(0, 200),
        status: e.status,
        outcome,
        reason: e.message,
        bytesIn: 0,
        bytesOut: 0,
        durationMs: Math.round(performance.now() - started),
      });
    };
    if (!opts.connectEnabled) {
      answer(
        new CallplaneError(
          "CONNECT_DISABLED",
          "CONNECT tunnels are turned off; send a forward-proxy request (absolute-form target) instead",
        ),
        "refused_connect",
      );
      return;
    }
    let target: PodTarget;
    try {
      target = checkAuthority(req.url ?? "", rules);
    } catch (err) {
      const e = toCallplaneError(err);
      answer(e, e.code === "PROXY_TARGET_FORBIDDEN" ? "refused_forbidden" : "refused_target");
      return;
    }
    const upstream = netConnect({ host: target.ip, port: target.port, timeout: opts.timeouts.connectMs });
    let up = 0;
    let down = 0;
    upstream.once("connect", () => {
      upstream.setTimeout(opts.timeouts.idleMs);
      socket.setTimeout(opts.timeouts.idleMs);
      socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      if (head.length) upstream.write(head);
      upstream.on("data", (d: Buffer) => (down += d.length));
      socket.on("data", (d: Buffer) => (up += d.length));
      upstream.pipe(socket);
      socket.pipe(upstream);
    });
    const end = (reason?: string) => {
      upstream.destroy();
      socket.destroy();
      if (reason !== undefined || up + down > 0 || !upstream.connecting) {
        log(req, {
          target: target.podName,
          status: 200,
          outcome: "tunnel",
          ...(reason ? { reason } : {}),
          bytesIn: up,
          bytesOut: down,
          durationMs: Math.round(performance.now() - started),
        });
      }
    };
    upstream.once("timeout", () => end("idle timeout"));
    socket.once("timeout", () => end("idle timeout"));
    upstream.once("error", (err) => {
      if (!socket.destroyed && up + down === 0) {
        socket.end(`HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n`);
      }
      end(err.message);
    });
    socket.once("error", () => end());
    upstream.once("close", () => socket.end());
    socket.once("close", () => upstream.destroy());
    callbacks.inc({ outcome: "tunnel" });
  }

  let draining = false;
  // each callback connection, and since when it has been idle (undefined while a callback is on it)
  const idleSince = new Map<Socket, number | undefined>();
  /** Ends the callback connections idle for at least `ms`. */
  function endIdle(ms: number): void {
    const now = performance.now();
    for (const [s, since] of idleSince) if (since !== undefined && now - since >= ms) s.end();
  }
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
    handle,
  );
  // A connection with no bytes either way for longer than the callback idle timeout ends. It is a
  // little longer than that timeout, so that a stalled pod is answered 504 before the worker's
  // connection is cut.
  server.timeout = opts.timeouts.idleMs + 5000;
  // The HTTP server never listens itself (the TLS front door hands it connections), and Node starts
  // its check for heads that arrive too slowly (headersTimeout) on 'listening' only.
  server.emit("listening");
  server.on("connect", handleConnect);
  server.on("checkExpectation", (req: IncomingMessage, res: ServerResponse) =>
    refuse(
      req,
      res,
      new CallplaneError(
        "EXPECTATION_FAILED",
        `Expect: ${String(req.headers.expect).slice(0, 60)} is not supported; only Expect: 100-continue is`,
      ),
      "refused_framing",
      performance.now(),
    ),
  );
  server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) => {
    // a connection that closed or reset without a request (a health check's connect-and-close) is
    // no callback: nothing to answer, nothing to count
    const worker = `${socket.remoteAddress ?? "?"}:${socket.remotePort ?? "?"}`;
    const status = answerClientError(err, socket);
    if (status === undefined) return;
    callbacks.inc({ outcome: status === 431 ? "refused_headers" : "refused_framing" });
    logger.info(
      {
        worker,
        status,
        outcome: status === 431 ? "refused_headers" : "refused_framing",
        reason: `unparsable request (${err.code ?? err.message})`,
      },
      "callback",
    );
  });
  // ------------------------------------------------------------------ gRPC tunnels

  /** The grpc-proxy pod a server name `<dashed-ip>.<workerDomain>` names, or undefined for other names. */
  function grpcPod(servername: string | false | null | undefined): string | undefined {
    if (!opts.workerDomain || !servername) return undefined;
    const name = servername.toLowerCase();
    const suffix = `.${opts.workerDomain}`;
    if (!name.endsWith(suffix)) return undefined;
    const label = name.slice(0, -suffix.length);
    return label.includes(".") ? undefined : label;
  }

  function tunnelLog(socket: TLSSocket, fields: Record<string, unknown>): void {
    logger.info(
      { worker: `${socket.remoteAddress ?? "?"}:${socket.remotePort ?? "?"}`, method: "TLS", ...fields },
      "callback",
    );
  }

  /**
   * A gRPC tunnel, routed by the server name alone: the name's form and the pod network are checked,
   * then the proxy opens its own TLS session to that grpc-proxy pod's worker listener (the pod
   * certificate must be `<dashed-ip>.grpc-headless.<service domain>` from the stack CA) and pipes
   * bytes both ways. Inside, the worker sends the same CONNECT it sends in-cluster; the proxy never
   * reads it. A refusal is an HTTP/1 answer, since the worker's next step is a CONNECT request.
   */
  function routeGrpc(socket: TLSSocket, label: string, started: number): void {
    const servername = String(socket.servername);
    const refuse = (e: CallplaneError, outcome: Outcome) => {
      callbacks.inc({ outcome });
      socket.on("error", () => undefined);
      socket.end(rawProblem(e));
      socket.resume();
      tunnelLog(socket, {
        target: servername,
        status: e.status,
        outcome,
        reason: e.message,
        bytesIn: 0,
        bytesOut: 0,
        durationMs: Math.round(performance.now() - started),
      });
    };
    const ip = undashIp(label);
    if (!ip) {
      refuse(
        new CallplaneError(
          "PROXY_TARGET_INVALID",
          `the server name ${JSON.stringify(servername.slice(0, 100))} is neither invocation.${opts.workerDomain} nor a grpc-proxy pod of the form <dashed-ipv4>.${opts.workerDomain}`,
        ),
        "refused_target",
      );
      return;
    }
    if (!rules.podNetworks.some((n) => cidrContains(n, ip))) {
      refuse(
        new CallplaneError(
          "PROXY_TARGET_FORBIDDEN",
          `the pod address ${ip} is outside the pod networks (${rules.podNetworks.map((n) => n.text).join(", ")})`,
        ),
        "refused_forbidden",
      );
      return;
    }
    if (opts.grpcPodPort === undefined) {
      refuse(
        new CallplaneError(
          "CONNECT_DISABLED",
          "gRPC tunnels are not routed by this proxy (no grpc-proxy pods are configured)",
        ),
        "refused_grpc",
      );
      return;
    }
    const podName = `${label}.grpc-headless.${opts.serviceDomain}`;
    let up = 0;
    let down = 0;
    let connected = false;
    socket.pause();
    const pod = tlsConnect({
      host: ip,
      port: opts.grpcPodPort,
      servername: podName,
      secureContext: podContext,
      rejectUnauthorized: true,
      checkServerIdentity: checkPodIdentity,
      ALPNProtocols: ["http/1.1"],
      timeout: opts.timeouts.connectMs,
      ...({ highWaterMark: SOCKET_BUFFER_BYTES } as object),
    });
    const end = (reason?: string) => {
      pod.destroy();
      socket.destroy();
      tunnelLog(socket, {
        target: podName,
        status: connected ? 200 : 502,
        outcome: connected ? "grpc_tunnel" : "upstream_error",
        ...(reason ? { reason } : {}),
        bytesIn: up,
        bytesOut: down,
        durationMs: Math.round(performance.now() - started),
      });
    };
    pod.once("secureConnect", () => {
      connected = true;
      callbacks.inc({ outcome: "grpc_tunnel" });
      pod.setTimeout(0);
      pod.setNoDelay(true);
      socket.setNoDelay(true);
      pod.on("data", (d: Buffer) => (down += d.length));
      socket.on("data", (d: Buffer) => (up += d.length));
      pod.pipe(socket);
      socket.pipe(pod);
      socket.resume();
    });
    pod.once("timeout", () => {
      if (!connected) {
        callbacks.inc({ outcome: "upstream_timeout" });
        socket.end(
          rawProblem(
            new CallplaneError(
              "UPSTREAM_TIMEOUT",
              `connecting to ${podName} (${ip}:${opts.grpcPodPort}) timed out; the worker should give up on this session`,
            ),
          ),
        );
        end("connect timeout");
      }
    });
    pod.once("error", (err: NodeJS.ErrnoException) => {
      if (!connected) {
        callbacks.inc({ outcome: "upstream_error" });
        const why =
          err.code === "ECONNREFUSED"
            ? `nothing listens at ${ip}:${opts.grpcPodPort} (the grpc-proxy pod ${podName} is gone or not ready)`
            : `the TLS session to ${podName} failed: ${err.message}`;
        socket.end(
          rawProblem(
            new CallplaneError("UPSTREAM_UNAVAILABLE", `${why}; the worker should give up on this session`),
          ),
        );
        const reason = why;
        socket.once("finish", () => end(reason));
        return;
      }
      end(err.message);
    });
    socket.on("error", () => end());
    pod.once("close", () => socket.end());
    socket.once("close", () => pod.destroy());
  }

  // ------------------------------------------------------------------ the front door

  // The server name decides, before any HTTP is parsed: a grpc-proxy pod name is a gRPC tunnel,
  // anything else (invocation.<workerDomain>, or no name) an HTTP callback.
  const frontend = createTlsFrontend({
    tls: { cert: opts.frontend.cert, key: opts.frontend.key, ALPNProtocols: ["http/1.1"] },
    route(socket) {
      const label = grpcPod(socket.servername);
      if (label !== undefined && label !== "invocation") routeGrpc(socket, label, performance.now());
      else {
        idleSince.set(socket, performance.now());
        socket.once("close", () => idleSince.delete(socket));
        server.emit("connection", socket);
      }
    },
  });

  return {
    server: frontend.server,
    registry,
    async listen(): Promise<URL> {
      const url = await frontend.listen(opts.listen.host, opts.listen.port);
      logger.info(
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
      podCa = ca;
      podContext = createSecureContext({ ca: podCa });
      const old = agent;
      agent = makeAgent();
      void old.close();
    },
    /** Whether a stop has begun (the admin listener's /health then answers 503). */
    get draining(): boolean {
      return draining;
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
      draining = true;
      if (drainDelayMs > 0) await new Promise((r) => setTimeout(r, drainDelayMs));
      // with no drain delay (the whole stack stops) nothing is coming: idle connections end at once
      const idleMs = drainDelayMs > 0 ? IDLE_DRAIN_MS : 0;
      endIdle(idleMs);
      const sweep = setInterval(() => endIdle(idleMs), 250);
      await frontend.close(graceMs);
      clearInterval(sweep);
      server.close();
      await agent.close();
    },
    destroy(): void {
      frontend.destroy();
      server.close();
      void agent.destroy();
    },
  };
}

export type CallbackProxy = ReturnType<typeof createCallbackProxy>;
