// How one environment file maps onto a cluster. The file describes the local stack too, whose
// defaults are loopback addresses and files under .callplane/; on Kubernetes:
// - every service listens on the port its `listen` key names, on all of its pod's addresses
//   (0.0.0.0), except invocation and grpc-proxy, which listen on their pod's own address (POD_IP,
//   from the Downward API) because they build their callback addresses from it. The host part of a
//   `listen` key is the local stack's and is not used.
// - URLs that other pods dial (api.url, nats.url, ...) point at the rendered Services when the file
//   leaves them unset. One that the file sets is used as written, and refused when it is a loopback
//   address, which no other pod can reach.
// - Every file path is replaced by where the Secret or volume holding that file is mounted.
// - Keys that only the manifests read (pod annotations, resources, replica counts, ...) are left
//   out of the pods' copy of the file, so changing them does not roll every pod.
import { isIP } from "node:net";
import type { Config } from "../lib/config/index.js";
import { cidrContains, parseCidr, parseHostPort } from "../lib/net/index.js";
import { MOUNTS, NATS_CLUSTER_SIZE, SERVICES, TLS_SECRETS, WORKLOADS, type Workload } from "./layout.js";

export type RawDocument = Record<string, unknown>;

/** The value at a dotted path of the file as written (undefined when the file does not set it). */
export function rawAt(raw: RawDocument, path: string): unknown {
  let cur: unknown = raw;
  for (const k of path.split(".")) {
    if (cur === null || typeof cur !== "object" || Array.isArray(cur)) return undefined;
    cur = (cur as Record<string, unknown>)[k];
  }
  return cur;
}

function setAt(doc: RawDocument, path: string, value: unknown): void {
  const keys = path.split(".");
  let cur = doc;
  for (const k of keys.slice(0, -1)) {
    const next = cur[k];
    if (next === null || typeof next !== "object" || Array.isArray(next)) cur[k] = {};
    cur = cur[k] as RawDocument;
  }
  cur[keys[keys.length - 1]] = value;
}

function deleteAt(doc: RawDocument, path: string): void {
  const keys = path.split(".");
  let cur: unknown = doc;
  for (const k of keys.slice(0, -1)) {
    if (cur === null || typeof cur !== "object") return;
    cur = (cur as RawDocument)[k];
  }
  if (cur && typeof cur === "object") delete (cur as RawDocument)[keys[keys.length - 1]];
}

/** Drops sections left empty by deletions, so the pods' file shows only what is set. */
function prune(doc: RawDocument): void {
  for (const [k, v] of Object.entries(doc)) {
    if (v && typeof v === "object" && !Array.isArray(v)) {
      prune(v as RawDocument);
      if (Object.keys(v).length === 0) delete doc[k];
    }
  }
}

/**
 * The Host names the pods serve (global.hosts): the operator's own, the Services' names as the
 * plane's parts call them (`*.<serviceDomain>`, and the short forms cluster DNS answers inside the
 * namespace: `api`, `api.<namespace>`, `api.<namespace>.svc`), and the Gateway's names when it is
 * on (it passes the client's Host through). Any other name is refused (HOST_NOT_SERVED).
 */
export function clusterHosts(config: Config, names: ClusterNames): string[] {
  const out = new Set<string>(config.global.hosts);
  out.add(`*.${config.global.serviceDomain}`);
  for (const svc of Object.values(SERVICES))
    for (const name of [svc, `${svc}.${names.namespace}`, `${svc}.${names.namespace}.svc`]) out.add(name);
  const g = config.ingress.gatewayApi;
  if (g.enabled) out.add(`*.${g.domain}`);
  return [...out];
}

export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  if (h === "localhost" || h.endsWith(".localhost")) return true;
  if (isIP(h) === 4) return h.startsWith("127.") || h === "0.0.0.0";
  if (isIP(h) === 6) return h === "::1" || h === "::";
  return false;
}

function urlHost(url: string): string {
  return new URL(url.replace(/^(nats|tls):/, "http:")).hostname;
}

/** The cluster's view of the namespace and DNS suffix, read from global.serviceDomain. */
export interface ClusterNames {
  namespace: string;
  clusterDomain: string;
  /** `<name>.<namespace>.svc.<clusterDomain>`: a Service's full name. */
  fqdn: (service: string) => string;
}

