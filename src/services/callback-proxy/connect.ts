// HTTP CONNECT tunnels (when turned on): the CONNECT target must be a pod address inside the pod
// networks; the proxy then opens a plain TCP connection to it and pipes bytes both ways, counting
// them for the access log.
import type { IncomingMessage } from "node:http";
import { connect as netConnect, type Socket } from "node:net";
import { CallplaneError, toCallplaneError } from "../../lib/errors.js";
import { rawProblem } from "../../lib/http/index.js";
import { splice } from "../../lib/net/index.js";
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
  const upstream = netConnect({ host: target.ip, port: target.port });
  splice(socket, upstream, {
    connectTimeoutMs: opts.timeouts.connectMs,
    idleMs: opts.timeouts.idleMs,
    onReady: () => socket.write("HTTP/1.1 200 Connection Established\r\n\r\n"),
    head,
    failureAnswer: (f) =>
      f.cause === "upstream-error" && f.bytesUp + f.bytesDown === 0
        ? "HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        : undefined,
    onEnd: (e) => {
      // a tunnel that one side closed cleanly is not logged
      if (e.cause === "closed") return;
      const reason = e.cause.endsWith("timeout")
        ? "idle timeout"
        : e.cause === "upstream-error"
          ? e.error?.message
          : undefined;
      accessLog(ctx, req, {
        target: target.podName,
        status: 200,
        outcome: "tunnel",
        ...(reason ? { reason } : {}),
        bytesIn: e.bytesUp,
        bytesOut: e.bytesDown,
        durationMs: Math.round(performance.now() - started),
      });
    },
  });
  callbacks.inc({ outcome: "tunnel" });
}
