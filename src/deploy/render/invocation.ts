// 30-invocation.yaml: the invocation service, a front door: its ClusterIP Service for clients, the
// headless Service that gives each pod the DNS name workers call it back at, and the pod
// certificate the callback proxy checks it by.
import type { IEnvVar } from "kubernetes-models/v1";
import { MOUNTS, SERVICES, TLS_SECRETS, WORKLOADS } from "../layout.js";
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

export function renderInvocation(k: RenderContext): K8sObject[] {
  const w = WORKLOADS.invocation;
  const c = k.c;
  const ports = k.plan.ports;
  const base = baseVolumes();
  const keys = natsKeyVolume(k, w, [roleKey("invocation")]);
  const tokens = tokenVolume(k, w, ["invocation"]);
  const volumes = [...base.volumes, keys.volume, tokens.volume, caVolume()];
  const mounts = [
    ...base.mounts,
    keys.mount,
    tokens.mount,
    { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
  ];
  const env: IEnvVar[] = [podIpEnv()];
  const containerPorts = [{ name: "http", containerPort: ports.invocation }];
  if (k.upstreamTls) {
    volumes.push(tlsVolume("pod-tls", TLS_SECRETS.invocationPods));
    mounts.push({ name: "pod-tls", mountPath: MOUNTS.podTls, readOnly: true });
    env.push({ name: "CALLPLANE_POD_TLS_DIR", value: MOUNTS.podTls });
    containerPorts.push({ name: "worker-tls", containerPort: ports.invocationWorkerTls });
  }
  const spec = podSpec(
    k,
    w,
    [container(k, w, { ports: containerPorts, env, mounts, probePort: "http" })],
    volumes,
    {
      graceSeconds: stopSeconds(c.invocation.drainDelaySeconds, c.invocation.shutdownGraceSeconds),
      spread: true,
    },
  );
  const svcPorts = containerPorts.map((p) => ({ name: p.name, port: p.containerPort }));
  return [
    serviceAccount(k, w),
    service(k, SERVICES.invocation, w, [{ name: "http", port: ports.invocation }]),
    service(k, SERVICES.invocationHeadless, w, svcPorts, { headless: true }),
    ...scaled(k, w, spec, c.invocation.replicaCount, c.invocation.autoscaling),
  ];
}
