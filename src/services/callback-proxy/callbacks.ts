// HTTP callbacks: each is a forward-proxy request that names the pod holding the request. It is
// checked (target, method, Host, framing, header count) and refused before any connection upstream
// is opened, or forwarded through the per-pod agent, streaming both ways; either way it is one
// access-log line. This module also keeps the callback connections and since when each has been
// idle, which the drain reads.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { SecureContext, TLSSocket } from "node:tls";
import { Agent } from "undici";
import { CallplaneError, toCallplaneError } from "../../lib/errors.js";
import {
  answerClientError,
  countHeader,
  forward,
  forwardHeaders,
  writeProblem,
} from "../../lib/http/index.js";
import { podNameLookup, SOCKET_BUFFER_BYTES } from "../../lib/net/index.js";
import {
  accessLog,
  checkPodIdentity,
  workerOf,
  type CallbackProxyOptions,
  type Outcome,
  type ProxyContext,
} from "./context.js";
import { checkTarget, type PodTarget } from "./target.js";

const MAX_HEADERS = 100;
// never dropped because a Connection header lists them: the callback needs them
const PROTECTED = new Set(["authorization", "content-type", "content-length", "host"]);
const DROP_UPSTREAM = new Set(["host"]);

/**
 * The agent of pooled connections to pods, verifying each pod certificate against `podContext`.
 * A new CA bundle gets a new agent (and with it a new TLS session cache), so no session verified
 * under the old bundle is resumed; requests in flight finish on the old one.
 */
export function podAgent(opts: CallbackProxyOptions, podContext: SecureContext): Agent {
  return new Agent({
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
}

export function upstreamHeaders(req: IncomingMessage, target: PodTarget): Record<string, string | string[]> {
  const out = forwardHeaders(req, PROTECTED, DROP_UPSTREAM);
  out.host = target.authority;
  const fwd = req.socket.remoteAddress;
  if (fwd) out["x-forwarded-for"] = fwd;
  return out;
}

export function describeUpstreamError(err: Error, target: PodTarget): string {
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

/** The HTTP server's callback handling, and the state it keeps across callbacks. */
export class HttpCallbacks {
  /** Set when a stop begins: each worker is then told to take its next callback elsewhere. */
  draining = false;
  // each callback connection, and since when it has been idle (undefined while a callback is on it)
  private readonly idleSince = new Map<Socket, number | undefined>();
  // Targets that passed the checks, by their exact request-target text: a pod is called back many
  // times, and the checks need not run again for the same string. Bounded; refusals never cached.
  private readonly accepted = new Map<string, PodTarget & { path: string }>();

  constructor(private readonly ctx: ProxyContext) {}

  /** A TLS connection the front door hands to the HTTP server: idle from now until its first request. */
  adopt(socket: TLSSocket): void {
    this.idleSince.set(socket, performance.now());
    socket.once("close", () => this.idleSince.delete(socket));
  }

  /** Ends the callback connections idle for at least `ms`. */
  endIdle(ms: number): void {
    const now = performance.now();
    for (const [s, since] of this.idleSince) if (since !== undefined && now - since >= ms) s.end();
  }

  private remember(url: string, t: PodTarget & { path: string }): PodTarget & { path: string } {
    if (this.accepted.size >= 4096) this.accepted.clear();
    this.accepted.set(url, t);
    return t;
  }

  refuse(
    req: IncomingMessage,
    res: ServerResponse,
    err: CallplaneError,
    outcome: Outcome,
    started: number,
    target?: string,
  ): void {
    this.ctx.metrics.callbacks.inc({ outcome });
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
    accessLog(this.ctx, req, {
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

  /** The server's 'checkExpectation': any Expect but 100-continue. */
  refuseExpectation(req: IncomingMessage, res: ServerResponse): void {
    this.refuse(
      req,
      res,
      new CallplaneError(
        "EXPECTATION_FAILED",
        `Expect: ${String(req.headers.expect).slice(0, 60)} is not supported; only Expect: 100-continue is`,
      ),
      "refused_framing",
      performance.now(),
    );
  }

  /** The server's 'clientError': a request Node could not parse. */
  refuseUnparsable(err: NodeJS.ErrnoException, socket: Socket): void {
    // a connection that closed or reset without a request (a health check's connect-and-close) is
    // no callback: nothing to answer, nothing to count
    const worker = `${socket.remoteAddress ?? "?"}:${socket.remotePort ?? "?"}`;
    const status = answerClientError(err, socket);
    if (status === undefined) return;
    this.ctx.metrics.callbacks.inc({ outcome: status === 431 ? "refused_headers" : "refused_framing" });
    this.ctx.logger.info(
      {
        worker,
        status,
        outcome: status === 431 ? "refused_headers" : "refused_framing",
        reason: `unparsable request (${err.code ?? err.message})`,
      },
      "callback",
    );
  }

  handle(req: IncomingMessage, res: ServerResponse): void {
    workerOf(this.ctx, req);
    const socket = req.socket;
    this.idleSince.set(socket, undefined);
    res.once("close", () => {
      if (this.idleSince.has(socket)) this.idleSince.set(socket, performance.now());
    });
    // draining: each worker is told to take its next callback elsewhere (through the balancer)
    if (this.draining) res.shouldKeepAlive = false;
    const started = performance.now();
    const url = req.url ?? "";
    // 1. the target: path first (404 for anything but the callback), then the pod address
    let target: PodTarget & { path: string };
    try {
      target = this.accepted.get(url) ?? this.remember(url, checkTarget(url, this.ctx.rules));
    } catch (err) {
      const e = toCallplaneError(err);
      this.refuse(
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
      this.refuse(
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
      this.refuse(
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
      this.refuse(
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
      this.refuse(
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
      this.refuse(
        req,
        res,
        new CallplaneError("HEADERS_TOO_LARGE", `more than ${MAX_HEADERS} header fields`),
        "refused_headers",
        started,
        target.podName,
      );
      return;
    }
    forwardCallback(this.ctx, req, res, target, started);
  }
}

export function forwardCallback(
  ctx: ProxyContext,
  req: IncomingMessage,
  res: ServerResponse,
  target: PodTarget & { path: string },
  started: number,
): void {
  const { opts, metrics } = ctx;
  forward(req, res, {
    dispatcher: ctx.pod.agent,
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
      metrics.callbacks.inc({ outcome: r.outcome });
      metrics.bytes.inc({ direction: "to_pod" }, r.bytesIn);
      metrics.bytes.inc({ direction: "to_worker" }, r.bytesOut);
      const ms = performance.now() - started;
      metrics.duration.observe(ms / 1000);
      accessLog(ctx, req, {
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
    .catch((err: unknown) => ctx.logger.error({ err }, "forwarding failed unexpectedly"));
}
