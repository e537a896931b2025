// The fixed shape of a rendered control plane: what each resource is called, where each Secret is
// mounted in the pods, and which Secret holds what. The names follow upstream's where upstream has
// one (the seed's service reference: nvcf-api, invocation-service, grpc-proxy-deployment,
// admin-token-issuer-proxy, nats), and the Service names are the ones workers' callback addresses
// name: `<dashed-ip>.invocation.<serviceDomain>` and `<dashed-ip>.grpc-headless.<serviceDomain>`
// are answered by cluster DNS only for headless Services of exactly those names.
import { COMPUTE_AGENT_ACCOUNT } from "../lib/config/index.js";

/** One callplane service as it is deployed. */
export interface Workload {
  /** The Deployment (or StatefulSet) name, and the pods' app.kubernetes.io/name. */
  name: string;
  /** app.kubernetes.io/component */
  component: string;
  /** dist/src/services/<dir>/main.js */
  dir: string;
  /** The config section whose podAnnotations and resources apply. */
  section: string;
}

export const WORKLOADS = {
  api: { name: "nvcf-api", component: "api", dir: "api", section: "api" },
  invocation: {
    name: "invocation-service",
    component: "invocation",
    dir: "invocation",
    section: "invocation",
  },
  grpc: { name: "grpc-proxy-deployment", component: "grpc-proxy", dir: "grpc-proxy", section: "grpcproxy" },
  proxy: {
    name: "worker-callback-proxy",
    component: "worker-callback-proxy",
    dir: "callback-proxy",
    section: "workerCallbackProxy",
  },
  issuer: {
    name: "admin-token-issuer-proxy",
    component: "admin-issuer",
    dir: "admin-issuer",
    section: "adminIssuerProxy",
  },
  callout: {
    name: "nats-auth-callout-service",
    component: "nats-auth-callout",
    dir: "nats-auth-callout",
    section: "natsAuthCalloutService",
  },
  // the name is the agent's ServiceAccount too, the one identity the admission webhook lets use the
  // reserved nvcf-worker-* accounts (lib/config: COMPUTE_AGENT_ACCOUNT)
  compute: { name: COMPUTE_AGENT_ACCOUNT, component: "compute", dir: "compute", section: "compute" },
  webhook: {
    name: "callplane-admission-webhook",
    component: "admission-webhook",
    dir: "admission-webhook",
    section: "admissionWebhook",
  },
  nats: { name: "nats", component: "nats", dir: "", section: "nats" },
} as const satisfies Record<string, Workload>;

export const SERVICES = {
  api: "api",
  issuer: "admin-token-issuer-proxy",
  /** Headless: gives each invocation pod its DNS name <dashed-ip>.invocation.<serviceDomain>. */
  invocationHeadless: "invocation",
  /** ClusterIP: clients (and the Gateway) reach any invocation replica here. */
  invocation: "invocation-service",
  grpc: "grpc",
  grpcHeadless: "grpc-headless",
  proxy: "worker-callback-proxy",
  nats: "nats",
  natsHeadless: "nats-headless",
} as const;

/**
 * The admission webhook's names (the kubernetes backend only). Its Service is not among SERVICES:
 * only the API server calls it, by this name, so no pod serves it as a Host (clusterHosts).
 */
export const ADMISSION_WEBHOOK = {
  service: "callplane-admission-webhook",
  /** Its port on the Service: the one the API server dials unless told otherwise. */
  servicePort: 443,
  path: "/validate",
  /** The webhook's name in its configuration: a fully qualified name, in the API server's denials. */
  webhookName: "reserved-worker-accounts.callplane.io",
  certificate: "callplane-admission-webhook",
} as const;

/** Where the pods find their files. Every file path of the environment file is replaced by one of these. */
export const MOUNTS = {
  config: "/etc/callplane/config",
  configFile: "/etc/callplane/config/callplane.yaml",
  dataDir: "/var/lib/callplane",
  sqliteDir: "/var/lib/callplane/db",
  tmp: "/tmp",
  ca: "/etc/callplane/ca",
  serviceTokens: "/etc/callplane/service-tokens",
  natsKeys: "/etc/callplane/nats-keys",
  adminKey: "/etc/callplane/admin",
  issuerKey: "/etc/callplane/admin-issuer",
  issuerOperator: "/etc/callplane/issuer-operator",
  workerIdentity: "/etc/callplane/worker-identity",
  mek: "/etc/callplane/mek",
  pki: "/etc/callplane/pki",
  /** <pki>/proxy: where the stack's own frontend certificate is looked for (see compute's NVCF_PROXY_CA_PEM). */
  proxyFrontend: "/etc/callplane/pki/proxy",
  /** An operator's frontend certificate (existingSecret or another issuer). */
  proxyFrontendOwn: "/etc/callplane/proxy-frontend",
  podTls: "/etc/callplane/pod-tls",
  webhookTls: "/etc/callplane/admission-webhook-tls",
  grpcClientTls: "/etc/callplane/grpc-client-tls",
  natsConfig: "/etc/nats/config",
  natsAuth: "/etc/nats/auth",
  natsTls: "/etc/nats/tls",
  natsData: "/data",
} as const;

/**
 * The worker callback proxy's HAProxy container (the official image's layout) and the folder it
 * shares with the certificate keeper beside it.
 */
export const HAPROXY = {
  /** The ConfigMap with haproxy.cfg and the answers to requests HAProxy's parser refuses. */
  configMap: "worker-callback-proxy-haproxy",
  /** The official image's configuration folder, where the ConfigMap is mounted. */
  configDir: "/usr/local/etc/haproxy",
  configFile: "/usr/local/etc/haproxy/haproxy.cfg",
  /** An emptyDir of both containers: HAProxy's runtime API socket, which the keeper uses. */
  runDir: "/run/haproxy",
  adminSocket: "/run/haproxy/admin.sock",
} as const;

/** The image's layout: the built checkout at /app (dist/, node_modules/, bin/). */
export const APP_DIR = "/app";

/** The Secrets the manifests reference by name. Their values are never rendered. */
export const SECRETS = {
  serviceTokens: "callplane-service-tokens",
  natsKeys: "callplane-nats-keys",
  adminKey: "callplane-admin-key",
  issuerKey: "callplane-admin-issuer-key",
  /** The operator credential the issuer asks for (key issuer-operator.secret): the issuer's pod alone mounts it. */
  issuerOperator: "callplane-issuer-operator",
  workerIdentity: "callplane-worker-identity-key",
  mek: "callplane-mek",
  database: "callplane-database",
  grpcClientTls: "grpc-proxy-client-tls",
} as const;

/** The Secrets cert-manager writes (and the Certificates that name them). */
export const TLS_SECRETS = {
  ca: "callplane-ca",
  nats: "nats-server-tls",
  proxyFrontend: "worker-callback-proxy-frontend-tls",
  invocationPods: "invocation-service-worker-tls",
  grpcPods: "grpc-proxy-worker-tls",
  webhook: "callplane-admission-webhook-tls",
} as const;

export const ISSUERS = {
  selfSigned: "callplane-selfsigned",
  ca: "callplane-ca",
} as const;

export const GATEWAY = "callplane";

/**
 * The rendered NATS cluster: always three servers (a stream's replicas are checked against them, and
 * the pods' copy of the file names the size), on nats-server's usual ports.
 */
export const NATS_CLUSTER_SIZE = 3;
export const NATS_PORTS = { client: 4222, cluster: 6222, monitor: 8222 } as const;

export const PART_OF = "callplane";
export const MANAGED_BY = "callplane-render";
