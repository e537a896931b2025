// grpc-proxy's section, and its rules: one shared tunnel address, the relay for several replicas
// behind it, and both files for TLS on the client listener.
import { z } from "zod";
import { cidr, optionalUrl, seconds, section } from "./fields.js";
import type { GlobalConfig } from "./global.js";
import { autoscaling, podAnnotations, resources } from "./kubernetes.js";

export const grpcproxySection = section({
  replicaCount: z.number().int().min(0).max(250).default(2),
  podAnnotations: podAnnotations(),
  resources: resources("250m", "256Mi", "1Gi"),
  deployment: section({ autoscaling: autoscaling() }),
  podNetwork: cidr.default("127.0.2.0/24"),
  port: z.number().int().min(0).max(65535).default(10081),
  connectPort: z.number().int().min(0).max(65535).default(10086),
  workerTlsPort: z.number().int().min(1).max(65535).default(10084),
  workerConnectBaseURL: optionalUrl(["http", "https"]),
  sessionIdleSeconds: seconds(30, 3600),
  connectTokenTtlSeconds: seconds(30, 300),
  maxInFlightPerKey: z.number().int().min(1).max(1_000_000).default(1024),
  tls: section({
    enabled: z.boolean().default(false),
    certFile: z.string().default(""),
    keyFile: z.string().default(""),
  }),
  relay: section({
    enabled: z.boolean().default(true),
  }),
  shutdownGraceSeconds: seconds(30, 3600),
  drainDelaySeconds: z.number().min(0).max(300).default(5),
});

export type GrpcproxyConfig = z.output<typeof grpcproxySection>;

export function grpcProxyProblems(c: { grpcproxy: GrpcproxyConfig; global: GlobalConfig }): string[] {
  const p: string[] = [];
  const we = c.global.workerEndpoints;
  const g = c.grpcproxy;
  if (
    g.workerConnectBaseURL &&
    we.grpcProxyWorkerConnectURL &&
    g.workerConnectBaseURL !== we.grpcProxyWorkerConnectURL
  ) {
    p.push(
      `grpcproxy.workerConnectBaseURL (${g.workerConnectBaseURL}) and global.workerEndpoints.grpcProxyWorkerConnectURL (${we.grpcProxyWorkerConnectURL}) are both set and differ: they name the same thing, the shared address workers open gRPC tunnels at. Set one of them`,
    );
  }
  const sharedGrpc = g.workerConnectBaseURL
    ? "grpcproxy.workerConnectBaseURL"
    : we.grpcProxyWorkerConnectURL
      ? "global.workerEndpoints.grpcProxyWorkerConnectURL"
      : undefined;
  if (g.replicaCount > 1 && sharedGrpc && !g.relay.enabled) {
    p.push(
      `grpcproxy.replicaCount is ${g.replicaCount} with a shared tunnel address (${sharedGrpc}) and grpcproxy.relay.enabled is false: a worker's tunnel balanced to a replica that does not hold its session would be refused, and the client's call would fail. Turn grpcproxy.relay.enabled on, or set grpcproxy.replicaCount to 1`,
    );
  }
  if (g.tls.enabled && (!g.tls.certFile || !g.tls.keyFile)) {
    p.push(
      "grpcproxy.tls.enabled is true but grpcproxy.tls.certFile or grpcproxy.tls.keyFile is empty: TLS on the client listener needs both files",
    );
  }
  return p;
}
