// The worker callback proxy's section, and its rules: no split-plane worker URLs beside it, a proxy
// URL its certificate covers, one source for the frontend certificate, and (the local stack's rule)
// the stack's pods inside the proxy's pod networks.
import { z } from "zod";
import { cidrContains, formatHostPort, parseCidr, parseHostPort } from "../net/index.js";
import { cidr, dnsName, hostPort, seconds, section } from "./fields.js";
import type { GlobalConfig } from "./global.js";
import type { GrpcproxyConfig } from "./grpc-proxy.js";
import type { InvocationConfig } from "./invocation.js";
import { autoscaling, k8sName, podAnnotations, resources } from "./kubernetes.js";

export const workerCallbackProxySection = section({
  enabled: z.boolean().default(true),
  replicaCount: z.number().int().min(1).max(50).default(1),
  podAnnotations: podAnnotations(),
  resources: resources("250m", "128Mi", "512Mi"),
  autoscaling: autoscaling(),
  service: section({
    type: z.enum(["ClusterIP", "LoadBalancer", "NodePort"]).default("ClusterIP"),
  }),
  workerDomain: dnsName.default("worker.callplane.test"),
  listen: hostPort.default("127.0.0.1:10084"),
  metricsListen: hostPort.default("127.0.0.1:10083"),
  // where the API probes the proxy's /health for the console's health page; empty: derived from
  // metricsListen when that names a host the API can dial (one machine), else not probed
  healthUrl: z
    .string()
    .default("")
    .refine((v) => v === "" || /^https?:\/\/[^/]+\/health$/.test(v), {
      message: "must be empty or an http(s) URL of the proxy's admin listener ending in /health",
    }),
  podNetworks: z
    .array(
      cidr.refine((v) => Number(v.split("/")[1]) >= 8, {
        message: "is too wide: a pod network must be /8 or narrower",
      }),
    )
    .min(1, "must name at least one pod network")
    .default(["127.0.1.0/24", "127.0.2.0/24"]),
  invocation: section({
    upstreamTls: section({ enabled: z.boolean().default(true) }),
    connect: section({ enabled: z.boolean().default(false) }),
    workerTlsPort: z.number().int().min(1).max(65535).default(8443),
  }),
  tls: section({
    frontend: section({
      certFile: z.string().default(""),
      keyFile: z.string().default(""),
      existingSecret: z.union([z.literal(""), k8sName]).default(""),
      certificate: section({
        issuerRef: section({
          kind: z.enum(["Issuer", "ClusterIssuer"]).default("Issuer"),
          name: z.union([z.literal(""), k8sName]).default(""),
        }),
      }),
    }),
  }),
  timeouts: section({
    headersSeconds: seconds(10, 300),
    idleSeconds: seconds(300, 86_400),
    connectSeconds: seconds(5, 60),
  }),
  shutdownGraceSeconds: seconds(30, 3600),
  drainDelaySeconds: z.number().min(0).max(300).default(5),
  maxHeaderBytes: z.number().int().min(1024).max(65_536).default(16_384),
  upstreamConnectionsPerPod: z.number().int().min(1).max(4096).default(256),
  // the proxy is HAProxy: one thread carries thousands of callbacks, and leaves the other cores
  // of a small machine to the plane
  threads: z.number().int().min(1).max(64).default(1),
});

export type WorkerCallbackProxyConfig = z.output<typeof workerCallbackProxySection>;

/**
 * Where the API asks the callback proxy's /health (the console's health page): healthUrl, or one
 * derived from metricsListen when it names a host (not a wildcard such as a pod's 0.0.0.0); or
 * why there is none. Undefined while the proxy is off.
 */
export function callbackProxyHealth(
  p: WorkerCallbackProxyConfig,
): { url: string } | { why: string } | undefined {
  if (!p.enabled) return undefined;
  if (p.healthUrl) return { url: p.healthUrl };
  const admin = parseHostPort(p.metricsListen);
  if (admin.host === "0.0.0.0" || admin.host === "::")
    return {
      why: `its admin listener (workerCallbackProxy.metricsListen ${p.metricsListen}) names no address the API can dial, and its Service carries the worker port only: set workerCallbackProxy.healthUrl to reach it`,
    };
  return { url: `http://${formatHostPort(admin)}/health` };
}

