// The worker callback proxy: a TLS front door for workers in other networks. Each callback is a
// forward-proxy request (absolute-form target, inside the TLS session to the proxy) that names the
// pod holding the request; the proxy checks it (target.ts), opens its own TLS session to that pod
// (verifying the pod certificate against the stack CA and the pod name), and streams both ways
// with backpressure. Everything else is refused before any connection upstream is opened, and
// every callback is one JSON access-log line.
import { createServer as createHttpsServer, type Server } from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import { connect as netConnect, type Socket } from "node:net";
import { checkServerIdentity, createSecureContext, type PeerCertificate } from "node:tls";
import { Agent } from "undici";
import { CallplaneError, toCallplaneError } from "../../lib/errors.js";
import { forward, forwardHeaders } from "../../lib/forward.js";
import { countHeader } from "../../lib/headers.js";
import { answerClientError, rawProblem, writeProblem } from "../../lib/http.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { Counter, Histogram, LATENCY_BUCKETS, createRegistry, type Registry } from "../../lib/metrics.js";
import {
  SOCKET_BUFFER_BYTES,
  formatHostPort,
  parseCidr,
  widenSocketBuffers,
  type HostPort,
} from "../../lib/net.js";
import { podNameLookup } from "../../lib/pod-lookup.js";
import type { TlsMaterial } from "../../lib/tls-reload.js";
import { checkAuthority, checkTarget, type PodTarget, type TargetRules } from "./target.js";

export interface CallbackProxyOptions {
  listen: HostPort;
  serviceDomain: string;
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
  | "tunnel";

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

  const makeAgent = () =>
    new Agent({
      connections: opts.connectionsPerPod,
      keepAliveTimeout: 30_000,
      connect: {
        timeout: opts.timeouts.connectMs,
        // large bodies stream through each connection: 256 KiB buffers (undici's TLS default: 16)
        ...({ highWaterMark: SOCKET_BUFFER_BYTES } as object),
        // one context per CA bundle, not one parsed per connection
        secureContext: createSecureContext({ ca: podCa }),
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

  const server: Server = createHttpsServer(
    {
      cert: opts.frontend.cert,
      key: opts.frontend.key,
      ALPNProtocols: ["http/1.1"],
      minVersion: "TLSv1.2",
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
  const sockets = new Set<Socket>();
  // large bodies stream both ways through the worker's session: 256 KiB buffers, not 16 KiB
  server.prependListener("secureConnection", widenSocketBuffers);
  server.on("secureConnection", (s: Socket) => {
    sockets.add(s);
    s.once("close", () => sockets.delete(s));
  });

  return {
    server,
    registry,
    listen(): Promise<URL> {
      return new Promise((resolve, reject) => {
        server.once("error", reject);
        server.listen(opts.listen.port, opts.listen.host, () => {
          server.off("error", reject);
          const a = server.address();
          const port = typeof a === "object" && a ? a.port : opts.listen.port;
          const url = new URL(`https://${formatHostPort({ host: opts.listen.host, port })}`);
          logger.info(
            {
              url: url.origin,
              podNetworks: opts.podNetworks,
              upstreamTls: opts.upstreamTls,
              connect: opts.connectEnabled,
            },
            "callback proxy listening",
          );
          resolve(url);
        });
      });
    },
    /** New frontend certificate: new TLS sessions use it, live ones keep theirs. */
    setFrontend(m: TlsMaterial): void {
      server.setSecureContext({ cert: m.cert, key: m.key, minVersion: "TLSv1.2" });
    },
    /** New CA bundle for pod certificates. */
    setPodCa(ca: string): void {
      podCa = ca;
      const old = agent;
      agent = makeAgent();
      void old.close();
    },
    async close(graceMs = 10_000): Promise<void> {
      server.close();
      server.closeIdleConnections();
      const deadline = Date.now() + graceMs;
      while (sockets.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      for (const s of sockets) s.destroy();
      await agent.close();
    },
    destroy(): void {
      server.close();
      for (const s of sockets) s.destroy();
      void agent.destroy();
    },
  };
}

export type CallbackProxy = ReturnType<typeof createCallbackProxy>;
