// What HAProxy's configuration is written from: the options every part of it reads
// (haproxy-config.ts and the modules it assembles), and how they follow from callplane's own
// settings, so one environment file still decides everything wherever the proxy runs.
import type { Config } from "../../lib/config/index.js";
import type { HostPort } from "../../lib/net/index.js";

export interface HaproxyConfigOptions {
  listen: HostPort;
  metricsListen: HostPort;
  serviceDomain: string;
  workerDomain: string;
  /** The port of each grpc-proxy pod's worker TLS listener; unset, gRPC tunnels are refused. */
  grpcPodPort?: number | undefined;
  podNetworks: string[];
  /** true: TLS to the pod's worker listener (verified); false: plain HTTP to its plain port. */
  upstreamTls: boolean;
  podPort: number;
  files: {
    /**
     * The frontend certificate and its chain, with its key in the same file, or (with
     * `frontendKeyBeside`) in the file beside it that has the `.key` extension (a
     * kubernetes.io/tls Secret's tls.crt and tls.key).
     */
    frontendPem: string;
    frontendKeyBeside?: boolean;
    /** The CA bundle pod certificates must chain to. */
    podCa: string;
    /** HAProxy's runtime API socket (certificate updates, the drain). */
    adminSocket: string;
    /** The folder of the answers HAProxy's parser refusals get (haproxyErrorFiles). */
    errorDir: string;
  };
  timeouts: { headersMs: number; idleMs: number; connectMs: number };
  maxHeaderBytes: number;
  /** How long a stop lets callbacks and tunnels in flight finish (hard-stop-after). */
  shutdownGraceMs: number;
  /** HAProxy threads (default: one per CPU HAProxy may use). */
  threads?: number | undefined;
  /** The most idle connections to pods kept for reuse (default: HAProxy's, unbounded). */
  poolMaxConnections?: number | undefined;
}

/** What HAProxy's configuration takes from callplane's own, wherever the proxy runs. */
export function haproxySettings(
  c: Config,
): Pick<
  HaproxyConfigOptions,
  | "serviceDomain"
  | "workerDomain"
  | "upstreamTls"
  | "timeouts"
  | "maxHeaderBytes"
  | "shutdownGraceMs"
  | "threads"
  | "poolMaxConnections"
> {
  const p = c.workerCallbackProxy;
  return {
    serviceDomain: c.global.serviceDomain,
    workerDomain: p.workerDomain,
    upstreamTls: p.invocation.upstreamTls.enabled,
    timeouts: {
      headersMs: p.timeouts.headersSeconds * 1000,
      idleMs: p.timeouts.idleSeconds * 1000,
      connectMs: p.timeouts.connectSeconds * 1000,
    },
    maxHeaderBytes: p.maxHeaderBytes,
    shutdownGraceMs: p.shutdownGraceSeconds * 1000,
    threads: p.threads,
    poolMaxConnections: p.upstreamConnectionsPerPod,
  };
}
