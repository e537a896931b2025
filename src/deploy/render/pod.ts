// The pieces every callplane pod is built from: its container (image, command, probes, hardening),
// its pod spec (non-root, spread across nodes), the volumes for its configuration, the stack CA,
// TLS Secrets, and only the nkeys and service tokens it needs (the others never reach its file
// system), and the grace a front door gets to drain.
import { basename } from "node:path";
import type { IContainer, IEnvVar, IPodSpec, IProbe, IVolume, IVolumeMount } from "kubernetes-models/v1";
import type { ServiceName } from "../../lib/identity/index.js";
import type { Config } from "../../lib/config/index.js";
import { KEY_FILES, type NatsServiceRole } from "../../lib/nats/index.js";
import { podAnnotationsOf } from "../cluster-config.js";
import { APP_DIR, MOUNTS, SECRETS, TLS_SECRETS, type Workload } from "../layout.js";
import type { RenderContext } from "./context.js";

/** A Secret volume with only the keys this pod needs (the others never reach its file system). */
export function secretVolume(
  k: RenderContext,
  name: string,
  secret: string,
  keys: string[],
  w: Workload,
  how: string,
): IVolume {
  k.secrets.use(secret, keys, w.name, how);
  return {
    name,
    secret: { secretName: secret, defaultMode: 0o440, items: keys.map((key) => ({ key, path: key })) },
  };
}

export function tlsVolume(name: string, secret: string, keys = ["tls.crt", "tls.key"]): IVolume {
  return {
    name,
    secret: { secretName: secret, defaultMode: 0o440, items: keys.map((key) => ({ key, path: key })) },
  };
}

/** The stack CA's certificate alone (cert-manager's CA Secret also holds its key, which stays out). */
export function caVolume(): IVolume {
  return {
    name: "stack-ca",
    secret: { secretName: TLS_SECRETS.ca, defaultMode: 0o444, items: [{ key: "tls.crt", path: "ca.crt" }] },
  };
}

/**
 * A front door's terminationGracePeriodSeconds: its drain delay (readiness already failing, work
 * still taken, while endpoints and balancers let go of the pod), then the grace its in-flight work
 * gets, then 10 s of margin before the kubelet's SIGKILL.
 */
export function stopSeconds(drainDelaySeconds: number, shutdownGraceSeconds: number): number {
  return Math.ceil(drainDelaySeconds + shutdownGraceSeconds) + 10;
}

export function podAnnotations(
  k: RenderContext,
  w: Workload,
  extra: Record<string, string> = {},
): Record<string, string> {
  return { ...podAnnotationsOf(k.c, w), ...extra, "checksum/config": k.configHash };
}

export function resources(k: RenderContext, w: Workload) {
  const r = (k.c as unknown as Record<string, { resources: Config["api"]["resources"] }>)[w.section]
    .resources;
  return {
    requests: { cpu: r.requests.cpu, memory: r.requests.memory },
    limits: { memory: r.limits.memory },
  };
}

export function httpProbe(
  port: string,
  failureThreshold: number,
  periodSeconds = 10,
  scheme?: "HTTPS",
): IProbe {
  return {
    // (the kubelet does not verify an HTTPS probe's certificate)
    httpGet: { path: "/health", port, ...(scheme ? { scheme } : {}) },
    periodSeconds,
    timeoutSeconds: 3,
    failureThreshold,
  };
}

/** Readiness, liveness and startup probes on /health, as every callplane container has them. */
export function healthProbes(
  port: string,
  opts: { scheme?: "HTTPS"; livenessFailures?: number } = {},
): Pick<IContainer, "readinessProbe" | "livenessProbe" | "startupProbe"> {
  return {
    readinessProbe: httpProbe(port, 2, 5, opts.scheme),
    livenessProbe: httpProbe(port, opts.livenessFailures ?? 6, 10, opts.scheme),
    startupProbe: httpProbe(port, 60, 2, opts.scheme),
  };
}

/** What every container of the plane runs with: no privileges, nothing written outside its volumes. */
export function hardened(): NonNullable<IContainer["securityContext"]> {
  return { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ["ALL"] } };
}

export function env(extra: IEnvVar[] = []): IEnvVar[] {
  return [
    { name: "CALLPLANE_CONFIG", value: MOUNTS.configFile },
    { name: "POD_NAME", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } },
    { name: "POD_NAMESPACE", valueFrom: { fieldRef: { fieldPath: "metadata.namespace" } } },
    ...extra,
  ];
}

