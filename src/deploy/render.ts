// `callplane render`: the manifests of a whole control plane, from the environment file `npm start`
// uses. Every object is built with the typed models of kubernetes-models, @kubernetes-models/
// gateway-api and @kubernetes-models/cert-manager (so a misspelt field does not compile) and is
// validated against the schemas they carry (validate.ts). Nothing here reads a Secret's value:
// Secrets are referenced by name, and `callplane credentials generate` makes their contents.
import { createHash } from "node:crypto";
import { basename } from "node:path";
import { Deployment, StatefulSet } from "kubernetes-models/apps/v1";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2";
import { NetworkPolicy, type INetworkPolicyPeer } from "kubernetes-models/networking.k8s.io/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { Role, RoleBinding } from "kubernetes-models/rbac.authorization.k8s.io/v1";
import {
  ConfigMap,
  Namespace,
  PersistentVolumeClaim,
  Service,
  ServiceAccount,
  type IContainer,
  type IEnvVar,
  type IPodSpec,
  type IProbe,
  type IVolume,
  type IVolumeMount,
} from "kubernetes-models/v1";
import { Gateway, HTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1";
import { TCPRoute, TLSRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1alpha2";
import { Certificate, Issuer } from "@kubernetes-models/cert-manager/cert-manager.io/v1";
import { stringify } from "yaml";
import { SERVICE_SCOPES, type ServiceName } from "../lib/auth.js";
import type { Config } from "../lib/config.js";
import { KEY_FILES, SERVICE_ROLES, type NatsServiceRole } from "../lib/nats-auth.js";
import { planCluster, podAnnotationsOf, type ClusterPlan, type RawDocument } from "./cluster-config.js";
import {
  APP_DIR,
  GATEWAY,
  ISSUERS,
  MANAGED_BY,
  MOUNTS,
  PART_OF,
  SECRETS,
  SERVICES,
  TLS_SECRETS,
  WORKLOADS,
  type Workload,
} from "./layout.js";
import { NATS_CLUSTER_SIZE, NATS_PORTS, natsServerConf } from "./nats.js";

/** What every rendered object offers, whichever models package made it. */
export interface K8sObject {
  apiVersion: string;
  kind: string;
  metadata?: { name?: string; namespace?: string } | undefined;
  toJSON(): unknown;
  validate(): void;
}

export interface RenderedFile {
  name: string;
  objects: K8sObject[];
}

/** A Secret the manifests reference, what keys it must hold, and who mounts it. */
export interface SecretUse {
  name: string;
  keys: string[];
  usedBy: string[];
  how: string;
}

export interface RenderResult {
  namespace: string;
  workerNamespace: string;
  files: RenderedFile[];
  secrets: SecretUse[];
  notes: string[];
}

export class RenderError extends Error {
  readonly problems: string[];
  constructor(source: string, problems: string[]) {
    super(`cannot render ${source}:\n${problems.map((p) => `  - ${p}`).join("\n")}`);
    this.name = "RenderError";
    this.problems = problems;
  }
}

export interface RenderInput {
  config: Config;
  /** The environment file as written (to tell what it sets from what defaults). */
  raw: RawDocument;
  /** callplane's version: the default image tag and the version label. */
  version: string;
  source: string;
}

const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

export function renderControlPlane(input: RenderInput): RenderResult {
  const { config, raw, version } = input;
  const planned = planCluster(config, raw);
  if ("problems" in planned) throw new RenderError(input.source, planned.problems);
  return new Renderer(config, planned, version).render();
}

type Labels = Record<string, string>;

class Renderer {
  private readonly ns: string;
  private readonly workerNs: string;
  private readonly image: string;
  private readonly configText: string;
  private readonly configHash: string;
  private readonly secretUses = new Map<string, SecretUse>();
  private readonly proxyOn: boolean;
  private readonly upstreamTls: boolean;
  private readonly grpcOn: boolean;

  constructor(
    private readonly c: Config,
    private readonly plan: ClusterPlan,
    private readonly version: string,
  ) {
    this.ns = plan.names.namespace;
    this.workerNs = c.kubernetes.workerNamespace;
    this.image = c.kubernetes.image || `callplane:${version}`;
    this.configText = [
      "# The environment file as callplane's pods read it (rendered by `callplane render`): the file you",
      "# rendered from, with listen addresses, URLs and file paths set for the cluster, and without the",
      "# keys only the manifests read. Edit the source file and render again; do not edit this copy.",
      stringify(plan.document, { sortMapEntries: true }).trimEnd(),
      "",
    ].join("\n");
    this.configHash = sha256(this.configText);
    this.proxyOn = c.workerCallbackProxy.enabled;
    this.upstreamTls = this.proxyOn && c.workerCallbackProxy.invocation.upstreamTls.enabled;
    this.grpcOn = c.grpcproxy.replicaCount > 0;
  }

  render(): RenderResult {
    const c = this.c;
    const files: RenderedFile[] = [
      { name: "00-namespaces.yaml", objects: this.namespaces() },
      { name: "01-config.yaml", objects: this.configMaps() },
      { name: "02-certificates.yaml", objects: this.certificates() },
    ];
    if (c.nats.server.enabled) files.push({ name: "10-nats.yaml", objects: this.nats() });
    files.push({ name: "11-nats-auth-callout.yaml", objects: this.callout() });
    files.push({ name: "20-api.yaml", objects: this.api() });
    if (c.adminIssuerProxy.enabled) files.push({ name: "21-admin-issuer.yaml", objects: this.issuer() });
    files.push({ name: "30-invocation.yaml", objects: this.invocation() });
    if (this.grpcOn) files.push({ name: "31-grpc-proxy.yaml", objects: this.grpcProxy() });
    if (this.proxyOn) files.push({ name: "32-worker-callback-proxy.yaml", objects: this.callbackProxy() });
    files.push({ name: "40-compute.yaml", objects: this.compute() });
    if (c.ingress.gatewayApi.enabled) files.push({ name: "50-gateway.yaml", objects: this.gateway() });
    files.push({ name: "60-network-policies.yaml", objects: this.networkPolicies() });
    return {
      namespace: this.ns,
      workerNamespace: this.workerNs,
      files,
      secrets: [...this.secretUses.values()],
      notes: this.plan.notes,
    };
  }

  // ---------------------------------------------------------------- shared pieces

  private labels(w: Workload): Labels {
    return {
      "app.kubernetes.io/name": w.name,
      "app.kubernetes.io/instance": w.name,
      "app.kubernetes.io/component": w.component,
      "app.kubernetes.io/part-of": PART_OF,
      "app.kubernetes.io/managed-by": MANAGED_BY,
      "app.kubernetes.io/version": this.version,
    };
  }

  private selector(w: Workload): Labels {
    return { "app.kubernetes.io/name": w.name, "app.kubernetes.io/instance": w.name };
  }

  private meta(name: string, w?: Workload, namespace = this.ns) {
    return {
      name,
      namespace,
      labels: w
        ? this.labels(w)
        : {
            "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": MANAGED_BY,
            "app.kubernetes.io/version": this.version,
          },
    };
  }

  private useSecret(name: string, keys: string[], usedBy: string, how: string): void {
    const cur = this.secretUses.get(name);
    if (cur) {
      for (const k of keys) if (!cur.keys.includes(k)) cur.keys.push(k);
      if (!cur.usedBy.includes(usedBy)) cur.usedBy.push(usedBy);
    } else {
      this.secretUses.set(name, { name, keys: [...keys], usedBy: [usedBy], how });
    }
  }

  /** A Secret volume with only the keys this pod needs (the others never reach its file system). */
  private secretVolume(name: string, secret: string, keys: string[], w: Workload, how: string): IVolume {
    this.useSecret(secret, keys, w.name, how);
    return {
      name,
      secret: { secretName: secret, defaultMode: 0o440, items: keys.map((key) => ({ key, path: key })) },
    };
  }

  private tlsVolume(name: string, secret: string, keys = ["tls.crt", "tls.key"]): IVolume {
    return {
      name,
      secret: { secretName: secret, defaultMode: 0o440, items: keys.map((key) => ({ key, path: key })) },
    };
  }

  /** The stack CA's certificate alone (cert-manager's CA Secret also holds its key, which stays out). */
  private caVolume(): IVolume {
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
  private stopSeconds(drainDelaySeconds: number, shutdownGraceSeconds: number): number {
    return Math.ceil(drainDelaySeconds + shutdownGraceSeconds) + 10;
  }

  private podAnnotations(w: Workload, extra: Record<string, string> = {}): Record<string, string> {
    return { ...podAnnotationsOf(this.c, w), ...extra, "checksum/config": this.configHash };
  }

  private resources(w: Workload) {
    const r = (this.c as unknown as Record<string, { resources: Config["api"]["resources"] }>)[w.section]
      .resources;
    return {
      requests: { cpu: r.requests.cpu, memory: r.requests.memory },
      limits: { memory: r.limits.memory },
    };
  }

  private httpProbe(port: string, failureThreshold: number, periodSeconds = 10): IProbe {
    return {
      httpGet: { path: "/health", port },
      periodSeconds,
      timeoutSeconds: 3,
      failureThreshold,
    };
  }

  private env(extra: IEnvVar[] = []): IEnvVar[] {
    return [
      { name: "CALLPLANE_CONFIG", value: MOUNTS.configFile },
      { name: "POD_NAME", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } },
      { name: "POD_NAMESPACE", valueFrom: { fieldRef: { fieldPath: "metadata.namespace" } } },
      ...extra,
    ];
  }

  private readonly podIpEnv: IEnvVar = {
    name: "POD_IP",
    valueFrom: { fieldRef: { fieldPath: "status.podIP" } },
  };

  private baseVolumes(): { volumes: IVolume[]; mounts: IVolumeMount[] } {
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
  private natsKeyVolume(w: Workload, files: string[]): { volume: IVolume; mount: IVolumeMount } {
    return {
      volume: this.secretVolume(
        "nats-keys",
        SECRETS.natsKeys,
        files,
        w,
        "NATS nkey seeds, one file per key (`callplane credentials generate` writes them)",
      ),
      mount: { name: "nats-keys", mountPath: MOUNTS.natsKeys, readOnly: true },
    };
  }

  private roleKey(role: NatsServiceRole): string {
    return basename(KEY_FILES.role("/", role));
  }

  private tokenVolume(w: Workload, services: ServiceName[]): { volume: IVolume; mount: IVolumeMount } {
    return {
      volume: this.secretVolume(
        "service-tokens",
        SECRETS.serviceTokens,
        services.map((s) => `${s}.token`),
        w,
        "service tokens with which callplane's services call the API, one `<service>.token` per service",
      ),
      mount: { name: "service-tokens", mountPath: MOUNTS.serviceTokens, readOnly: true },
    };
  }

  private container(
    w: Workload,
    opts: {
      ports: Array<{ name: string; containerPort: number }>;
      env?: IEnvVar[];
      mounts: IVolumeMount[];
      probePort?: string;
      livenessFailures?: number;
    },
  ): IContainer {
    return {
      name: w.component,
      image: this.image,
      imagePullPolicy: this.c.kubernetes.imagePullPolicy,
      command: ["node", `${APP_DIR}/dist/src/services/${w.dir}/main.js`],
      env: this.env(opts.env),
      ports: opts.ports.map((p) => ({ ...p, protocol: "TCP" })),
      ...(opts.probePort
        ? {
            readinessProbe: this.httpProbe(opts.probePort, 2, 5),
            livenessProbe: this.httpProbe(opts.probePort, opts.livenessFailures ?? 6),
            startupProbe: this.httpProbe(opts.probePort, 60, 2),
          }
        : {}),
      resources: this.resources(w),
      securityContext: {
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: true,
        capabilities: { drop: ["ALL"] },
      },
      volumeMounts: opts.mounts,
    };
  }

  private podSpec(
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
                labelSelector: { matchLabels: this.selector(w) },
              },
            ],
          }
        : {}),
      ...(opts.initContainers ? { initContainers: opts.initContainers } : {}),
      containers,
      volumes,
    };
  }

  private serviceAccount(w: Workload): ServiceAccount {
    return new ServiceAccount({ metadata: this.meta(w.name, w), automountServiceAccountToken: false });
  }

  private deployment(
    w: Workload,
    spec: IPodSpec,
    opts: {
      replicas: number;
      autoscaled?: boolean;
      recreate?: boolean;
      annotations?: Record<string, string>;
    },
  ): Deployment {
    return new Deployment({
      metadata: this.meta(w.name, w),
      spec: {
        // an autoscaler owns the count: a replica count here would reset it at every apply
        ...(opts.autoscaled ? {} : { replicas: opts.replicas }),
        revisionHistoryLimit: 5,
        selector: { matchLabels: this.selector(w) },
        strategy: opts.recreate
          ? { type: "Recreate" }
          : { type: "RollingUpdate", rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } },
        template: {
          metadata: { labels: this.labels(w), annotations: this.podAnnotations(w, opts.annotations) },
          spec,
        },
      },
    });
  }

  /** A disruption budget for what runs more than one pod: a drain takes one at a time. */
  private pdb(w: Workload): PodDisruptionBudget {
    return new PodDisruptionBudget({
      metadata: this.meta(w.name, w),
      spec: { maxUnavailable: 1, selector: { matchLabels: this.selector(w) } },
    });
  }

  private hpa(
    w: Workload,
    a: Config["invocation"]["autoscaling"],
    kind = "Deployment",
  ): HorizontalPodAutoscaler {
    return new HorizontalPodAutoscaler({
      metadata: this.meta(w.name, w),
      spec: {
        scaleTargetRef: { apiVersion: "apps/v1", kind, name: w.name },
        minReplicas: a.minReplicas,
        maxReplicas: a.maxReplicas,
        metrics: [
          {
            type: "Resource",
            resource: {
              name: "cpu",
              target: { type: "Utilization", averageUtilization: a.targetCPUUtilizationPercentage },
            },
          },
        ],
      },
    });
  }

  /** Deployment, and with more than one replica (or an autoscaler) its disruption budget and HPA. */
  private scaled(
    w: Workload,
    spec: IPodSpec,
    replicas: number,
    autoscaling?: Config["invocation"]["autoscaling"],
  ): K8sObject[] {
    const auto = autoscaling?.enabled === true;
    const out: K8sObject[] = [this.deployment(w, spec, { replicas, autoscaled: auto })];
    if (replicas > 1 || (auto && autoscaling.minReplicas > 1)) out.push(this.pdb(w));
    if (auto) out.push(this.hpa(w, autoscaling));
    return out;
  }

  private service(
    name: string,
    w: Workload,
    ports: Array<{ name: string; port: number }>,
    opts: { headless?: boolean; type?: "ClusterIP" | "LoadBalancer" | "NodePort" } = {},
  ): Service {
    return new Service({
      metadata: this.meta(name, w),
      spec: {
        ...(opts.headless
          ? // pod DNS names stay while a pod drains, so its in-flight callbacks still reach it
            { clusterIP: "None", publishNotReadyAddresses: true }
          : { type: opts.type ?? "ClusterIP" }),
        selector: this.selector(w),
        ports: ports.map((p) => ({ name: p.name, port: p.port, targetPort: p.name, protocol: "TCP" })),
      },
    });
  }

  // ---------------------------------------------------------------- namespaces and configuration

  private namespaces(): K8sObject[] {
    return [
      new Namespace({ metadata: { name: this.ns, labels: this.meta(this.ns).labels } }),
      new Namespace({
        metadata: {
          name: this.workerNs,
          labels: { ...this.meta(this.workerNs).labels, "callplane.io/role": "workers" },
        },
      }),
    ];
  }

  private natsConfText(): string {
    return natsServerConf({ names: this.plan.names, maxPayload: 8 * 1024 * 1024 });
  }

  private configMaps(): K8sObject[] {
    const out: K8sObject[] = [
      new ConfigMap({ metadata: this.meta("callplane-config"), data: { "callplane.yaml": this.configText } }),
    ];
    if (this.c.nats.server.enabled)
      out.push(
        new ConfigMap({
          metadata: this.meta("nats-config", WORKLOADS.nats),
          data: { "nats.conf": this.natsConfText() },
        }),
      );
    return out;
  }

  // ---------------------------------------------------------------- certificates

  private certificate(
    name: string,
    secretName: string,
    dnsNames: string[],
    opts: {
      usages?: Array<"server auth" | "client auth">;
      issuer?: { kind: string; name: string };
      duration?: string;
    } = {},
  ): Certificate {
    return new Certificate({
      metadata: this.meta(name),
      spec: {
        secretName,
        dnsNames,
        duration: opts.duration ?? "2160h",
        renewBefore: "720h",
        privateKey: { algorithm: "ECDSA", size: 256, rotationPolicy: "Always" },
        usages: opts.usages ?? ["server auth"],
        issuerRef: {
          group: "cert-manager.io",
          kind: opts.issuer?.kind ?? "Issuer",
          name: opts.issuer?.name ?? ISSUERS.ca,
        },
      },
    });
  }

  private certificates(): K8sObject[] {
    const out: K8sObject[] = [];
    const f = this.plan.names.fqdn;
    if (!this.plan.ownCa) {
      out.push(
        new Issuer({ metadata: this.meta(ISSUERS.selfSigned), spec: { selfSigned: {} } }),
        new Certificate({
          metadata: this.meta(TLS_SECRETS.ca),
          spec: {
            isCA: true,
            commonName: "callplane stack CA",
            secretName: TLS_SECRETS.ca,
            duration: "87600h",
            privateKey: { algorithm: "ECDSA", size: 256 },
            issuerRef: { group: "cert-manager.io", kind: "Issuer", name: ISSUERS.selfSigned },
          },
        }),
      );
    } else {
      this.secretUses.set(TLS_SECRETS.ca, {
        name: TLS_SECRETS.ca,
        keys: ["tls.crt", "tls.key"],
        usedBy: ["cert-manager (Issuer callplane-ca)", "every callplane pod (tls.crt only)"],
        how: "your stack CA (pki.caCertFile and pki.caKeyFile are set): kubectl create secret tls callplane-ca --cert <pki.caCertFile> --key <pki.caKeyFile>",
      });
    }
    out.push(new Issuer({ metadata: this.meta(ISSUERS.ca), spec: { ca: { secretName: TLS_SECRETS.ca } } }));
    if (this.c.nats.server.enabled) {
      const hosts = [
        SERVICES.nats,
        `${SERVICES.nats}.${this.ns}`,
        `${SERVICES.nats}.${this.ns}.svc`,
        f(SERVICES.nats),
        `*.${f(SERVICES.natsHeadless)}`,
      ];
      if (this.c.ingress.gatewayApi.enabled && this.c.ingress.gatewayApi.routes.nats.enabled)
        hosts.push(`nats.${this.c.ingress.gatewayApi.domain}`);
      // client auth too: the servers' routes verify each other with these certificates
      out.push(
        this.certificate("nats-server", TLS_SECRETS.nats, hosts, { usages: ["server auth", "client auth"] }),
      );
    }
    if (this.proxyOn) {
      const fr = this.c.workerCallbackProxy.tls.frontend;
      const wd = this.c.workerCallbackProxy.workerDomain;
      if (!fr.existingSecret) {
        out.push(
          this.certificate(
            "worker-callback-proxy-frontend",
            TLS_SECRETS.proxyFrontend,
            [`*.${wd}`, wd],
            fr.certificate.issuerRef.name
              ? { issuer: { kind: fr.certificate.issuerRef.kind, name: fr.certificate.issuerRef.name } }
              : {},
          ),
        );
      }
      // Pod certificates: one wildcard per service, as upstream's (seed: worker-callback-proxy.md).
      // A pod's IP is known only once it runs, and cert-manager cannot put it in a certificate
      // (its CSI driver mounts volumes before the IP exists); the proxy checks the name
      // <dashed-ip>.invocation.<serviceDomain>, which the wildcard covers, and dials the IP in it.
      if (this.upstreamTls)
        out.push(
          this.certificate("invocation-service-worker-tls", TLS_SECRETS.invocationPods, [
            `*.${f(SERVICES.invocationHeadless)}`,
          ]),
        );
      if (this.grpcOn)
        out.push(
          this.certificate("grpc-proxy-worker-tls", TLS_SECRETS.grpcPods, [`*.${f(SERVICES.grpcHeadless)}`]),
        );
    }
    return out;
  }

  // ---------------------------------------------------------------- NATS

  private nats(): K8sObject[] {
    const w = WORKLOADS.nats;
    const roles = Object.keys(SERVICE_ROLES) as NatsServiceRole[];
    const keyFiles = [...roles.map((r) => this.roleKey(r)), basename(KEY_FILES.calloutIssuer("/"))];
    const keys = this.natsKeyVolume(w, keyFiles);
    const natsHash = sha256(`${this.natsConfText()}\n${this.c.global.region}\n${this.version}`);
    const authConf = `${MOUNTS.natsAuth}/auth.conf`;
    const init: IContainer = {
      name: "auth-config",
      image: this.image,
      imagePullPolicy: this.c.kubernetes.imagePullPolicy,
      // the accounts block names the services' public keys: derived from the mounted seeds here
      command: [
        "node",
        `${APP_DIR}/dist/src/cli/main.js`,
        "nats",
        "auth-config",
        "--credentials-dir",
        MOUNTS.natsKeys,
        "--region",
        this.c.global.region,
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
      image: this.c.kubernetes.natsImage,
      imagePullPolicy: this.c.kubernetes.imagePullPolicy,
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
      resources: this.resources(w),
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
    const storage = this.c.kubernetes.nats;
    const sts = new StatefulSet({
      metadata: this.meta(w.name, w),
      spec: {
        replicas: NATS_CLUSTER_SIZE,
        serviceName: SERVICES.natsHeadless,
        // the servers find each other at start: all three start together
        podManagementPolicy: "Parallel",
        updateStrategy: { type: "RollingUpdate" },
        selector: { matchLabels: this.selector(w) },
        template: {
          metadata: {
            labels: this.labels(w),
            annotations: {
              ...podAnnotationsOf(this.c, w),
              "checksum/config": natsHash,
            },
          },
          spec: this.podSpec(
            w,
            [container],
            [
              { name: "config", configMap: { name: "nats-config" } },
              { name: "auth", emptyDir: { medium: "Memory" } },
              this.tlsVolume("tls", TLS_SECRETS.nats, ["tls.crt", "tls.key", "ca.crt"]),
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
      this.serviceAccount(w),
      this.service(SERVICES.nats, w, [{ name: "client", port: NATS_PORTS.client }]),
      this.service(
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
      this.pdb(w),
    ];
  }

  private callout(): K8sObject[] {
    const w = WORKLOADS.callout;
    const base = this.baseVolumes();
    const keys = this.natsKeyVolume(w, [
      this.roleKey("nats-auth-callout"),
      basename(KEY_FILES.calloutIssuer("/")),
      // nkey logins are checked against the shared worker key, in either mode
      basename(KEY_FILES.worker("/")),
    ]);
    const tokens = this.tokenVolume(w, ["nats-auth-callout"]);
    const mode = this.c.nats.workerAuth;
    const spec = this.podSpec(
      w,
      [
        this.container(w, {
          ports: [],
          mounts: [
            ...base.mounts,
            keys.mount,
            tokens.mount,
            { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
          ],
        }),
      ],
      [...base.volumes, keys.volume, tokens.volume, this.caVolume()],
    );
    return [
      this.serviceAccount(w),
      this.deployment(w, spec, {
        replicas: 1,
        // it reads its plugins once, at start-up: a change of mode or webhook restarts it
        annotations: {
          "nvcf.nvidia.com/nats-worker-auth": mode,
          "nvcf.nvidia.com/nats-worker-auth-webhook": sha256(
            mode === "token" ? this.c.nats.authCallout.workerTokenAuth.webhookUrl : "",
          ).slice(0, 16),
        },
      }),
    ];
  }

  // ---------------------------------------------------------------- API and issuer

  private mekParts(w: Workload): { volumes: IVolume[]; mounts: IVolumeMount[]; env: IEnvVar[] } {
    const m = this.c.secrets.mek;
    if (m.provider === "file") {
      return {
        volumes: [
          this.secretVolume(
            "mek",
            SECRETS.mek,
            ["mek.json"],
            w,
            "the MEK keyring (`callplane credentials generate`; rotation: docs/kubernetes.md)",
          ),
        ],
        mounts: [{ name: "mek", mountPath: MOUNTS.mek, readOnly: true }],
        env: [],
      };
    }
    if (m.provider === "env") {
      this.useSecret(SECRETS.mek, ["keyring"], w.name, `the MEK keyring JSON, given as ${m.envVariable}`);
      return {
        volumes: [],
        mounts: [],
        env: [{ name: m.envVariable, valueFrom: { secretKeyRef: { name: SECRETS.mek, key: "keyring" } } }],
      };
    }
    return { volumes: [], mounts: [], env: [] };
  }

  private api(): K8sObject[] {
    const w = WORKLOADS.api;
    const c = this.c;
    const base = this.baseVolumes();
    const sqlite = c.api.database.driver === "sqlite";
    const natsFiles = [this.roleKey("api"), this.roleKey("api-revoker")];
    // token mode: the API does not hold the shared worker key at all, so it cannot hand it out
    if (c.nats.workerAuth === "nkey") natsFiles.push(basename(KEY_FILES.worker("/")));
    const keys = this.natsKeyVolume(w, natsFiles);
    const tokens = this.tokenVolume(w, Object.keys(SERVICE_SCOPES) as ServiceName[]);
    const mek = this.mekParts(w);
    const volumes: IVolume[] = [
      ...base.volumes,
      keys.volume,
      tokens.volume,
      this.caVolume(),
      this.secretVolume(
        "admin-key",
        SECRETS.adminKey,
        ["admin-signing.pub.pem"],
        w,
        "the public key of the stack's admin key (or of your identity provider); its private key stays with you",
      ),
      this.secretVolume(
        "worker-identity",
        SECRETS.workerIdentity,
        ["worker-identity.key.pem"],
        w,
        "the key with which the API signs worker identity tokens",
      ),
      ...mek.volumes,
    ];
    const mounts: IVolumeMount[] = [
      ...base.mounts,
      keys.mount,
      tokens.mount,
      { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
      { name: "admin-key", mountPath: MOUNTS.adminKey, readOnly: true },
      { name: "worker-identity", mountPath: MOUNTS.workerIdentity, readOnly: true },
      ...mek.mounts,
    ];
    if (c.adminIssuerProxy.enabled) {
      volumes.push(
        this.secretVolume(
          "issuer-key",
          SECRETS.issuerKey,
          ["admin-issuer.pub.pem"],
          w,
          "the admin issuer's key pair (the API reads only the public key)",
        ),
      );
      mounts.push({ name: "issuer-key", mountPath: MOUNTS.issuerKey, readOnly: true });
    }
    if (sqlite) {
      volumes.push({ name: "db", persistentVolumeClaim: { claimName: `${w.name}-db` } });
      mounts.push({ name: "db", mountPath: MOUNTS.sqliteDir });
    }
    const env: IEnvVar[] = [...mek.env];
    if (!sqlite) {
      this.useSecret(
        SECRETS.database,
        ["url"],
        w.name,
        "the PostgreSQL URL, postgres://user:password@host:port/database",
      );
      env.push({
        name: "CALLPLANE__API__DATABASE__URL",
        valueFrom: { secretKeyRef: { name: SECRETS.database, key: "url" } },
      });
    }
    const spec = this.podSpec(
      w,
      [
        this.container(w, {
          ports: [{ name: "http", containerPort: this.plan.ports.api }],
          env,
          mounts,
          probePort: "http",
        }),
      ],
      volumes,
      { spread: c.api.replicaCount > 1 },
    );
    const out: K8sObject[] = [
      this.serviceAccount(w),
      this.service(SERVICES.api, w, [{ name: "http", port: this.plan.ports.api }]),
    ];
    if (sqlite)
      out.push(
        new PersistentVolumeClaim({
          metadata: this.meta(`${w.name}-db`, w),
          spec: {
            accessModes: ["ReadWriteOnce"],
            ...(c.kubernetes.nats.storageClassName
              ? { storageClassName: c.kubernetes.nats.storageClassName }
              : {}),
            resources: { requests: { storage: "1Gi" } },
          },
        }),
      );
    // one SQLite writer: the old pod stops before the new one opens the file
    out.push(this.deployment(w, spec, { replicas: c.api.replicaCount, recreate: sqlite }));
    if (c.api.replicaCount > 1) out.push(this.pdb(w));
    return out;
  }

  private issuer(): K8sObject[] {
    const w = WORKLOADS.issuer;
    const base = this.baseVolumes();
    const spec = this.podSpec(
      w,
      [
        this.container(w, {
          ports: [{ name: "http", containerPort: this.plan.ports.issuer }],
          mounts: [...base.mounts, { name: "issuer-key", mountPath: MOUNTS.issuerKey, readOnly: true }],
          probePort: "http",
        }),
      ],
      [
        ...base.volumes,
        this.secretVolume(
          "issuer-key",
          SECRETS.issuerKey,
          ["admin-issuer.key.pem"],
          w,
          "the admin issuer's key pair (the issuer reads only the private key)",
        ),
      ],
    );
    return [
      this.serviceAccount(w),
      this.service(SERVICES.issuer, w, [{ name: "http", port: this.plan.ports.issuer }]),
      this.deployment(w, spec, { replicas: 1 }),
    ];
  }

  // ---------------------------------------------------------------- the front doors

  private invocation(): K8sObject[] {
    const w = WORKLOADS.invocation;
    const c = this.c;
    const ports = this.plan.ports;
    const base = this.baseVolumes();
    const keys = this.natsKeyVolume(w, [this.roleKey("invocation")]);
    const tokens = this.tokenVolume(w, ["invocation"]);
    const volumes = [...base.volumes, keys.volume, tokens.volume, this.caVolume()];
    const mounts = [
      ...base.mounts,
      keys.mount,
      tokens.mount,
      { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
    ];
    const env: IEnvVar[] = [this.podIpEnv];
    const containerPorts = [{ name: "http", containerPort: ports.invocation }];
    if (this.upstreamTls) {
      volumes.push(this.tlsVolume("pod-tls", TLS_SECRETS.invocationPods));
      mounts.push({ name: "pod-tls", mountPath: MOUNTS.podTls, readOnly: true });
      env.push({ name: "CALLPLANE_POD_TLS_DIR", value: MOUNTS.podTls });
      containerPorts.push({ name: "worker-tls", containerPort: ports.invocationWorkerTls });
    }
    const spec = this.podSpec(
      w,
      [this.container(w, { ports: containerPorts, env, mounts, probePort: "http" })],
      volumes,
      {
        graceSeconds: this.stopSeconds(c.invocation.drainDelaySeconds, c.invocation.shutdownGraceSeconds),
        spread: true,
      },
    );
    const svcPorts = containerPorts.map((p) => ({ name: p.name, port: p.containerPort }));
    return [
      this.serviceAccount(w),
      this.service(SERVICES.invocation, w, [{ name: "http", port: ports.invocation }]),
      this.service(SERVICES.invocationHeadless, w, svcPorts, { headless: true }),
      ...this.scaled(w, spec, c.invocation.replicaCount, c.invocation.autoscaling),
    ];
  }

  private grpcProxy(): K8sObject[] {
    const w = WORKLOADS.grpc;
    const c = this.c;
    const ports = this.plan.ports;
    const base = this.baseVolumes();
    const keys = this.natsKeyVolume(w, [this.roleKey("grpc-proxy")]);
    // the invocation plane's service identity at the API (the key check is the same for HTTP and gRPC)
    const tokens = this.tokenVolume(w, ["invocation"]);
    const volumes = [...base.volumes, keys.volume, tokens.volume, this.caVolume()];
    const mounts = [
      ...base.mounts,
      keys.mount,
      tokens.mount,
      { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true },
    ];
    const env: IEnvVar[] = [this.podIpEnv];
    const containerPorts = [
      { name: "grpc", containerPort: ports.grpc },
      { name: "connect", containerPort: ports.grpcConnect },
    ];
    if (this.proxyOn) {
      volumes.push(this.tlsVolume("pod-tls", TLS_SECRETS.grpcPods));
      mounts.push({ name: "pod-tls", mountPath: MOUNTS.podTls, readOnly: true });
      env.push({ name: "CALLPLANE_POD_TLS_DIR", value: MOUNTS.podTls });
      containerPorts.push({ name: "worker-tls", containerPort: ports.grpcWorkerTls });
    }
    if (c.grpcproxy.tls.enabled) {
      volumes.push(this.tlsVolume("client-tls", SECRETS.grpcClientTls));
      this.useSecret(
        SECRETS.grpcClientTls,
        ["tls.crt", "tls.key"],
        w.name,
        "the TLS certificate of grpc-proxy's client listener (a kubernetes.io/tls Secret you create)",
      );
      mounts.push({ name: "client-tls", mountPath: MOUNTS.grpcClientTls, readOnly: true });
    }
    const spec = this.podSpec(
      w,
      // /health is on the CONNECT listener
      [this.container(w, { ports: containerPorts, env, mounts, probePort: "connect" })],
      volumes,
      {
        graceSeconds: this.stopSeconds(c.grpcproxy.drainDelaySeconds, c.grpcproxy.shutdownGraceSeconds),
        spread: true,
      },
    );
    return [
      this.serviceAccount(w),
      this.service(SERVICES.grpc, w, [
        { name: "grpc", port: ports.grpc },
        { name: "connect", port: ports.grpcConnect },
      ]),
      this.service(
        SERVICES.grpcHeadless,
        w,
        containerPorts.map((p) => ({ name: p.name, port: p.containerPort })),
        { headless: true },
      ),
      ...this.scaled(w, spec, c.grpcproxy.replicaCount, c.grpcproxy.deployment.autoscaling),
    ];
  }

  private callbackProxy(): K8sObject[] {
    const w = WORKLOADS.proxy;
    const c = this.c;
    const p = c.workerCallbackProxy;
    const ports = this.plan.ports;
    const base = this.baseVolumes();
    const fr = p.tls.frontend;
    const frontendSecret = fr.existingSecret || TLS_SECRETS.proxyFrontend;
    if (fr.existingSecret)
      this.useSecret(
        fr.existingSecret,
        ["tls.crt", "tls.key"],
        w.name,
        "your certificate for *.<workerDomain> (workerCallbackProxy.tls.frontend.existingSecret, a kubernetes.io/tls Secret)",
      );
    const frontendPath = this.plan.frontendFromStackCa ? MOUNTS.proxyFrontend : MOUNTS.proxyFrontendOwn;
    const spec = this.podSpec(
      w,
      [
        this.container(w, {
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
      [...base.volumes, this.caVolume(), this.tlsVolume("frontend-tls", frontendSecret)],
      { graceSeconds: this.stopSeconds(p.drainDelaySeconds, p.shutdownGraceSeconds), spread: true },
    );
    return [
      this.serviceAccount(w),
      this.service(SERVICES.proxy, w, [{ name: "worker-tls", port: ports.proxy }], { type: p.service.type }),
      ...this.scaled(w, spec, p.replicaCount, p.autoscaling),
    ];
  }

  // ---------------------------------------------------------------- compute

  private compute(): K8sObject[] {
    const w = WORKLOADS.compute;
    const c = this.c;
    const base = this.baseVolumes();
    const tokens = this.tokenVolume(w, ["compute"]);
    const mounts = [...base.mounts, tokens.mount, { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true }];
    const volumes = [...base.volumes, tokens.volume, this.caVolume()];
    if (this.proxyOn && this.plan.frontendFromStackCa) {
      // the local backend hands its workers the CA of the proxy's certificate when it is the stack's
      volumes.push(this.tlsVolume("frontend-ca", TLS_SECRETS.proxyFrontend, ["tls.crt"]));
      mounts.push({ name: "frontend-ca", mountPath: MOUNTS.proxyFrontend, readOnly: true });
    }
    const spec = this.podSpec(
      w,
      [
        this.container(w, {
          ports: [{ name: "http", containerPort: this.plan.ports.compute }],
          mounts,
          probePort: "http",
          // readiness follows the last sync with the API; liveness must not kill it for an API outage
          livenessFailures: 30,
        }),
      ],
      volumes,
      { graceSeconds: Math.ceil(c.compute.stopGraceSeconds) + 15 },
    );
    const role = new Role({
      metadata: this.meta(w.name, w, this.workerNs),
      rules: [
        {
          apiGroups: [""],
          resources: ["pods"],
          verbs: ["get", "list", "watch", "create", "delete", "patch"],
        },
        { apiGroups: [""], resources: ["pods/log"], verbs: ["get"] },
        {
          apiGroups: [""],
          resources: ["secrets"],
          verbs: ["get", "list", "watch", "create", "update", "patch", "delete"],
        },
        { apiGroups: [""], resources: ["events"], verbs: ["create", "patch"] },
      ],
    });
    const binding = new RoleBinding({
      metadata: this.meta(w.name, w, this.workerNs),
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: w.name },
      subjects: [{ kind: "ServiceAccount", name: w.name, namespace: this.ns }],
    });
    return [
      this.serviceAccount(w),
      role,
      binding,
      // one agent: two would both start instances for the same deployments
      this.deployment(w, spec, { replicas: 1, recreate: true }),
    ];
  }

  // ---------------------------------------------------------------- the edge

  private gateway(): K8sObject[] {
    const g = this.c.ingress.gatewayApi;
    const c = this.c;
    const ports = this.plan.ports;
    const listeners: NonNullable<Gateway["spec"]>["listeners"] = [
      {
        name: "http",
        protocol: "HTTP",
        port: 80,
        hostname: `*.${g.domain}`,
        allowedRoutes: { namespaces: { from: "Same" } },
      },
      {
        name: "https",
        protocol: "HTTPS",
        port: 443,
        hostname: `*.${g.domain}`,
        tls: { mode: "Terminate", certificateRefs: [{ kind: "Secret", name: g.tls.secretName }] },
        allowedRoutes: { namespaces: { from: "Same" } },
      },
    ];
    this.useSecret(
      g.tls.secretName,
      ["tls.crt", "tls.key"],
      `Gateway ${GATEWAY}`,
      `the edge's certificate for *.${g.domain} (ingress.gatewayApi.tls.secretName)`,
    );
    const routes: K8sObject[] = [];
    const parent = (sectionName: string) => [{ name: GATEWAY, sectionName }];
    routes.push(
      new HTTPRoute({
        metadata: this.meta("https-redirect"),
        spec: {
          parentRefs: parent("http"),
          rules: [
            { filters: [{ type: "RequestRedirect", requestRedirect: { scheme: "https", statusCode: 301 } }] },
          ],
        },
      }),
      new HTTPRoute({
        metadata: this.meta("nvcf-api", WORKLOADS.api),
        spec: {
          parentRefs: parent("https"),
          hostnames: [`api.${g.domain}`],
          rules: [{ backendRefs: [{ name: SERVICES.api, port: ports.api }] }],
        },
      }),
      new HTTPRoute({
        metadata: this.meta("invocation", WORKLOADS.invocation),
        spec: {
          parentRefs: parent("https"),
          hostnames: [`invocation.${g.domain}`],
          rules: [
            {
              backendRefs: [{ name: SERVICES.invocation, port: ports.invocation }],
              // no edge timeout: the replica bounds each invocation by its poll window, and an
              // answer (server-sent events, a large body) may stream for longer than any fixed limit
              timeouts: { request: "0s" },
            },
          ],
        },
      }),
    );
    if (c.adminIssuerProxy.enabled && c.adminIssuerProxy.gateway.enabled)
      routes.push(
        new HTTPRoute({
          metadata: this.meta("admin-token-issuer-proxy", WORKLOADS.issuer),
          spec: {
            parentRefs: parent("https"),
            hostnames: [`api-keys.${g.domain}`],
            rules: [
              {
                matches: [{ path: { type: "Exact", value: "/v1/admin/keys" }, method: "POST" }],
                backendRefs: [{ name: SERVICES.issuer, port: ports.issuer }],
              },
            ],
          },
        }),
      );
    if (this.grpcOn) {
      listeners.push({
        name: "grpc",
        protocol: "TCP",
        port: ports.grpc,
        allowedRoutes: { namespaces: { from: "Same" } },
      });
      routes.push(
        new TCPRoute({
          metadata: this.meta("grpc-proxy", WORKLOADS.grpc),
          spec: {
            parentRefs: parent("grpc"),
            rules: [{ backendRefs: [{ name: SERVICES.grpc, port: ports.grpc }] }],
          },
        }),
      );
      if (g.routes.grpcWorker.enabled) {
        listeners.push({
          name: g.routes.grpcWorker.listenerName,
          protocol: "TCP",
          port: ports.grpcConnect,
          allowedRoutes: { namespaces: { from: "Same" } },
        });
        routes.push(
          new TCPRoute({
            metadata: this.meta("grpc-worker", WORKLOADS.grpc),
            spec: {
              parentRefs: parent(g.routes.grpcWorker.listenerName),
              rules: [{ backendRefs: [{ name: SERVICES.grpc, port: ports.grpcConnect }] }],
            },
          }),
        );
      }
    }
    if (this.proxyOn) {
      const wd = c.workerCallbackProxy.workerDomain;
      // passthrough: the proxy's own TLS frontend tells HTTP callbacks from gRPC tunnels by the name
      listeners.push({
        name: "worker-tls",
        protocol: "TLS",
        port: ports.proxy,
        hostname: `*.${wd}`,
        tls: { mode: "Passthrough" },
        allowedRoutes: { namespaces: { from: "Same" } },
      });
      routes.push(
        new TLSRoute({
          metadata: this.meta("worker-callback-proxy", WORKLOADS.proxy),
          spec: {
            parentRefs: parent("worker-tls"),
            hostnames: [`*.${wd}`],
            rules: [{ backendRefs: [{ name: SERVICES.proxy, port: ports.proxy }] }],
          },
        }),
      );
    }
    if (c.nats.server.enabled && g.routes.nats.enabled) {
      listeners.push({
        name: "nats",
        protocol: "TCP",
        port: NATS_PORTS.client,
        allowedRoutes: { namespaces: { from: "Same" } },
      });
      routes.push(
        new TCPRoute({
          metadata: this.meta("nats", WORKLOADS.nats),
          spec: {
            parentRefs: parent("nats"),
            rules: [{ backendRefs: [{ name: SERVICES.nats, port: NATS_PORTS.client }] }],
          },
        }),
      );
    }
    return [
      new Gateway({
        metadata: this.meta(GATEWAY),
        spec: { gatewayClassName: g.gatewayClassName, listeners },
      }),
      ...routes,
    ];
  }

  /**
   * Workers may reach the proxy and NATS, and nothing else (DNS aside). Without the proxy,
   * in-cluster workers call the pods back directly, so those ports are open to them instead.
   */
  private networkPolicies(): K8sObject[] {
    const inNs = (w: Workload): INetworkPolicyPeer => ({
      namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": this.ns } },
      podSelector: { matchLabels: this.selector(w) },
    });
    const tcp = (port: number) => ({ protocol: "TCP" as const, port });
    const egress: NonNullable<NetworkPolicy["spec"]>["egress"] = [
      {
        to: [
          {
            namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "kube-system" } },
            podSelector: { matchLabels: { "k8s-app": "kube-dns" } },
          },
        ],
        ports: [
          { protocol: "UDP", port: 53 },
          { protocol: "TCP", port: 53 },
        ],
      },
    ];
    if (this.c.nats.server.enabled)
      egress.push({ to: [inNs(WORKLOADS.nats)], ports: [tcp(NATS_PORTS.client)] });
    if (this.proxyOn) {
      egress.push({ to: [inNs(WORKLOADS.proxy)], ports: [tcp(this.plan.ports.proxy)] });
    } else {
      egress.push({ to: [inNs(WORKLOADS.invocation)], ports: [tcp(this.plan.ports.invocation)] });
      if (this.grpcOn) egress.push({ to: [inNs(WORKLOADS.grpc)], ports: [tcp(this.plan.ports.grpcConnect)] });
    }
    const out: K8sObject[] = [
      new NetworkPolicy({
        metadata: this.meta("callplane-workers-egress", undefined, this.workerNs),
        spec: { podSelector: {}, policyTypes: ["Egress"], egress },
      }),
    ];
    const c = this.c;
    if (c.adminIssuerProxy.enabled) {
      // The issuer hands an admin token to whoever reaches it. Nothing in the control plane's or
      // the workers' namespace may (function instances run in the compute agent's pod); with its
      // route on, the Gateway's proxies (in their own namespace) may. kubectl port-forward still
      // reaches it: that goes through the kubelet, not the pod network.
      const w = WORKLOADS.issuer;
      const routed = c.ingress.gatewayApi.enabled && c.adminIssuerProxy.gateway.enabled;
      out.push(
        new NetworkPolicy({
          metadata: this.meta(`${w.name}-ingress`, w),
          spec: {
            podSelector: { matchLabels: this.selector(w) },
            policyTypes: ["Ingress"],
            ingress: routed
              ? [
                  {
                    from: [
                      {
                        namespaceSelector: {
                          matchExpressions: [
                            {
                              key: "kubernetes.io/metadata.name",
                              operator: "NotIn",
                              values: [this.ns, this.workerNs],
                            },
                          ],
                        },
                      },
                    ],
                    ports: [tcp(this.plan.ports.issuer)],
                  },
                ]
              : [],
          },
        }),
      );
    }
    return out;
  }
}
