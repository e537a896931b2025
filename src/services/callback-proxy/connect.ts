// HTTP CONNECT tunnels (when turned on): the CONNECT target must be a pod address inside the pod
// networks; the proxy then opens a plain TCP connection to it and pipes bytes both ways, counting
// them for the access log.
import type { IncomingMessage } from "node:http";
import { connect as netConnect, type Socket } from "node:net";
import { CallplaneError, toCallplaneError } from "../../lib/errors.js";
import { rawProblem } from "../../lib/http.js";
import { accessLog, workerOf, type Outcome, type ProxyContext } from "./context.js";
import { checkAuthority, type PodTarget } from "./target.js";

/** The server's 'connect' event: one CONNECT request, refused or turned into a tunnel. */
export function handleConnect(ctx: ProxyContext, req: IncomingMessage, socket: Socket, head: Buffer): void {
  const { opts, rules } = ctx;
  const { callbacks } = ctx.metrics;
  workerOf(ctx, req);
  const started = performance.now();
  const answer = (e: CallplaneError, outcome: Outcome) => {
    callbacks.inc({ outcome });
    socket.end(rawProblem(e));
    accessLog(ctx, req, {
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
      accessLog(ctx, req, {
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