/** The pod's own address, from the Downward API (invocation and grpc-proxy build callback addresses from it). */
export function podIpEnv(): IEnvVar {
  return { name: "POD_IP", valueFrom: { fieldRef: { fieldPath: "status.podIP" } } };
}

export function baseVolumes(): { volumes: IVolume[]; mounts: IVolumeMount[] } {
  return {
    volumes: [
      { name: "config", configMap: { name: "callplane-config" } },
      { name: "data", emptyDir: {} },
      { name: "tmp", emptyDir: {} },
    ],
    mounts: [
      { name: "config", mountPath: MOUNTS.config, readOnly: true },
      { name: "data", mountPath: MOUNTS.dataDir },
      { name: "tmp", mountPath: MOUNTS.tmp },
    ],
  };
}

/** The nkeys a pod needs, by NATS role, and the Secret volume that holds only those. */
export function natsKeyVolume(
  k: RenderContext,
  w: Workload,
  files: string[],
): { volume: IVolume; mount: IVolumeMount } {
  return {
    volume: secretVolume(
      k,
      "nats-keys",
      SECRETS.natsKeys,
      files,
      w,
      "NATS nkey seeds, one file per key (`callplane credentials generate` writes them)",
    ),
    mount: { name: "nats-keys", mountPath: MOUNTS.natsKeys, readOnly: true },
  };
}

export function roleKey(role: NatsServiceRole): string {
  return basename(KEY_FILES.role("/", role));
}

export function tokenVolume(
  k: RenderContext,
  w: Workload,
  services: ServiceName[],
): { volume: IVolume; mount: IVolumeMount } {
  return {
    volume: secretVolume(
      k,
      "service-tokens",
      SECRETS.serviceTokens,
      services.map((s) => `${s}.token`),
      w,
      "service tokens with which callplane's services call the API, one `<service>.token` per service",
    ),
    mount: { name: "service-tokens", mountPath: MOUNTS.serviceTokens, readOnly: true },
  };
}

export function container(
  k: RenderContext,
  w: Workload,
  opts: {
    ports: Array<{ name: string; containerPort: number }>;
    env?: IEnvVar[];
    mounts: IVolumeMount[];
    probePort?: string;
    /** HTTPS: the port serves TLS only (the admission webhook). */
    probeScheme?: "HTTPS";
    livenessFailures?: number;
    /** The container's name when the pod has more than one (default: the component). */
    name?: string;
    /** Arguments after main.js. */
    args?: string[];
    /** Default: the workload's `<section>.resources`. */
    resources?: IContainer["resources"];
  },
): IContainer {
  return {
    name: opts.name ?? w.component,
    image: k.image,
    imagePullPolicy: k.c.kubernetes.imagePullPolicy,
    command: ["node", `${APP_DIR}/dist/src/services/${w.dir}/main.js`, ...(opts.args ?? [])],
    env: env(opts.env),
    ports: opts.ports.map((p) => ({ ...p, protocol: "TCP" })),
    ...(opts.probePort
      ? healthProbes(opts.probePort, { scheme: opts.probeScheme, livenessFailures: opts.livenessFailures })
      : {}),
    resources: opts.resources ?? resources(k, w),
    securityContext: hardened(),
    volumeMounts: opts.mounts,
  };
}

export function podSpec(
  k: RenderContext,
  w: Workload,
  containers: IContainer[],
  volumes: IVolume[],
  opts: { graceSeconds?: number; spread?: boolean; initContainers?: IContainer[] } = {},
): IPodSpec {
  return {
    serviceAccountName: w.name,
    automountServiceAccountToken: false,
    securityContext: {
      runAsNonRoot: true,
      runAsUser: 1000,
      runAsGroup: 1000,
      fsGroup: 1000,
      seccompProfile: { type: "RuntimeDefault" },
    },
    ...(opts.graceSeconds ? { terminationGracePeriodSeconds: opts.graceSeconds } : {}),
    ...(opts.spread
      ? {
          topologySpreadConstraints: [
            {
              maxSkew: 1,
              topologyKey: "kubernetes.io/hostname",
              whenUnsatisfiable: "ScheduleAnyway",
              labelSelector: { matchLabels: k.selector(w) },
            },
          ],
        }
      : {}),
    ...(opts.initContainers ? { initContainers: opts.initContainers } : {}),
    containers,
    volumes,
  };
}