export function clusterNames(serviceDomain: string): ClusterNames | undefined {
  const m = /^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)\.svc\.(.+)$/.exec(serviceDomain);
  if (!m) return undefined;
  return {
    namespace: m[1],
    clusterDomain: m[3],
    fqdn: (service) => `${service}.${serviceDomain}`,
  };
}

/**
 * The sections whose `podAnnotations` a workload's pods get. callplane's API serves what upstream
 * splits into three services (the NVCF API, the API Keys service, the ESS API), so the API's pods
 * carry all three keys' annotations.
 */
export function annotationSections(w: Workload): string[] {
  return w.section === WORKLOADS.api.section ? ["api", "apikeys", "ess"] : [w.section];
}

function annotationsOfSection(c: Config, section: string): Record<string, string> {
  return (
    (c as unknown as Record<string, { podAnnotations?: Record<string, string> }>)[section]?.podAnnotations ??
    {}
  );
}

/** A workload's pod annotations from the environment file, merged in the order of annotationSections. */
export function podAnnotationsOf(c: Config, w: Workload): Record<string, string> {
  return Object.assign({}, ...annotationSections(w).map((s) => annotationsOfSection(c, s))) as Record<
    string,
    string
  >;
}

/** One key set to two values by the sections that land on the same pods, named both ways. */
function annotationConflicts(c: Config): string[] {
  const p: string[] = [];
  for (const w of Object.values(WORKLOADS)) {
    const seen = new Map<string, { section: string; value: string }>();
    for (const section of annotationSections(w)) {
      for (const [key, value] of Object.entries(annotationsOfSection(c, section))) {
        const before = seen.get(key);
        if (before && before.value !== value)
          p.push(
            `${before.section}.podAnnotations.${key} is ${JSON.stringify(before.value)} but ${section}.podAnnotations.${key} is ${JSON.stringify(value)}: both go on the pods of ${w.name} (callplane's API serves the API, API keys and secret store in one service). Give the key one value, or set it in one place`,
          );
        else seen.set(key, { section, value });
      }
    }
  }
  return p;
}

/** Private address ranges (RFC 1918): the proxy's pod networks when the file leaves them unset. */
export const DEFAULT_POD_NETWORKS = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];

const LOOPBACK = parseCidr("127.0.0.0/8");

export interface ClusterPlan {
  names: ClusterNames;
  /** The ports the pods listen on, from the file's listen keys. */
  ports: {
    api: number;
    issuer: number;
    invocation: number;
    invocationWorkerTls: number;
    grpc: number;
    grpcConnect: number;
    grpcWorkerTls: number;
    proxy: number;
    proxyMetrics: number;
    compute: number;
    /** The admission webhook's (0 unless compute.backend is kubernetes: then it is rendered). */
    webhook: number;
  };
  podNetworks: string[];
  /** Whether the file left the proxy's pod networks unset (render says what it used). */
  podNetworksDefaulted: boolean;
  /** The pods' copy of the environment file. */
  document: RawDocument;
  /** Whether the proxy's frontend certificate comes from the stack CA (then workers need the CA). */
  frontendFromStackCa: boolean;
  /** Whether the operator brings the stack CA (pki.caCertFile set): no self-signed bootstrap. */
  ownCa: boolean;
  /** Lines that are worth saying but do not stop the render. */
  notes: string[];
}

/** Keys only the manifests read; the pods' file leaves them out. */
const MANIFEST_ONLY = [
  "apikeys",
  "ess",
  "ingress",
  "kubernetes",
  "api.replicaCount",
  "invocation.replicaCount",
  "invocation.autoscaling",
  "grpcproxy.deployment",
  "admissionWebhook.replicas",
  "workerCallbackProxy.replicaCount",
  "workerCallbackProxy.autoscaling",
  "workerCallbackProxy.service",
  "workerCallbackProxy.tls.frontend.existingSecret",
  "workerCallbackProxy.tls.frontend.certificate",
  // the database URL holds a password: the API reads it from a Secret
  "api.database.url",
  // local-stack only: where the one-machine stack puts pods and instances
  "invocation.podNetwork",
  "grpcproxy.podNetwork",
  "nats.server.listen",
  "nats.server.binary",
];
const PER_SERVICE = [
  "api",
  "invocation",
  "grpcproxy",
  "workerCallbackProxy",
  "adminIssuerProxy",
  "natsAuthCalloutService",
  "compute",
  "admissionWebhook",
  "nats",
];

