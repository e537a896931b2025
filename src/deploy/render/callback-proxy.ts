// 32-worker-callback-proxy.yaml: the worker callback proxy, the one door workers use to reach the
// pods, with its frontend certificate (the stack's, or the operator's Secret or issuer).
import { MOUNTS, SERVICES, TLS_SECRETS, WORKLOADS } from "../layout.js";
import type { RenderContext } from "./context.js";
import { baseVolumes, caVolume, container, podSpec, stopSeconds, tlsVolume } from "./pod.js";
import type { K8sObject } from "./types.js";
import { scaled, service, serviceAccount } from "./workload.js";

export function renderCallbackProxy(k: RenderContext): K8sObject[] {
  const w = WORKLOADS.proxy;
  const c = k.c;
  const p = c.workerCallbackProxy;
  const ports = k.plan.ports;
  const base = baseVolumes();
  const fr = p.tls.frontend;
  const frontendSecret = fr.existingSecret || TLS_SECRETS.proxyFrontend;
  if (fr.existingSecret)
    k.secrets.use(
      fr.existingSecret,
      ["tls.crt", "tls.key"],
      w.name,
      "your certificate for *.<workerDomain> (workerCallbackProxy.tls.frontend.existingSecret, a kubernetes.io/tls Secret)",
    );
  const frontendPath = k.plan.frontendFromStackCa ? MOUNTS.proxyFrontend : MOUNTS.proxyFrontendOwn;
  const spec = podSpec(
    k,
    w,
    [
      container(k, w, {
        ports: [
          { name: "worker-tls", containerPort: ports.proxy },
          { name: "metrics", containerPort: ports.proxyMetrics },
        ],
        mounts: [
          ...base.mounts,
          { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
          { name: "frontend-tls", mountPath: frontendPath, readOnly: true },
        ],
        probePort: "metrics",
      }),
    ],
    [...base.volumes, caVolume(), tlsVolume("frontend-tls", frontendSecret)],
    { graceSeconds: stopSeconds(p.drainDelaySeconds, p.shutdownGraceSeconds), spread: true },
  );
  return [
    serviceAccount(k, w),
    service(k, SERVICES.proxy, w, [{ name: "worker-tls", port: ports.proxy }], { type: p.service.type }),
    ...scaled(k, w, spec, p.replicaCount, p.autoscaling),
  ];
}
