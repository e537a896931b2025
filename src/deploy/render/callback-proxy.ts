// 32-worker-callback-proxy.yaml: the worker callback proxy, the one door workers use to reach the
// pods, with its frontend certificate (the stack's, or the operator's Secret or issuer).
//
// Each pod runs two containers. `haproxy` (kubernetes.haproxyImage, the official image) carries the
// callbacks with the configuration callplane writes from the environment file (haproxyConfig, in
// the ConfigMap 01-config.yaml holds). `certificates` is callplane's certificate keeper
// (callback-proxy/main.js --runtime-api): it watches the frontend certificate and the stack CA,
// mounted at the same paths in both containers, and replaces them in HAProxy through the runtime
// API socket in a shared emptyDir, so a renewal reaches new TLS sessions without a restart or a
// dropped callback. On stop it withdraws HAProxy's readiness at once, while HAProxy itself keeps
// taking callbacks for the drain delay (preStop) and then soft-stops (the image's stop signal is
// SIGUSR1), letting what is in flight finish within hard-stop-after. The keeper also answers the
// operator console's logs question with HAProxy's access-log ring (read through the same socket),
// over NATS with the `callback-proxy` nkey, the only key mounted in it.
import { basename, dirname } from "node:path";
import type { IContainer } from "kubernetes-models/v1";
import { haproxyConfig } from "../../services/callback-proxy/haproxy-config.js";
import { haproxySettings, type HaproxyConfigOptions } from "../../services/callback-proxy/haproxy-options.js";
import { haproxyErrorFiles } from "../../services/callback-proxy/haproxy-parser-errors.js";
import { HAPROXY, MOUNTS, SERVICES, TLS_SECRETS, WORKLOADS } from "../layout.js";
import { sha256, type RenderContext } from "./context.js";
import {
  baseVolumes,
  caVolume,
  container,
  hardened,
  healthProbes,
  natsKeyVolume,
  podSpec,
  resources,
  roleKey,
  stopSeconds,
  tlsVolume,
} from "./pod.js";
import type { K8sObject } from "./types.js";
import { scaled, service, serviceAccount } from "./workload.js";

/** Where the pod finds the frontend certificate: the keeper's configuration names the same files. */
function frontendDir(k: RenderContext): string {
  return k.plan.frontendFromStackCa ? MOUNTS.proxyFrontend : MOUNTS.proxyFrontendOwn;
}

/**
 * HAProxy's settings as the keeper's copy of the environment file has them (main.ts derives the
 * same from it on one machine), with the pod's paths.
 */
export function haproxyOptions(k: RenderContext): HaproxyConfigOptions {
  const ports = k.plan.ports;
  const settings = haproxySettings(k.c);
  return {
    ...settings,
    listen: { host: "0.0.0.0", port: ports.proxy },
    metricsListen: { host: "0.0.0.0", port: ports.proxyMetrics },
    grpcPodPort: k.grpcOn ? ports.grpcWorkerTls : undefined,
    podNetworks: [...k.plan.podNetworks],
    podPort: settings.upstreamTls ? ports.invocationWorkerTls : ports.invocation,
    files: {
      // a kubernetes.io/tls Secret: HAProxy finds tls.key beside tls.crt
      frontendPem: `${frontendDir(k)}/tls.crt`,
      frontendKeyBeside: true,
      podCa: `${MOUNTS.ca}/ca.crt`,
      adminSocket: HAPROXY.adminSocket,
      errorDir: HAPROXY.configDir,
    },
  };
}

export function haproxyConfigData(k: RenderContext): Record<string, string> {
  const o = haproxyOptions(k);
  const data: Record<string, string> = { "haproxy.cfg": haproxyConfig(o) };
  for (const [path, text] of Object.entries(haproxyErrorFiles(o))) {
    if (dirname(path) !== HAPROXY.configDir)
      throw new Error(
        `HAProxy's error file ${path} is not in ${HAPROXY.configDir}, where its ConfigMap is mounted`,
      );
    data[basename(path)] = text;
  }
  return data;
}

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
  // the same files at the same paths in both containers: the keeper replaces in HAProxy what
  // HAProxy loaded, by its file name
  const certificates = [
    { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
    { name: "frontend-tls", mountPath: frontendDir(k), readOnly: true },
    { name: "haproxy-run", mountPath: HAPROXY.runDir },
  ];
  const haproxy: IContainer = {
    name: "haproxy",
    image: c.kubernetes.haproxyImage,
    imagePullPolicy: c.kubernetes.imagePullPolicy,
    // master-worker mode in the foreground, as the image's entrypoint would start it
    command: ["haproxy", "-W", "-db", "-f", HAPROXY.configFile],
    ports: [
      { name: "worker-tls", containerPort: ports.proxy, protocol: "TCP" },
      { name: "metrics", containerPort: ports.proxyMetrics, protocol: "TCP" },
    ],
    // /health fails from the moment the keeper withdraws readiness
    ...healthProbes("metrics"),
    // callbacks are still taken while endpoints and balancers let go of the pod; then the image's
    // stop signal (SIGUSR1) soft-stops HAProxy
    ...(p.drainDelaySeconds > 0
      ? { lifecycle: { preStop: { exec: { command: ["sleep", String(p.drainDelaySeconds)] } } } }
      : {}),
    resources: resources(k, w),
    // it runs as the pod's uid (not the image's haproxy user), the keeper's too, so the keeper
    // may use the runtime API socket (mode 600); it writes nothing but that socket
    securityContext: hardened(),
    volumeMounts: [{ name: "haproxy-config", mountPath: HAPROXY.configDir, readOnly: true }, ...certificates],
  };
  const keys = natsKeyVolume(k, w, [roleKey("callback-proxy")]);
  const keeper = container(k, w, {
    name: "certificates",
    args: ["--runtime-api", HAPROXY.adminSocket],
    ports: [],
    mounts: [...base.mounts, ...certificates, keys.mount],
    // a Node process that watches two folders (about 90 MiB resident)
    resources: { requests: { cpu: "10m", memory: "96Mi" }, limits: { memory: "192Mi" } },
  });
  const spec = podSpec(
    k,
    w,
    // HAProxy first: `kubectl logs` and `exec` default to it
    [haproxy, keeper],
    [
      ...base.volumes,
      keys.volume,
      caVolume(),
      tlsVolume("frontend-tls", frontendSecret),
      { name: "haproxy-config", configMap: { name: HAPROXY.configMap } },
      { name: "haproxy-run", emptyDir: { medium: "Memory" } },
    ],
    { graceSeconds: stopSeconds(p.drainDelaySeconds, p.shutdownGraceSeconds), spread: true },
  );
  // HAProxy reads its configuration only at start: a change rolls the pods
  const annotations = { "checksum/haproxy": sha256(JSON.stringify(haproxyConfigData(k))) };
  return [
    serviceAccount(k, w),
    service(k, SERVICES.proxy, w, [{ name: "worker-tls", port: ports.proxy }], { type: p.service.type }),
    ...scaled(k, w, spec, p.replicaCount, p.autoscaling, annotations),
  ];
}
