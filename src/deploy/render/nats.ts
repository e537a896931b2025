// 10-nats.yaml: the NATS StatefulSet (three JetStream servers, nats-conf.ts says how they are
// configured), its Services and disruption budget. An init container writes the accounts part of
// the configuration from the mounted nkeys at pod start.
import { basename } from "node:path";
import { StatefulSet } from "kubernetes-models/apps/v1";
import type { IContainer, IProbe } from "kubernetes-models/v1";
import { KEY_FILES, SERVICE_ROLES, type NatsServiceRole } from "../../lib/nats/index.js";
import { podAnnotationsOf } from "../cluster-config.js";
import {
  APP_DIR,
  MOUNTS,
  NATS_CLUSTER_SIZE,
  NATS_PORTS,
  SERVICES,
  TLS_SECRETS,
  WORKLOADS,
} from "../layout.js";
import { sha256, type RenderContext } from "./context.js";
import { natsServerConf } from "./nats-conf.js";
import { natsKeyVolume, podSpec, resources, roleKey, tlsVolume } from "./pod.js";
import type { K8sObject } from "./types.js";
import { pdb, service, serviceAccount } from "./workload.js";

export function natsConfText(k: RenderContext): string {
  return natsServerConf({ names: k.plan.names, maxPayload: 8 * 1024 * 1024 });
}

export function renderNats(k: RenderContext): K8sObject[] {
  const w = WORKLOADS.nats;
  const roles = Object.keys(SERVICE_ROLES) as NatsServiceRole[];
  const keyFiles = [...roles.map((r) => roleKey(r)), basename(KEY_FILES.calloutIssuer("/"))];
  const keys = natsKeyVolume(k, w, keyFiles);
  const natsHash = sha256(`${natsConfText(k)}\n${k.c.global.region}\n${k.version}`);
  const authConf = `${MOUNTS.natsAuth}/auth.conf`;
  const init: IContainer = {
    name: "auth-config",
    image: k.image,
    imagePullPolicy: k.c.kubernetes.imagePullPolicy,
    // the accounts block names the services' public keys: derived from the mounted seeds here
    command: [
      "node",
      `${APP_DIR}/dist/src/cli/main.js`,
      "nats",
      "auth-config",
      "--credentials-dir",
      MOUNTS.natsKeys,
      "--region",
      k.c.global.region,
      "--out",
      authConf,
    ],
    resources: { requests: { cpu: "10m", memory: "64Mi" }, limits: { memory: "128Mi" } },
    securityContext: {
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ["ALL"] },
    },
    volumeMounts: [keys.mount, { name: "auth", mountPath: MOUNTS.natsAuth }],
  };
  const probe = (path: string, failureThreshold: number, periodSeconds: number): IProbe => ({
    httpGet: { path, port: "monitor" },
    periodSeconds,
    timeoutSeconds: 3,
    failureThreshold,
  });
  const container: IContainer = {
    name: "nats",
    image: k.c.kubernetes.natsImage,
    imagePullPolicy: k.c.kubernetes.imagePullPolicy,
    args: ["--config", `${MOUNTS.natsConfig}/nats.conf`],
    env: [{ name: "POD_NAME", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } }],
    ports: [
      { name: "client", containerPort: NATS_PORTS.client, protocol: "TCP" },
      { name: "cluster", containerPort: NATS_PORTS.cluster, protocol: "TCP" },
      { name: "monitor", containerPort: NATS_PORTS.monitor, protocol: "TCP" },
    ],
    // the probes the NATS project's own chart uses: ready once JetStream serves, alive while it is on
    startupProbe: probe("/healthz?js-enabled-only=true", 90, 10),
    readinessProbe: probe("/healthz?js-server-only=true", 3, 10),
    livenessProbe: probe("/healthz?js-enabled-only=true", 3, 30),
    // lame duck mode: clients move to the other servers before this one stops
    lifecycle: { preStop: { exec: { command: ["nats-server", "-sl=ldm=/var/run/nats/nats.pid"] } } },
    resources: resources(k, w),
    securityContext: {
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ["ALL"] },
    },
    volumeMounts: [
      { name: "config", mountPath: MOUNTS.natsConfig, readOnly: true },
      { name: "auth", mountPath: MOUNTS.natsAuth, readOnly: true },
      { name: "tls", mountPath: MOUNTS.natsTls, readOnly: true },
      { name: "data", mountPath: MOUNTS.natsData },
      { name: "pid", mountPath: "/var/run/nats" },
    ],
  };
  const storage = k.c.kubernetes.nats;
  const sts = new StatefulSet({
    metadata: k.meta(w.name, w),
    spec: {
      replicas: NATS_CLUSTER_SIZE,
      serviceName: SERVICES.natsHeadless,
      // the servers find each other at start: all three start together
      podManagementPolicy: "Parallel",
      updateStrategy: { type: "RollingUpdate" },
      selector: { matchLabels: k.selector(w) },
      template: {
        metadata: {
          labels: k.labels(w),
          annotations: {
            ...podAnnotationsOf(k.c, w),
            "checksum/config": natsHash,
          },
        },
        spec: podSpec(
          k,
          w,
          [container],
          [
            { name: "config", configMap: { name: "nats-config" } },
            { name: "auth", emptyDir: { medium: "Memory" } },
            tlsVolume("tls", TLS_SECRETS.nats, ["tls.crt", "tls.key", "ca.crt"]),
            { name: "pid", emptyDir: {} },
            keys.volume,
          ],
          { graceSeconds: 60, spread: true, initContainers: [init] },
        ),
      },
      volumeClaimTemplates: [
        {
          metadata: { name: "data" },
          spec: {
            accessModes: ["ReadWriteOnce"],
            ...(storage.storageClassName ? { storageClassName: storage.storageClassName } : {}),
            resources: { requests: { storage: storage.storageSize } },
          },
        },
      ],
    },
  });
  return [
    serviceAccount(k, w),
    service(k, SERVICES.nats, w, [{ name: "client", port: NATS_PORTS.client }]),
    service(
      k,
      SERVICES.natsHeadless,
      w,
      [
        { name: "client", port: NATS_PORTS.client },
        { name: "cluster", port: NATS_PORTS.cluster },
        { name: "monitor", port: NATS_PORTS.monitor },
      ],
      { headless: true },
    ),
    sts,
    pdb(k, w),
  ];
}