/**
 * Checks what only matters on a cluster and builds the pods' copy of the file. Returns the
 * problems (each naming its keys) when there are any.
 */
export function planCluster(config: Config, raw: RawDocument): ClusterPlan | { problems: string[] } {
  const p: string[] = [];
  const notes: string[] = [];
  const names = clusterNames(config.global.serviceDomain);
  if (!names) {
    p.push(
      `global.serviceDomain is ${config.global.serviceDomain}, which is not <namespace>.svc.<cluster domain>: on Kubernetes it names the namespace the control plane runs in, because workers call pods back as <dashed-ip>.invocation.<serviceDomain>, a name cluster DNS serves only in that form. Set it to, for example, nvcf.svc.cluster.local`,
    );
  }
  const portOf = (key: string, value: string) => {
    const port = parseHostPort(value).port;
    if (port === 0)
      p.push(
        `${key} has port 0 (a free port, for tests): on Kubernetes Services and probes need a fixed port. Set one`,
      );
    return port;
  };
  const fixedPort = (key: string, port: number) => {
    if (port === 0)
      p.push(
        `${key} is 0 (a free port, for tests): on Kubernetes Services and probes need a fixed port. Set one`,
      );
    return port;
  };
  const proxy = config.workerCallbackProxy;
  // the backend that runs instances as pods: the admission webhook and the agent's RBAC come with it
  const kubeBackend = config.compute.backend === "kubernetes";
  const ports = {
    api: portOf("api.listen", config.api.listen),
    issuer: portOf("adminIssuerProxy.listen", config.adminIssuerProxy.listen),
    invocation: fixedPort("invocation.port", config.invocation.port),
    invocationWorkerTls: proxy.invocation.workerTlsPort,
    grpc: fixedPort("grpcproxy.port", config.grpcproxy.port),
    grpcConnect: fixedPort("grpcproxy.connectPort", config.grpcproxy.connectPort),
    grpcWorkerTls: config.grpcproxy.workerTlsPort,
    proxy: portOf("workerCallbackProxy.listen", proxy.listen),
    proxyMetrics: portOf("workerCallbackProxy.metricsListen", proxy.metricsListen),
    compute: portOf("compute.listen", config.compute.listen),
    webhook: kubeBackend ? portOf("admissionWebhook.listen", config.admissionWebhook.listen) : 0,
  };

  p.push(...annotationConflicts(config));

  const db = config.api.database;
  if (db.driver === "sqlite" && config.api.replicaCount > 1) {
    p.push(
      `api.replicaCount is ${config.api.replicaCount} with api.database.driver sqlite: SQLite is one file that one API process writes, and API replicas in other pods cannot share it. Set api.database.driver to postgres (its URL goes in the Secret callplane-database), or api.replicaCount to 1`,
    );
  }
  if (db.driver === "postgres" && rawAt(raw, "api.database.url"))
    notes.push(
      "api.database.url is set in the file but not rendered (it may hold a password, and a ConfigMap is not secret): the API's pods read it from the Secret callplane-database, key url",
    );

  // URLs other pods and workers dial: loopback is this pod's own, so it reaches nobody else
  const urlKeys = [
    "api.url",
    "adminIssuerProxy.url",
    "nats.authCallout.workerTokenAuth.webhookUrl",
    "global.workerEndpoints.invocationServiceURL",
    "global.workerEndpoints.invocationProxyURL",
    "global.workerEndpoints.grpcProxyWorkerConnectURL",
    "grpcproxy.workerConnectBaseURL",
    "invocation.selfAddress",
    "compute.kubernetes.workerNatsUrl",
    ...(config.nats.server.enabled ? [] : ["nats.url"]),
  ];
  for (const key of urlKeys) {
    const v = rawAt(raw, key);
    if (typeof v !== "string" || v === "") continue;
    let host: string;
    try {
      host = urlHost(v);
    } catch {
      continue; // the schema already refused it
    }
    if (isLoopbackHost(host))
      p.push(
        `${key} is ${v}, a loopback address: on Kubernetes every pod has its own loopback, so no other pod or worker reaches it. ` +
          (key === "nats.url"
            ? "Set it to the address of your NATS server, or set nats.server.enabled to true to have the NATS StatefulSet rendered"
            : `Remove ${key} to have render point it at the rendered Service, or set an address other pods reach`),
      );
  }

  let podNetworks = [...proxy.podNetworks];
  const podNetworksSet = rawAt(raw, "workerCallbackProxy.podNetworks") !== undefined;
  if (proxy.enabled) {
    if (!podNetworksSet) {
      podNetworks = DEFAULT_POD_NETWORKS;
      notes.push(
        `workerCallbackProxy.podNetworks is not set (its default is the local stack's loopback networks): the proxy forwards to pods in ${DEFAULT_POD_NETWORKS.join(", ")}. Set it to your cluster's pod CIDR to narrow that`,
      );
    } else {
      for (const n of podNetworks) {
        const net = parseCidr(n);
        if (cidrContains(LOOPBACK, n.split("/")[0]) || (net.bits < 8 && cidrContains(net, "127.0.0.1")))
          p.push(
            `workerCallbackProxy.podNetworks names ${n}, a loopback network: on Kubernetes pods have cluster addresses, and the proxy would refuse every callback to them. Set it to your cluster's pod CIDR (for example 10.244.0.0/16)`,
          );
      }
    }
  }

  if (config.nats.stream.replicas > 3)
    p.push(
      `nats.stream.replicas is ${config.nats.stream.replicas}, but the rendered NATS cluster has 3 servers: a stream cannot have more replicas than servers. Set it to 3 or less`,
    );
  if (config.nats.server.enabled && config.nats.stream.replicas < 3)
    notes.push(
      `nats.stream.replicas is ${config.nats.stream.replicas}: each work queue lives on ${config.nats.stream.replicas === 1 ? "one" : "two"} of the three NATS servers, and a request queued there waits while it is down. Set it to 3 to survive the loss of any one server`,
    );

  const mek = config.secrets.mek;
  const pluginRaw = rawAt(raw, "secrets.mek.plugin");
  if (mek.provider === "plugin" && !(typeof pluginRaw === "string" && pluginRaw.startsWith("/")))
    p.push(
      `secrets.mek.plugin is ${JSON.stringify(pluginRaw)}: on Kubernetes it must be an absolute path to the plugin module inside the image (or a volume you mount), since the pods do not see this machine's files`,
    );

  const g = config.ingress.gatewayApi;
  const sharedTunnel =
    config.grpcproxy.workerConnectBaseURL || config.global.workerEndpoints.grpcProxyWorkerConnectURL;
  if (g.enabled && g.routes.grpcWorker.enabled && !sharedTunnel)
    p.push(
      `ingress.gatewayApi.routes.grpcWorker.enabled is true but neither grpcproxy.workerConnectBaseURL nor global.workerEndpoints.grpcProxyWorkerConnectURL is set: grpc-proxy replicas would keep handing workers their pod addresses, and nothing would use the ${g.routes.grpcWorker.listenerName} listener. Set grpcproxy.workerConnectBaseURL to the address workers reach it at (for example http://grpc.${g.domain}:10086), or turn the route off`,
    );
  if (g.enabled && g.routes.grpcWorker.enabled && config.grpcproxy.replicaCount === 0)
    p.push(
      "ingress.gatewayApi.routes.grpcWorker.enabled is true but grpcproxy.replicaCount is 0: there is no grpc-proxy for the route to reach",
    );

  // an autoscaler may add replicas: the rules for N replicas behind one address apply to its maximum
  const inv = config.invocation;
  const sharedCallback = config.global.workerEndpoints.invocationServiceURL || inv.selfAddress;
  if (inv.autoscaling.enabled && inv.autoscaling.maxReplicas > 1 && sharedCallback && !inv.relay.enabled)
    p.push(
      `invocation.autoscaling.enabled with invocation.autoscaling.maxReplicas ${inv.autoscaling.maxReplicas}, a shared callback URL (${config.global.workerEndpoints.invocationServiceURL ? "global.workerEndpoints.invocationServiceURL" : "invocation.selfAddress"}) and invocation.relay.enabled false: once the autoscaler adds a replica, a callback balanced to a replica that does not hold the request would be dropped. Turn invocation.relay.enabled on`,
    );
  const ga = config.grpcproxy.deployment.autoscaling;
  if (ga.enabled && ga.maxReplicas > 1 && sharedTunnel && !config.grpcproxy.relay.enabled)
    p.push(
      `grpcproxy.deployment.autoscaling.enabled with grpcproxy.deployment.autoscaling.maxReplicas ${ga.maxReplicas}, a shared tunnel address and grpcproxy.relay.enabled false: once the autoscaler adds a replica, a tunnel balanced to a replica that does not hold its session would be refused. Turn grpcproxy.relay.enabled on`,
    );
  if (ga.enabled && config.grpcproxy.replicaCount === 0)
    p.push(
      "grpcproxy.deployment.autoscaling.enabled is true but grpcproxy.replicaCount is 0 (gRPC turned off): set a replica count, or turn the autoscaler off",
    );

  if (names && config.kubernetes.workerNamespace === names.namespace)
    p.push(
      `kubernetes.workerNamespace is ${names.namespace}, the control plane's own namespace (from global.serviceDomain): the workers' network policy selects every pod of that namespace, and would cut the control plane off. Give workers a namespace of their own`,
    );

  const frontend = proxy.tls.frontend;
  const ownFrontend = !!(frontend.existingSecret || frontend.certificate.issuerRef.name);
  if (proxy.enabled && rawAt(raw, "workerCallbackProxy.tls.frontend.certFile") !== undefined && !ownFrontend)
    p.push(
      "workerCallbackProxy.tls.frontend.certFile names a file on this machine, which the proxy's pods do not have: on Kubernetes the frontend certificate comes from a Secret. Set workerCallbackProxy.tls.frontend.existingSecret to a kubernetes.io/tls Secret holding it, or workerCallbackProxy.tls.frontend.certificate.issuerRef to the issuer that should issue it",
    );
  if (
    kubeBackend &&
    (rawAt(raw, "admissionWebhook.tls.certFile") !== undefined ||
      rawAt(raw, "admissionWebhook.tls.keyFile") !== undefined)
  )
    notes.push(
      `admissionWebhook.tls.certFile and keyFile are replaced by where the webhook's pods mount the Secret ${TLS_SECRETS.webhook}, which cert-manager writes for its Certificate (the API server trusts it through the CA cert-manager injects into the ValidatingWebhookConfiguration)`,
    );
  const gtls = config.grpcproxy.tls;
  if (gtls.enabled)
    notes.push(
      `grpcproxy.tls.enabled: the client listener's certificate comes from the Secret ${"grpc-proxy-client-tls"} (tls.crt, tls.key), which you create; grpcproxy.tls.certFile and keyFile are replaced by where it is mounted`,
    );

  if (p.length || !names) return { problems: p };

  // ---- the pods' copy of the file
  const doc = structuredClone(raw);
  for (const k of MANIFEST_ONLY) deleteAt(doc, k);
  for (const s of PER_SERVICE) {
    deleteAt(doc, `${s}.podAnnotations`);
    deleteAt(doc, `${s}.resources`);
  }
  if (config.grpcproxy.replicaCount === 0) setAt(doc, "grpcproxy.replicaCount", 0);
  else deleteAt(doc, "grpcproxy.replicaCount");
  const any = (port: number) => `0.0.0.0:${port}`;
  const httpUrl = (service: string, port: number) => `http://${names.fqdn(service)}:${port}`;
  setAt(doc, "global.dataDir", MOUNTS.dataDir);
  setAt(doc, "api.listen", any(ports.api));
  if (rawAt(raw, "api.url") === undefined || rawAt(raw, "api.url") === "")
    setAt(doc, "api.url", httpUrl(SERVICES.api, ports.api));
  if (db.driver === "sqlite") setAt(doc, "api.database.path", `${MOUNTS.sqliteDir}/callplane.db`);
  else deleteAt(doc, "api.database.path");
  setAt(doc, "adminIssuerProxy.listen", any(ports.issuer));
  if (!rawAt(raw, "adminIssuerProxy.url"))
    setAt(doc, "adminIssuerProxy.url", httpUrl(SERVICES.issuer, ports.issuer));
  setAt(doc, "adminIssuerProxy.signingKeyFile", `${MOUNTS.issuerKey}/admin-issuer.key.pem`);
  setAt(doc, "adminIssuerProxy.publicKeyFile", `${MOUNTS.issuerKey}/admin-issuer.pub.pem`);
  setAt(doc, "adminIssuerProxy.operatorCredentialFile", `${MOUNTS.issuerOperator}/issuer-operator.secret`);
  // a port-forwarded connection arrives on the pod's loopback: only the credential counts there
  setAt(doc, "adminIssuerProxy.peerCredentials", false);
  setAt(doc, "global.hosts", clusterHosts(config, names));
  setAt(doc, "auth.adminPublicKeyFile", `${MOUNTS.adminKey}/admin-signing.pub.pem`);
  // never mounted: the stack's admin signing key stays with the operator (`callplane admin token`)
  setAt(doc, "auth.adminSigningKeyFile", `${MOUNTS.adminKey}/admin-signing.key.pem`);
  setAt(doc, "auth.serviceTokenDir", MOUNTS.serviceTokens);
  setAt(doc, "auth.workerIdentityKeyFile", `${MOUNTS.workerIdentity}/worker-identity.key.pem`);
  if (config.nats.server.enabled) {
    setAt(doc, "nats.url", `tls://${names.fqdn(SERVICES.nats)}:4222`);
    // the pods never run nats-server: the StatefulSet does
    setAt(doc, "nats.server.enabled", false);
    // ... of this many servers: revocation and `callplane nats status` ask each one
    setAt(doc, "nats.cluster.size", NATS_CLUSTER_SIZE);
  }
  deleteAt(doc, "nats.tls");
  setAt(doc, "nats.tls.caFile", `${MOUNTS.ca}/ca.crt`);
  setAt(doc, "nats.credentialsDir", MOUNTS.natsKeys);
  setAt(doc, "pki.dir", MOUNTS.pki);
  setAt(doc, "pki.caCertFile", `${MOUNTS.ca}/ca.crt`);
  // never mounted: cert-manager holds the CA's key
  setAt(doc, "pki.caKeyFile", `${MOUNTS.ca}/ca.key`);
  setAt(doc, "workerCallbackProxy.listen", any(ports.proxy));
  setAt(doc, "workerCallbackProxy.metricsListen", any(ports.proxyMetrics));
  setAt(doc, "workerCallbackProxy.podNetworks", podNetworks);
  deleteAt(doc, "workerCallbackProxy.tls.frontend.certFile");
  deleteAt(doc, "workerCallbackProxy.tls.frontend.keyFile");
  if (ownFrontend) {
    setAt(doc, "workerCallbackProxy.tls.frontend.certFile", `${MOUNTS.proxyFrontendOwn}/tls.crt`);
    setAt(doc, "workerCallbackProxy.tls.frontend.keyFile", `${MOUNTS.proxyFrontendOwn}/tls.key`);
  }
  if (gtls.enabled) {
    setAt(doc, "grpcproxy.tls.certFile", `${MOUNTS.grpcClientTls}/tls.crt`);
    setAt(doc, "grpcproxy.tls.keyFile", `${MOUNTS.grpcClientTls}/tls.key`);
  }
  setAt(doc, "compute.listen", any(ports.compute));
  if (kubeBackend) {
    setAt(doc, "admissionWebhook.listen", any(ports.webhook));
    // cert-manager's Secret for the webhook's Certificate, mounted in its pods
    setAt(doc, "admissionWebhook.tls.certFile", `${MOUNTS.webhookTls}/tls.crt`);
    setAt(doc, "admissionWebhook.tls.keyFile", `${MOUNTS.webhookTls}/tls.key`);
  }
  if (mek.provider === "file") setAt(doc, "secrets.mek.file", `${MOUNTS.mek}/mek.json`);
  else deleteAt(doc, "secrets.mek.file");
  prune(doc);

  return {
    names,
    ports,
    podNetworks,
    podNetworksDefaulted: proxy.enabled && !podNetworksSet,
    document: doc,
    frontendFromStackCa: !ownFrontend,
    ownCa: rawAt(raw, "pki.caCertFile") !== undefined,
    notes,
  };
}