/** With the proxy, workers reach each pod through it: the split plane's worker URLs must be empty. */
export function splitPlaneProblems(c: {
  workerCallbackProxy: WorkerCallbackProxyConfig;
  global: GlobalConfig;
  grpcproxy: GrpcproxyConfig;
  invocation: InvocationConfig;
}): string[] {
  const p: string[] = [];
  const we = c.global.workerEndpoints;
  const proxy = c.workerCallbackProxy;
  if (proxy.enabled) {
    const splitPlane: Array<[string, string]> = [
      ["global.workerEndpoints.invocationServiceURL", we.invocationServiceURL],
      ["global.workerEndpoints.grpcProxyWorkerConnectURL", we.grpcProxyWorkerConnectURL],
      ["grpcproxy.workerConnectBaseURL", c.grpcproxy.workerConnectBaseURL],
      ["invocation.selfAddress", c.invocation.selfAddress],
    ];
    for (const [key, value] of splitPlane) {
      if (value) {
        p.push(
          `${key} is set (${value}) while workerCallbackProxy.enabled is true: with the callback proxy, workers reach each pod through the proxy, so split-plane worker URLs must be empty. Clear ${key}, or turn workerCallbackProxy.enabled off`,
        );
      }
    }
  }
  return p;
}

/** The proxy URL workers are given must be https and covered by the proxy's wildcard certificate. */
export function invocationProxyUrlProblems(c: {
  global: GlobalConfig;
  workerCallbackProxy: WorkerCallbackProxyConfig;
}): string[] {
  const p: string[] = [];
  const we = c.global.workerEndpoints;
  const proxy = c.workerCallbackProxy;
  if (we.invocationProxyURL) {
    const u = new URL(we.invocationProxyURL);
    const host = u.hostname.toLowerCase();
    if (u.protocol !== "https:")
      p.push(
        `global.workerEndpoints.invocationProxyURL must be https (workers verify the proxy's certificate), not ${u.protocol.slice(0, -1)}`,
      );
    if (
      !host.endsWith(`.${proxy.workerDomain}`) ||
      host.slice(0, -proxy.workerDomain.length - 1).includes(".")
    ) {
      p.push(
        `global.workerEndpoints.invocationProxyURL host ${host} is not covered by the *.${proxy.workerDomain} certificate of workerCallbackProxy.workerDomain: use a name with exactly one label before ${proxy.workerDomain}`,
      );
    }
  }
  return p;
}

/** HAProxy carries the callbacks: it forwards absolute-form requests and opens no CONNECT tunnel. */
export function connectProblems(c: { workerCallbackProxy: WorkerCallbackProxyConfig }): string[] {
  return c.workerCallbackProxy.invocation.connect.enabled
    ? [
        "workerCallbackProxy.invocation.connect.enabled is true, but the callback proxy (HAProxy) offers no CONNECT tunnels to invocation pods: workers send their callbacks as forward-proxy requests with an absolute-form target. Set it to false (or remove it)",
      ]
    : [];
}

/** The frontend certificate comes from one place. */
export function frontendProblems(c: { workerCallbackProxy: WorkerCallbackProxyConfig }): string[] {
  const p: string[] = [];
  const frontend = c.workerCallbackProxy.tls.frontend;
  if (frontend.existingSecret && frontend.certificate.issuerRef.name)
    p.push(
      `workerCallbackProxy.tls.frontend.existingSecret (${frontend.existingSecret}) and workerCallbackProxy.tls.frontend.certificate.issuerRef.name (${frontend.certificate.issuerRef.name}) are both set: the frontend certificate either comes from your Secret or is issued by that issuer. Set one of them`,
    );
  return p;
}

/**
 * On one machine, with the callback proxy on, the stack's pods (invocation.podNetwork,
 * grpcproxy.podNetwork) must lie inside workerCallbackProxy.podNetworks, or the proxy refuses every
 * callback and tunnel to them. (Across machines the pods' addresses come from the cluster, so the
 * rule belongs to the local stack, which calls this.)
 */
export function localPodNetworkProblems(c: {
  workerCallbackProxy: WorkerCallbackProxyConfig;
  invocation: InvocationConfig;
  grpcproxy: GrpcproxyConfig;
}): string[] {
  const p: string[] = [];
  const proxy = c.workerCallbackProxy;
  if (!proxy.enabled) return p;
  const inside = (cidr: string) => {
    const net = parseCidr(cidr);
    return proxy.podNetworks.some((n) => {
      const outer = parseCidr(n);
      return outer.bits <= net.bits && cidrContains(outer, cidr.split("/")[0]);
    });
  };
  const pods: Array<[string, string, boolean]> = [
    ["invocation.podNetwork", c.invocation.podNetwork, c.invocation.replicaCount > 0],
    ["grpcproxy.podNetwork", c.grpcproxy.podNetwork, c.grpcproxy.replicaCount > 0],
  ];
  for (const [key, cidr, used] of pods) {
    if (used && !inside(cidr))
      p.push(
        `${key} ${cidr} is not inside workerCallbackProxy.podNetworks (${proxy.podNetworks.join(", ")}): the callback proxy would refuse every worker callback or tunnel to those pods. Add ${cidr} to workerCallbackProxy.podNetworks, or move ${key} inside them`,
      );
  }
  return p;
}
