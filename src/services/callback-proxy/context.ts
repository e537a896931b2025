// What every job of the callback proxy shares, passed to each explicitly: the options, the logger,
// the target rules, the metrics, the pod TLS state (replaced as a whole when the CA bundle changes)
// and the access log of one callback.
import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import { checkServerIdentity, type PeerCertificate, type SecureContext } from "node:tls";
import type { Agent } from "undici";
import type { Logger } from "../../lib/log.js";
import { Counter, Histogram, LATENCY_BUCKETS, type Registry } from "../../lib/metrics.js";
import type { HostPort } from "../../lib/net/index.js";
import type { TargetRules } from "./target.js";

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

export type Outcome =
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

export interface ProxyMetrics {
  callbacks: Counter;
  bytes: Counter;
  duration: Histogram;
}

export interface ProxyContext {
  readonly opts: CallbackProxyOptions;
  readonly logger: Logger;
  readonly rules: TargetRules;
  readonly metrics: ProxyMetrics;
  /**
   * The pod CA bundle's TLS context and the agent of pooled connections to pods, built on it.
   * A new CA bundle replaces both (see the service's setPodCa).
   */
  readonly pod: { context: SecureContext; agent: Agent };
  /** The worker of each request, read when it arrives (see workerOf). */
  readonly workers: WeakMap<IncomingMessage, string>;
}

const SERVER_AUTH = "1.3.6.1.5.5.7.3.1";

export function createMetrics(registry: Registry): ProxyMetrics {
  return {
    callbacks: new Counter({
      name: "callplane_proxy_callbacks_total",
      help: "Worker callbacks by outcome",
      labelNames: ["outcome"],
      registers: [registry],
    }),
    bytes: new Counter({
      name: "callplane_proxy_bytes_total",
      help: "Body bytes forwarded, by direction",
      labelNames: ["direction"],
      registers: [registry],
    }),
    duration: new Histogram({
      name: "callplane_proxy_callback_duration_seconds",
      help: "Duration of forwarded callbacks",
      buckets: LATENCY_BUCKETS,
      registers: [registry],
    }),
  };
}

/** Node's own check of the name against the subject alternative names, plus serverAuth usage. */
export function checkPodIdentity(host: string, cert: PeerCertificate): Error | undefined {
  const err = checkServerIdentity(host, cert);
  if (err) return err;
  const eku = (cert as PeerCertificate & { ext_key_usage?: string[] }).ext_key_usage;
  if (eku && !eku.includes(SERVER_AUTH))
    return new Error(`the certificate of ${host} is not for server authentication`);
  return undefined;
}

// The worker's address, read when its request arrives: by the time a long callback is logged,
// Node may have let go of the request's socket.
export function workerOf(ctx: ProxyContext, req: IncomingMessage): string {
  let w = ctx.workers.get(req);
  if (w === undefined) {
    const s = req.socket as Socket | null;
    w = s ? `${s.remoteAddress ?? "?"}:${s.remotePort ?? "?"}` : "?";
    ctx.workers.set(req, w);
  }
  return w;
}

/** The access-log line of one callback (or CONNECT tunnel). */
export function accessLog(ctx: ProxyContext, req: IncomingMessage, fields: Record<string, unknown>): void {
  ctx.logger.info(
    {
      worker: workerOf(ctx, req),
      method: req.method,
      ...fields,
    },
    "callback",
  );
}
