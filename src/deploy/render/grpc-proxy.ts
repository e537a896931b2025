// 31-grpc-proxy.yaml: the gRPC front door: its client and CONNECT listeners, the headless Service
// that gives each pod the DNS name workers open tunnels to, its pod certificate, and the client
// listener's TLS certificate when that is on.
import type { IEnvVar } from "kubernetes-models/v1";
import { MOUNTS, SECRETS, SERVICES, TLS_SECRETS, WORKLOADS } from "../layout.js";
import type { RenderContext } from "./context.js";
import {
  baseVolumes,
  caVolume,
  container,
  natsKeyVolume,
  podIpEnv,
  podSpec,
  roleKey,
  stopSeconds,
  tlsVolume,
  tokenVolume,
} from "./pod.js";
import type { K8sObject } from "./types.js";
import { scaled, service, serviceAccount } from "./workload.js";

export function renderGrpcProxy(k: RenderContext): K8sObject[] {
  const w = WORKLOADS.grpc;
  const c = k.c;
  const ports = k.plan.ports;
  const base = baseVolumes();
  const keys = natsKeyVolume(k, w, [roleKey("grpc-proxy")]);
  // the invocation plane's service identity at the API (the key check is the same for HTTP and gRPC)
  const tokens = tokenVolume(k, w, ["invocation"]);
  const volumes = [...base.volumes, keys.volume, tokens.volume, caVolume()];
  const mounts = [
    ...base.mounts,
    keys.mount,
    tokens.mount,
    { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
  ];
  const env: IEnvVar[] = [podIpEnv()];
  const containerPorts = [
    { name: "grpc", containerPort: ports.grpc },
    { name: "connect", containerPort: ports.grpcConnect },
  ];
  if (k.proxyOn) {
    volumes.push(tlsVolume("pod-tls", TLS_SECRETS.grpcPods));
    mounts.push({ name: "pod-tls", mountPath: MOUNTS.podTls, readOnly: true });
    env.push({ name: "CALLPLANE_POD_TLS_DIR", value: MOUNTS.podTls });
    containerPorts.push({ name: "worker-tls", containerPort: ports.grpcWorkerTls });
  }
  if (c.grpcproxy.tls.enabled) {
    volumes.push(tlsVolume("client-tls", SECRETS.grpcClientTls));
    k.secrets.use(
      SECRETS.grpcClientTls,
      ["tls.crt", "tls.key"],
      w.name,
      "the TLS certificate of grpc-proxy's client listener (a kubernetes.io/tls Secret you create)",
    );
    mounts.push({ name: "client-tls", mountPath: MOUNTS.grpcClientTls, readOnly: true });
  }
  const spec = podSpec(
    k,
    w,
    // /health is on the CONNECT listener
    [container(k, w, { ports: containerPorts, env, mounts, probePort: "connect" })],
    volumes,
    {
      graceSeconds: stopSeconds(c.grpcproxy.drainDelaySeconds, c.grpcproxy.shutdownGraceSeconds),
      spread: true,
    },
  );
  return [
    serviceAccount(k, w),
    service(k, SERVICES.grpc, w, [
      { name: "grpc", port: ports.grpc },
      { name: "connect", port: ports.grpcConnect },
    ]),
    service(
      k,
      SERVICES.grpcHeadless,
      w,
      containerPorts.map((p) => ({ name: p.name, port: p.containerPort })),
      { headless: true },
    ),
    ...scaled(k, w, spec, c.grpcproxy.replicaCount, c.grpcproxy.deployment.autoscaling),
  ];
}
