// gRPC tunnels, routed by the TLS server name alone: `<dashed-ip>.<workerDomain>` names a
// grpc-proxy pod, which gets its own verified TLS session from the proxy and the worker's bytes
// piped both ways; the proxy never reads what flows inside.
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { CallplaneError } from "../../lib/errors.js";
import { rawProblem } from "../../lib/http/index.js";
import { cidrContains, podHost, SOCKET_BUFFER_BYTES, splice, undashIp } from "../../lib/net/index.js";
import { checkPodIdentity, type Outcome, type ProxyContext } from "./context.js";

/** The grpc-proxy pod a server name `<dashed-ip>.<workerDomain>` names, or undefined for other names. */
export function grpcPod(
  ctx: ProxyContext,
  servername: string | false | null | undefined,
): string | undefined {
  const { opts } = ctx;
  if (!opts.workerDomain || !servername) return undefined;
  const name = servername.toLowerCase();
  const suffix = `.${opts.workerDomain}`;
  if (!name.endsWith(suffix)) return undefined;
  const label = name.slice(0, -suffix.length);
  return label.includes(".") ? undefined : label;
}

export function tunnelLog(ctx: ProxyContext, socket: TLSSocket, fields: Record<string, unknown>): void {
  ctx.logger.info(
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
export function routeGrpc(ctx: ProxyContext, socket: TLSSocket, label: string, started: number): void {
  const { opts, rules } = ctx;
  const { callbacks } = ctx.metrics;
  const servername = String(socket.servername);
  const refuse = (e: CallplaneError, outcome: Outcome) => {
    callbacks.inc({ outcome });
    socket.on("error", () => undefined);
    socket.end(rawProblem(e));
    socket.resume();
    tunnelLog(ctx, socket, {
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
  const podName = podHost(ip, "grpc", opts.serviceDomain);
  const pod = tlsConnect({
    host: ip,
    port: opts.grpcPodPort,
    servername: podName,
    secureContext: ctx.pod.context,
    rejectUnauthorized: true,
    checkServerIdentity: checkPodIdentity,
    ALPNProtocols: ["http/1.1"],
    ...({ highWaterMark: SOCKET_BUFFER_BYTES } as object),
  });
  let why: string | undefined;
  splice(socket, pod, {
    connectTimeoutMs: opts.timeouts.connectMs,
    onReady: () => {
      callbacks.inc({ outcome: "grpc_tunnel" });
      pod.setNoDelay(true);
      socket.setNoDelay(true);
    },
    failureAnswer: (f) => {
      if (f.connected) return undefined;
      if (f.cause === "connect-timeout") {
        callbacks.inc({ outcome: "upstream_timeout" });
        return rawProblem(
          new CallplaneError(
            "UPSTREAM_TIMEOUT",
            `connecting to ${podName} (${ip}:${opts.grpcPodPort}) timed out; the worker should give up on this session`,
          ),
        );
      }
      callbacks.inc({ outcome: "upstream_error" });
      const err = f.error as NodeJS.ErrnoException;
      why =
        err.code === "ECONNREFUSED"
          ? `nothing listens at ${ip}:${opts.grpcPodPort} (the grpc-proxy pod ${podName} is gone or not ready)`
          : `the TLS session to ${podName} failed: ${err.message}`;
      return rawProblem(
        new CallplaneError("UPSTREAM_UNAVAILABLE", `${why}; the worker should give up on this session`),
      );
    },
    onEnd: (e) => {
      // a tunnel that one side closed cleanly is not logged
      if (e.cause === "closed") return;
      const reason =
        e.cause === "connect-timeout"
          ? "connect timeout"
          : e.cause === "upstream-error"
            ? (why ?? e.error?.message)
            : undefined;
      tunnelLog(ctx, socket, {
        target: podName,
        status: e.connected ? 200 : 502,
        outcome: e.connected ? "grpc_tunnel" : "upstream_error",
        ...(reason ? { reason } : {}),
        bytesIn: e.bytesUp,
        bytesOut: e.bytesDown,
        durationMs: Math.round(performance.now() - started),
      });
    },
  });
}
