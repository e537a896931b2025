// One YAML environment file configures a whole stack. It is parsed once, against one schema:
// unknown keys are errors, every bad field is named by its path, defaults live here, and rules that
// relate two fields run right after the schema and name both. Single keys may be overridden from
// the environment as CALLPLANE__<SECTION>__<KEY>=value (SCREAMING_SNAKE per segment, YAML value).
import { readFileSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { natsNodes, natsServerAddresses, natsServers, nodeNetworkCapacity } from "./nats-cluster.js";
import { cidrContains, parseCidr, parseHostPort } from "./net.js";

const hostPort = z.string().refine(
  (v) => {
    try {
      parseHostPort(v);
      return true;
    } catch {
      return false;
    }
  },
  { message: "must be host:port, for example 127.0.0.1:8080" },
);
const cidr = z.string().refine(
  (v) => {
    try {
      parseCidr(v);
      return true;
    } catch {
      return false;
    }
  },
  { message: "must be an IPv4 CIDR, for example 10.0.0.0/16" },
);
const optionalUrl = (schemes: string[]) =>
  z
    .string()
    .default("")
    .refine(
      (v) => {
        if (v === "") return true;
        try {
          return schemes.includes(new URL(v).protocol.slice(0, -1));
        } catch {
          return false;
        }
      },
      { message: `must be empty or a URL with scheme ${schemes.join(" or ")}` },
    );
const dnsName = z
  .string()
  .regex(
    /^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/,
    "must be a lower-case DNS name",
  );
const seconds = (def: number, max = 86_400) => z.number().positive().max(max).default(def);
const section = <T extends z.ZodRawShape>(shape: T) => z.strictObject(shape).prefault({} as never);

// ---- what only `callplane render` reads (Kubernetes); the local stack ignores it

/** Annotation keys the rendered manifests set themselves: an operator's value would be overwritten. */
export const RESERVED_ANNOTATIONS = {
  exact: ["checksum/config"],
  prefixes: ["nvcf.nvidia.com/nats-worker-auth"],
} as const;

/** Where an annotation key is reserved, the sentence that says why; undefined when it is free. */
export function reservedAnnotation(key: string): string | undefined {
  if ((RESERVED_ANNOTATIONS.exact as readonly string[]).includes(key))
    return "it is the hash of the pod's configuration, which the rendered manifests set so that a configuration change rolls the pods";
  if (RESERVED_ANNOTATIONS.prefixes.some((p) => key.startsWith(p)))
    return "keys starting with nvcf.nvidia.com/nats-worker-auth are reserved for the auth callout's restart on a worker auth change";
  return undefined;
}

const annotationKey =
  /^(?:(?=[^/]{1,253}\/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;

/**
 * A service's pod annotations (the seed's `<service>.podAnnotations`): passed to its pods unchanged;
 * values must be strings, and keys the manifests manage themselves are refused by name.
 */
const podAnnotations = () =>
  z
    .record(z.string(), z.unknown())
    .superRefine((rec, ctx) => {
      for (const [key, value] of Object.entries(rec)) {
        const reserved = reservedAnnotation(key);
        if (reserved) {
          ctx.addIssue({
            code: "custom",
            path: [key],
            message: `the annotation key "${key}" is reserved: ${reserved}. Remove it`,
          });
        } else if (!annotationKey.test(key)) {
          ctx.addIssue({
            code: "custom",
            path: [key],
            message: `"${key}" is not a Kubernetes annotation key ([prefix/]name: a DNS subdomain prefix, a name of at most 63 letters, digits, "-", "_" and ".")`,
          });
        } else if (typeof value !== "string") {
          ctx.addIssue({
            code: "custom",
            path: [key],
            message: `the value of annotation "${key}" must be a string, not ${value === null ? "null" : typeof value}: quote it (${JSON.stringify(String(value))})`,
          });
        }
      }
    })
    .transform((rec) => rec as Record<string, string>)
    .default({});

const quantity = z
  .string()
  .regex(
    /^(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/,
    "must be a Kubernetes quantity, for example 250m, 1, 512Mi or 1Gi",
  );
/** Container resources of a service's pods: requests for scheduling, a memory limit, no CPU limit. */
const resources = (cpu: string, memory: string, memoryLimit: string) =>
  section({
    requests: section({ cpu: quantity.default(cpu), memory: quantity.default(memory) }),
    limits: section({ memory: quantity.default(memoryLimit) }),
  });
/** A HorizontalPodAutoscaler for a front-door service (off unless asked for). */
const autoscaling = () =>
  section({
    enabled: z.boolean().default(false),
    minReplicas: z.number().int().min(1).max(250).default(2),
    maxReplicas: z.number().int().min(1).max(250).default(10),
    targetCPUUtilizationPercentage: z.number().int().min(1).max(100).default(80),
  });
const k8sName = z
  .string()
  .regex(
    /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/,
    "must be a Kubernetes name: lower-case letters, digits and dashes, at most 63",
  );

export const configSchema = z.strictObject({
  global: section({
    region: z
      .string()
      .regex(/^[a-z0-9][a-z0-9-]*$/, "must be lower-case letters, digits and dashes")
      .default("local"),
    serviceDomain: dnsName.default("nvcf.svc.cluster.local"),
    dataDir: z.string().min(1).default(".callplane"),
    workerEndpoints: section({
      invocationServiceURL: optionalUrl(["http", "https"]),
      invocationProxyURL: optionalUrl(["http", "https"]),
      grpcProxyWorkerConnectURL: optionalUrl(["http", "https"]),
    }),
  }),
  log: section({
    level: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
  }),
  nats: section({
    podAnnotations: podAnnotations(),
    resources: resources("250m", "512Mi", "1Gi"),
    // unset: derived from the stack's own server(s), nats.server.listen or every cluster node
    url: z
      .string()
      .default("")
      .refine(
        (v) =>
          v === "" ||
          (natsServers(v).length > 0 && natsServers(v).every((s) => /^(nats|tls):\/\/[^,]+$/.test(s))),
        {
          message:
            "must be a nats:// or tls:// URL, or several separated by commas (every node of a cluster)",
        },
      ),
    workerAuth: z.enum(["nkey", "token"], { error: "nats.workerAuth must be nkey or token" }).default("nkey"),
    authCallout: section({
      workerTokenAuth: section({
        // unset: derived from api.url; set to "" on purpose it is empty, which token mode refuses
        webhookUrl: z.string().default(""),
      }),
    }),
    tls: section({
      certFile: z.string().default(""),
      keyFile: z.string().default(""),
      caFile: z.string().default(""),
    }),
    credentialsDir: z.string().default(""),
    server: section({
      enabled: z.boolean().default(true),
      listen: hostPort.default("127.0.0.1:4222"),
      binary: z.string().default(""),
    }),
    stream: section({
      maxMessages: z.number().int().positive().default(100_000),
      maxMessageBytes: z
        .number()
        .int()
        .min(1024)
        .max(8 * 1024 * 1024)
        .default(6 * 1024 * 1024),
      replicas: z.number().int().min(1).max(5).default(1),
    }),
    cluster: section({
      size: z.number().int().min(1).max(5).default(1),
      name: z
        .string()
        .regex(/^[A-Za-z0-9][A-Za-z0-9_-]*$/, "must be letters, digits, dashes and underscores")
        .max(64)
        .default("callplane"),
      nodeNetwork: cidr.default("127.0.4.0/24"),
      routePort: z.number().int().min(1).max(65535).default(6222),
      tls: section({
        certFile: z.string().default(""),
        keyFile: z.string().default(""),
      }),
    }),
    consumer: section({
      ackWaitSeconds: seconds(30, 3600),
    }),
  }),
  api: section({
    replicaCount: z.number().int().min(1).max(50).default(1),
    podAnnotations: podAnnotations(),
    resources: resources("100m", "256Mi", "512Mi"),
    listen: hostPort.default("127.0.0.1:8080"),
    url: optionalUrl(["http", "https"]),
    maxBodyBytes: z
      .number()
      .int()
      .positive()
      .default(1024 * 1024),
    database: section({
      driver: z.enum(["sqlite", "postgres"]).default("sqlite"),
      path: z.string().default(""),
      url: optionalUrl(["postgres", "postgresql"]),
      maxConnections: z.number().int().min(1).max(1000).default(10),
    }),
  }),
  apikeys: section({ podAnnotations: podAnnotations() }),
  ess: section({ podAnnotations: podAnnotations() }),
  natsAuthCalloutService: section({
    podAnnotations: podAnnotations(),
    resources: resources("50m", "64Mi", "256Mi"),
    serviceConfig: section({
      logging: section({
        level: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
        sampling: section({
          initial: z.number().int().min(0).default(100),
          thereafter: z.number().int().min(1).default(100),
        }),
      }),
    }),
  }),
  adminIssuerProxy: section({
    enabled: z.boolean().default(true),
    podAnnotations: podAnnotations(),
    resources: resources("50m", "64Mi", "256Mi"),
    listen: hostPort.default("127.0.0.1:8081"),
    url: optionalUrl(["http", "https"]),
    tokenTtlSeconds: seconds(43_200, 7 * 86_400),
    signingKeyFile: z.string().default(""),
    publicKeyFile: z.string().default(""),
    gateway: section({ enabled: z.boolean().default(true) }),
  }),
  secrets: section({
    mek: section({
      provider: z.enum(["file", "env", "plugin"]).default("file"),
      file: z.string().default(""),
      envVariable: z
        .string()
        .regex(/^[A-Z_][A-Z0-9_]*$/, "must be an environment variable name in upper case")
        .default("CALLPLANE_MEK_KEYRING"),
      plugin: z.string().default(""),
      refreshSeconds: seconds(30, 3600),
      rotationGraceSeconds: seconds(60, 7 * 86_400),
    }),
    nek: section({
      maxEncryptions: z.number().int().min(1).max(4_294_967_295).default(1_000_000_000),
    }),
    nekCache: section({
      maxEntries: z.number().int().min(1).max(1_000_000).default(1000),
      ttlSeconds: seconds(300, 86_400),
      outageSeconds: z.number().min(0).max(86_400).default(600),
    }),
  }),
  auth: section({
    adminSigningKeyFile: z.string().default(""),
    adminPublicKeyFile: z.string().default(""),
    serviceTokenDir: z.string().default(""),
    workerIdentityKeyFile: z.string().default(""),
  }),
  invocation: section({
    replicaCount: z.number().int().min(1).max(250).default(2),
    podAnnotations: podAnnotations(),
    resources: resources("250m", "256Mi", "1Gi"),
    autoscaling: autoscaling(),
    podNetwork: cidr.default("127.0.1.0/24"),
    port: z.number().int().min(0).max(65535).default(8080),
    selfAddress: optionalUrl(["http", "https"]),
    inlineBodyBytes: z
      .number()
      .int()
      .min(0)
      .max(4 * 1024 * 1024)
      .default(32 * 1024),
    poll: section({
      defaultSeconds: z.number().int().min(1).max(3600).default(60),
      streamingDefaultSeconds: z.number().int().min(1).max(3600).default(1200),
      maxSeconds: z.number().int().min(1).max(3600).default(3600),
      graceSeconds: seconds(2, 60),
    }),
    statusRequestTimeoutSeconds: seconds(5, 60),
    authCache: section({
      ttlSeconds: z
        .number()
        .positive()
        .max(30, "must be at most 30 (a revoked key must be refused within 30 s)")
        .default(10),
      negativeTtlSeconds: z.number().positive().max(30).default(5),
      maxEntries: z.number().int().positive().default(10_000),
    }),
    shutdownGraceSeconds: seconds(30, 3600),
    drainDelaySeconds: z.number().min(0).max(300).default(5),
    relay: section({
      enabled: z.boolean().default(true),
    }),
  }),
  worker: section({
    keepAliveSeconds: seconds(10, 600),
    inferenceIdleSeconds: z.number().min(0).max(86_400).default(300),
  }),
  pki: section({
    dir: z.string().default(""),
    caCertFile: z.string().default(""),
    caKeyFile: z.string().default(""),
  }),
  workerCallbackProxy: section({
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
  }),
  grpcproxy: section({
    replicaCount: z.number().int().min(0).max(250).default(2),
    podAnnotations: podAnnotations(),
    resources: resources("250m", "256Mi", "1Gi"),
    deployment: section({ autoscaling: autoscaling() }),
    podNetwork: cidr.default("127.0.2.0/24"),
    port: z.number().int().min(0).max(65535).default(10081),
    connectPort: z.number().int().min(0).max(65535).default(10086),
    workerTlsPort: z.number().int().min(1).max(65535).default(10084),
    workerConnectBaseURL: optionalUrl(["http", "https"]),
    sessionIdleSeconds: seconds(30, 3600),
    connectTokenTtlSeconds: seconds(30, 300),
    tls: section({
      enabled: z.boolean().default(false),
      certFile: z.string().default(""),
      keyFile: z.string().default(""),
    }),
    relay: section({
      enabled: z.boolean().default(true),
    }),
    shutdownGraceSeconds: seconds(30, 3600),
    drainDelaySeconds: z.number().min(0).max(300).default(5),
  }),
  compute: section({
    backend: z.enum(["local"]).default("local"),
    podAnnotations: podAnnotations(),
    resources: resources("100m", "256Mi", "1Gi"),
    secrets: section({
      dir: z.string().default(""),
      env: z.boolean().default(false),
    }),
    listen: hostPort.default("127.0.0.1:8082"),
    instanceNetwork: cidr.default("127.0.3.0/24"),
    syncIntervalSeconds: seconds(2, 600),
    stopGraceSeconds: seconds(10, 600),
    restartBackoff: section({
      initialSeconds: seconds(1, 600),
      maxSeconds: seconds(30, 3600),
    }),
    workerIdentity: section({
      // "" is the default source, never "off": no worker starts without an identity
      tokenSource: z.enum(["", "api"], { error: 'must be "" (the default source) or api' }).default(""),
      clusterId: z
        .string()
        .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, "must be letters, digits, dots, dashes and underscores")
        .default("local"),
      tokenTtlSeconds: z.number().int().min(30).max(3600).default(900),
    }),
  }),
  ingress: section({
    gatewayApi: section({
      enabled: z.boolean().default(true),
      gatewayClassName: k8sName.default("eg"),
      domain: dnsName.default("callplane.example.com"),
      tls: section({ secretName: k8sName.default("callplane-gateway-tls") }),
      routes: section({
        grpcWorker: section({
          enabled: z.boolean().default(false),
          listenerName: k8sName.default("worker-tcp"),
        }),
        nats: section({ enabled: z.boolean().default(true) }),
      }),
    }),
  }),
  kubernetes: section({
    image: z.string().default(""),
    imagePullPolicy: z.enum(["IfNotPresent", "Always", "Never"]).default("IfNotPresent"),
    natsImage: z.string().min(1).default("nats:2.10.27-alpine"),
    workerNamespace: k8sName.default("callplane-workers"),
    nats: section({
      storageSize: quantity.default("10Gi"),
      storageClassName: z.string().default(""),
    }),
  }),
});

export type Config = z.infer<typeof configSchema>;
export type ConfigInput = z.input<typeof configSchema>;

export class ConfigError extends Error {
  readonly problems: string[];
  constructor(source: string, problems: string[]) {
    super(`invalid configuration (${source}):\n${problems.map((p) => `  - ${p}`).join("\n")}`);
    this.name = "ConfigError";
    this.problems = problems;
  }
}

function formatIssues(issues: z.core.$ZodIssue[]): string[] {
  const out: string[] = [];
  for (const issue of issues) {
    const path = issue.path.map(String).join(".");
    if (issue.code === "unrecognized_keys") {
      for (const key of issue.keys) out.push(`${path ? `${path}.` : ""}${key}: unknown key`);
    } else {
      out.push(`${path || "(root)"}: ${issue.message}`);
    }
  }
  return out;
}

/** The rules of a NATS cluster: replicas within the cluster, node addresses, every node given to clients. */
function replicaProblems(c: Config): string[] {
  const n = c.nats;
  if (n.stream.replicas <= n.cluster.size) return [];
  return [
    `nats.stream.replicas is ${n.stream.replicas} but nats.cluster.size is ${n.cluster.size}: a work-queue stream cannot have more replicas than the cluster has servers, and JetStream would refuse to create it. ` +
      `Lower nats.stream.replicas to at most ${n.cluster.size}, or raise nats.cluster.size to at least ${n.stream.replicas}`,
  ];
}

function natsClusterProblems(c: Config, urlUnset: boolean, sizeSet: boolean): string[] {
  const p: string[] = [];
  const n = c.nats;
  if (n.cluster.size % 2 === 0)
    p.push(
      `nats.cluster.size is ${n.cluster.size}: it must be 1 (one server) or an odd number of nodes (3 or 5). JetStream's Raft groups need a majority of the nodes, so ${n.cluster.size} nodes survive no more losses than ${n.cluster.size - 1}, and a split into two halves stops the queues`,
    );
  // with the size set, replicas beyond it are refused everywhere; left unset, the size is the local
  // stack's (one server, checked by localNatsClusterProblems), while a rendered cluster runs its own
  // three servers whatever it says (src/deploy checks replicas against those)
  if (sizeSet) p.push(...replicaProblems(c));
  if (n.cluster.size === 1 || !n.server.enabled) return p;
  const room = nodeNetworkCapacity(n.cluster.nodeNetwork);
  if (room < n.cluster.size) {
    p.push(
      `nats.cluster.nodeNetwork ${n.cluster.nodeNetwork} has room for ${room} node address(es), fewer than nats.cluster.size (${n.cluster.size}): give it a wider network (a /24 by default)`,
    );
    return p;
  }
  const listen = parseHostPort(n.server.listen);
  if (listen.port === n.cluster.routePort)
    p.push(
      `nats.cluster.routePort (${n.cluster.routePort}) is the client port of nats.server.listen (${n.server.listen}): each node listens for clients and for routes on the same address, so they need two ports. Change nats.cluster.routePort or the port of nats.server.listen`,
    );
  if (!urlUnset) {
    const nodes = natsNodes(n).map((x) => `${x.client.host}:${x.client.port}`);
    const named = natsServerAddresses(n.url).map((a) => `${a.host}:${a.port}`);
    const missing = nodes.filter((x) => !named.includes(x));
    if (missing.length)
      p.push(
        `nats.url (${n.url}) does not name every node of the cluster the stack runs (nats.cluster.size ${n.cluster.size}: ${nodes.join(", ")}); missing ${missing.join(", ")}. ` +
          "Services and workers connect to every node so that losing one loses no client. Remove nats.url (it is derived from the nodes), or list every node",
      );
  }
  return p;
}

/** Rules that relate fields; each message names every field involved. */
function crossFieldProblems(
  c: Config,
  explicitlyEmpty: { webhookUrl: boolean; natsUrl: boolean; clusterSizeSet: boolean },
): string[] {
  const p: string[] = [];
  const we = c.global.workerEndpoints;
  if (
    c.invocation.replicaCount > 1 &&
    (we.invocationServiceURL || c.invocation.selfAddress) &&
    !c.invocation.relay.enabled
  ) {
    p.push(
      `invocation.replicaCount is ${c.invocation.replicaCount} with a shared callback URL (${we.invocationServiceURL ? "global.workerEndpoints.invocationServiceURL" : "invocation.selfAddress"}) ` +
        "and invocation.relay.enabled is false: a callback balanced to a replica that does not hold the request would be dropped. " +
        "Turn invocation.relay.enabled on, or set invocation.replicaCount to 1",
    );
  }
  if (c.adminIssuerProxy.enabled && c.adminIssuerProxy.listen === c.api.listen) {
    p.push(
      `adminIssuerProxy.listen and api.listen are both ${c.api.listen}: give the issuer its own address`,
    );
  }
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
  const db = c.api.database;
  if (db.driver === "postgres" && !db.url)
    p.push(
      "api.database.driver is postgres but api.database.url is empty: set it to postgres://user:password@host:port/database",
    );
  if (db.driver === "sqlite" && db.url)
    p.push(
      `api.database.url is set (${db.url.replace(/\/\/[^@/]*@/, "//…@")}) but api.database.driver is sqlite: set api.database.driver to postgres, or clear api.database.url`,
    );
  const mek = c.secrets.mek;
  if (mek.rotationGraceSeconds < 2 * mek.refreshSeconds) {
    p.push(
      `secrets.mek.rotationGraceSeconds (${mek.rotationGraceSeconds}) is less than twice secrets.mek.refreshSeconds (${mek.refreshSeconds}): ` +
        "a new MEK could be promoted before every API replica has reloaded its keys, and one replica could write NEKs another cannot read. " +
        `Raise secrets.mek.rotationGraceSeconds to at least ${2 * mek.refreshSeconds}, or lower secrets.mek.refreshSeconds`,
    );
  }
  if (mek.provider === "plugin" && !mek.plugin) {
    p.push("secrets.mek.provider is plugin but secrets.mek.plugin is empty: name the plugin module's file");
  }
  if (c.nats.workerAuth === "token" && explicitlyEmpty.webhookUrl) {
    p.push(
      "nats.workerAuth is token and nats.authCallout.workerTokenAuth.webhookUrl is empty: the auth callout would have nowhere to check worker tokens. Remove the key (it defaults to the API's /v2/nvcf/webhook/nats-auth) or set it to the API's webhook URL",
    );
  }
  const hook = c.nats.authCallout.workerTokenAuth.webhookUrl;
  if (hook) {
    let ok = false;
    try {
      ok = ["http:", "https:"].includes(new URL(hook).protocol);
    } catch {
      ok = false;
    }
    if (!ok) p.push("nats.authCallout.workerTokenAuth.webhookUrl: must be an http or https URL");
  }
  p.push(...natsClusterProblems(c, explicitlyEmpty.natsUrl, explicitlyEmpty.clusterSizeSet));
  const g = c.grpcproxy;
  if (
    g.workerConnectBaseURL &&
    we.grpcProxyWorkerConnectURL &&
    g.workerConnectBaseURL !== we.grpcProxyWorkerConnectURL
  ) {
    p.push(
      `grpcproxy.workerConnectBaseURL (${g.workerConnectBaseURL}) and global.workerEndpoints.grpcProxyWorkerConnectURL (${we.grpcProxyWorkerConnectURL}) are both set and differ: they name the same thing, the shared address workers open gRPC tunnels at. Set one of them`,
    );
  }
  const sharedGrpc = g.workerConnectBaseURL
    ? "grpcproxy.workerConnectBaseURL"
    : we.grpcProxyWorkerConnectURL
      ? "global.workerEndpoints.grpcProxyWorkerConnectURL"
      : undefined;
  if (g.replicaCount > 1 && sharedGrpc && !g.relay.enabled) {
    p.push(
      `grpcproxy.replicaCount is ${g.replicaCount} with a shared tunnel address (${sharedGrpc}) and grpcproxy.relay.enabled is false: a worker's tunnel balanced to a replica that does not hold its session would be refused, and the client's call would fail. Turn grpcproxy.relay.enabled on, or set grpcproxy.replicaCount to 1`,
    );
  }
  if (g.tls.enabled && (!g.tls.certFile || !g.tls.keyFile)) {
    p.push(
      "grpcproxy.tls.enabled is true but grpcproxy.tls.certFile or grpcproxy.tls.keyFile is empty: TLS on the client listener needs both files",
    );
  }
  if (c.compute.restartBackoff.initialSeconds > c.compute.restartBackoff.maxSeconds) {
    p.push("compute.restartBackoff.initialSeconds is larger than compute.restartBackoff.maxSeconds");
  }
  if (c.invocation.poll.defaultSeconds > c.invocation.poll.maxSeconds) {
    p.push("invocation.poll.defaultSeconds is larger than invocation.poll.maxSeconds");
  }
  for (const [key, a] of [
    ["invocation.autoscaling", c.invocation.autoscaling],
    ["grpcproxy.deployment.autoscaling", c.grpcproxy.deployment.autoscaling],
    ["workerCallbackProxy.autoscaling", c.workerCallbackProxy.autoscaling],
  ] as const) {
    if (a.minReplicas > a.maxReplicas)
      p.push(`${key}.minReplicas (${a.minReplicas}) is larger than ${key}.maxReplicas (${a.maxReplicas})`);
  }
  const frontend = c.workerCallbackProxy.tls.frontend;
  if (frontend.existingSecret && frontend.certificate.issuerRef.name)
    p.push(
      `workerCallbackProxy.tls.frontend.existingSecret (${frontend.existingSecret}) and workerCallbackProxy.tls.frontend.certificate.issuerRef.name (${frontend.certificate.issuerRef.name}) are both set: the frontend certificate either comes from your Secret or is issued by that issuer. Set one of them`,
    );
  return p;
}

function camelKey(segment: string, keys: string[]): string | undefined {
  const want = segment.replaceAll("_", "").toLowerCase();
  return keys.find((k) => k.toLowerCase() === want);
}

/** Applies CALLPLANE__A__B=value overrides onto the raw document, checking each path against the schema. */
function applyEnvOverrides(doc: Record<string, unknown>, env: NodeJS.ProcessEnv, problems: string[]): void {
  for (const [name, raw] of Object.entries(env)) {
    if (!name.startsWith("CALLPLANE__") || raw === undefined) continue;
    const segments = name.slice("CALLPLANE__".length).split("__");
    let shape: z.ZodType = configSchema;
    let target: Record<string, unknown> = doc;
    const path: string[] = [];
    let ok = true;
    for (const [i, seg] of segments.entries()) {
      const inner = unwrap(shape);
      const keys = inner instanceof z.ZodObject ? Object.keys(inner.shape) : [];
      const key = camelKey(seg, keys);
      if (!key || !(inner instanceof z.ZodObject)) {
        problems.push(`${name}: ${[...path, seg.toLowerCase()].join(".")} is not a configuration key`);
        ok = false;
        break;
      }
      path.push(key);
      shape = (inner.shape as Record<string, z.ZodType>)[key]!;
      if (i === segments.length - 1) {
        target[key] = parseYaml(raw) as unknown;
      } else {
        const next = target[key];
        if (typeof next !== "object" || next === null) target[key] = {};
        target = target[key] as Record<string, unknown>;
      }
    }
    void ok;
  }
}

function unwrap(t: z.ZodType): z.ZodType {
  let cur: z.ZodType = t;
  for (;;) {
    if (cur instanceof z.ZodDefault || cur instanceof z.ZodPrefault || cur instanceof z.ZodOptional) {
      cur = cur.unwrap() as z.ZodType;
    } else if (cur instanceof z.ZodPipe) {
      cur = cur.in as z.ZodType;
    } else {
      return cur;
    }
  }
}

/**
 * The local stack's NATS: its servers are all there are, so nats.stream.replicas may not exceed
 * nats.cluster.size (set or not). On one machine, the nodes of the stack's NATS cluster (nats.cluster.nodeNetwork) take loopback
 * addresses of their own: a network that overlaps the pods' or the instances' would give a node
 * and a replica or an instance the same address. (Across machines the nodes are pods.)
 */
export function localNatsClusterProblems(c: Config): string[] {
  const p: string[] = [];
  if (!c.nats.server.enabled) return p;
  // the servers the stack runs are all there are
  p.push(...replicaProblems(c));
  if (c.nats.cluster.size === 1) return p;
  const nodes = parseCidr(c.nats.cluster.nodeNetwork);
  // two networks overlap when the wider one holds the narrower one's first address
  const overlaps = (other: string) => {
    const o = parseCidr(other);
    const [wide, narrow] = o.bits <= nodes.bits ? [o, c.nats.cluster.nodeNetwork] : [nodes, other];
    return cidrContains(wide, narrow.split("/")[0]);
  };
  const others: Array<[string, string, boolean]> = [
    ["invocation.podNetwork", c.invocation.podNetwork, c.invocation.replicaCount > 0],
    ["grpcproxy.podNetwork", c.grpcproxy.podNetwork, c.grpcproxy.replicaCount > 0],
    ["compute.instanceNetwork", c.compute.instanceNetwork, true],
  ];
  for (const [key, cidr, used] of others)
    if (used && overlaps(cidr))
      p.push(
        `nats.cluster.nodeNetwork ${c.nats.cluster.nodeNetwork} overlaps ${key} ${cidr}: a NATS node and another part of the stack would share loopback addresses. Give nats.cluster.nodeNetwork a network of its own (the default is 127.0.4.0/24)`,
      );
  return p;
}

/**
 * On one machine, with the callback proxy on, the stack's pods (invocation.podNetwork,
 * grpcproxy.podNetwork) must lie inside workerCallbackProxy.podNetworks, or the proxy refuses every
 * callback and tunnel to them. (Across machines the pods' addresses come from the cluster, so the
 * rule belongs to the local stack, which calls this.)
 */
export function localPodNetworkProblems(c: Config): string[] {
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

export interface LoadOptions {
  /** Path of the YAML environment file; without it, the defaults. */
  file?: string | undefined;
  /** A document to merge over the file (tests use this). */
  overrides?: ConfigInput;
  env?: NodeJS.ProcessEnv;
  /** Folder that relative paths in the file are taken from; the working directory by default. */
  cwd?: string;
}

function deepMerge(a: Record<string, unknown>, b: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { ...a };
  for (const [k, v] of Object.entries(b)) {
    const cur = out[k];
    out[k] =
      v && typeof v === "object" && !Array.isArray(v) && cur && typeof cur === "object" && !Array.isArray(cur)
        ? deepMerge(cur as Record<string, unknown>, v as Record<string, unknown>)
        : v;
  }
  return out;
}

function deepFreeze<T>(o: T): T {
  if (o && typeof o === "object") {
    for (const v of Object.values(o)) deepFreeze(v);
    Object.freeze(o);
  }
  return o;
}

export function loadConfig(opts: LoadOptions = {}): Config {
  const source = opts.file ?? "defaults";
  let doc: Record<string, unknown> = {};
  if (opts.file) {
    let text: string;
    try {
      text = readFileSync(opts.file, "utf8");
    } catch (err) {
      throw new ConfigError(source, [`cannot read the file: ${(err as Error).message}`]);
    }
    let parsed: unknown;
    try {
      parsed = parseYaml(text);
    } catch (err) {
      throw new ConfigError(source, [`not valid YAML: ${(err as Error).message}`]);
    }
    if (parsed !== null && parsed !== undefined) {
      if (typeof parsed !== "object" || Array.isArray(parsed))
        throw new ConfigError(source, ["the file must hold a mapping of sections"]);
      doc = parsed as Record<string, unknown>;
    }
  }
  if (opts.overrides) doc = deepMerge(doc, opts.overrides);
  const problems: string[] = [];
  applyEnvOverrides(doc, opts.env ?? process.env, problems);
  if (problems.length) throw new ConfigError(source, problems);
  const result = configSchema.safeParse(doc);
  if (!result.success) throw new ConfigError(source, formatIssues(result.error.issues));
  const config = result.data;
  // an unset webhook URL is derived; one set to "" is empty, and token mode refuses it
  const hook = (doc.nats as { authCallout?: { workerTokenAuth?: { webhookUrl?: unknown } } } | undefined)
    ?.authCallout?.workerTokenAuth?.webhookUrl;
  // a cluster's work queues are replicated unless the file says otherwise: an unset
  // nats.stream.replicas is the cluster's size, at most 3 (one stays the default of one server)
  const replicasSet =
    (doc.nats as { stream?: { replicas?: unknown } } | undefined)?.stream?.replicas !== undefined;
  if (!replicasSet) config.nats.stream.replicas = Math.min(config.nats.cluster.size, 3);
  const clusterSizeSet =
    (doc.nats as { cluster?: { size?: unknown } } | undefined)?.cluster?.size !== undefined;
  const cross = crossFieldProblems(config, {
    webhookUrl: hook === "",
    natsUrl: config.nats.url === "",
    clusterSizeSet,
  });
  if (cross.length) throw new ConfigError(source, cross);
  resolveDerived(config, opts.cwd ?? process.cwd());
  const afterDerived = keyFileProblems(config);
  if (afterDerived.length) throw new ConfigError(source, afterDerived);
  return deepFreeze(config);
}

/** Rules on paths once they are resolved: the issuer's key pair must be its own. */
function keyFileProblems(c: Config): string[] {
  const p: string[] = [];
  const ai = c.adminIssuerProxy;
  for (const [mine, other] of [
    ["signingKeyFile", "adminSigningKeyFile"],
    ["publicKeyFile", "adminPublicKeyFile"],
  ] as const) {
    if (ai[mine] === c.auth[other]) {
      p.push(
        `adminIssuerProxy.${mine} and auth.${other} name the same file (${ai[mine]}): the issuer needs a key of its own, ` +
          `or turning it off could not withdraw the tokens it issued. Give adminIssuerProxy.${mine} another file, ` +
          "or leave it empty for <global.dataDir>/keys/admin-issuer.*",
      );
    }
  }
  return p;
}

/** Fills in values that default from other values (paths under the data folder, URLs from listen addresses). */
function resolveDerived(c: Config, cwd: string): void {
  const abs = (p: string) => (isAbsolute(p) ? p : resolve(cwd, p));
  c.global.dataDir = abs(c.global.dataDir);
  const data = c.global.dataDir;
  c.api.database.path = c.api.database.path ? abs(c.api.database.path) : resolve(data, "callplane.db");
  c.auth.adminSigningKeyFile = c.auth.adminSigningKeyFile
    ? abs(c.auth.adminSigningKeyFile)
    : resolve(data, "keys", "admin-signing.key.pem");
  c.auth.adminPublicKeyFile = c.auth.adminPublicKeyFile
    ? abs(c.auth.adminPublicKeyFile)
    : resolve(data, "keys", "admin-signing.pub.pem");
  c.auth.serviceTokenDir = c.auth.serviceTokenDir ? abs(c.auth.serviceTokenDir) : resolve(data, "secrets");
  const ai = c.adminIssuerProxy;
  ai.signingKeyFile = ai.signingKeyFile
    ? abs(ai.signingKeyFile)
    : resolve(data, "keys", "admin-issuer.key.pem");
  ai.publicKeyFile = ai.publicKeyFile ? abs(ai.publicKeyFile) : resolve(data, "keys", "admin-issuer.pub.pem");
  c.secrets.mek.file = c.secrets.mek.file ? abs(c.secrets.mek.file) : resolve(data, "keys", "mek.json");
  if (c.secrets.mek.plugin) c.secrets.mek.plugin = abs(c.secrets.mek.plugin);
  if (c.compute.secrets.dir) c.compute.secrets.dir = abs(c.compute.secrets.dir);
  if (c.nats.server.binary) c.nats.server.binary = abs(c.nats.server.binary);
  if (!c.api.url) c.api.url = `http://${c.api.listen}`;
  c.auth.workerIdentityKeyFile = c.auth.workerIdentityKeyFile
    ? abs(c.auth.workerIdentityKeyFile)
    : resolve(data, "keys", "worker-identity.key.pem");
  c.nats.credentialsDir = c.nats.credentialsDir
    ? abs(c.nats.credentialsDir)
    : resolve(data, "secrets", "nats");
  c.nats.authCallout.workerTokenAuth.webhookUrl ||= `${c.api.url.replace(/\/+$/, "")}/v2/nvcf/webhook/nats-auth`;
  if (!c.adminIssuerProxy.url) c.adminIssuerProxy.url = `http://${c.adminIssuerProxy.listen}`;
  c.pki.dir = c.pki.dir ? abs(c.pki.dir) : resolve(data, "pki");
  c.pki.caCertFile = c.pki.caCertFile ? abs(c.pki.caCertFile) : resolve(c.pki.dir, "ca.crt");
  c.pki.caKeyFile = c.pki.caKeyFile ? abs(c.pki.caKeyFile) : resolve(c.pki.dir, "ca.key");
  if (!c.nats.url)
    c.nats.url = natsNodes(c.nats)
      .map((n) => n.url)
      .join(",");
  const ctls = c.nats.cluster.tls;
  ctls.certFile = ctls.certFile ? abs(ctls.certFile) : resolve(c.pki.dir, "nats-route", "tls.crt");
  ctls.keyFile = ctls.keyFile ? abs(ctls.keyFile) : resolve(c.pki.dir, "nats-route", "tls.key");
  const ntls = c.nats.tls;
  ntls.certFile = ntls.certFile ? abs(ntls.certFile) : resolve(c.pki.dir, "nats", "tls.crt");
  ntls.keyFile = ntls.keyFile ? abs(ntls.keyFile) : resolve(c.pki.dir, "nats", "tls.key");
  ntls.caFile = ntls.caFile ? abs(ntls.caFile) : c.pki.caCertFile;
  const front = c.workerCallbackProxy.tls.frontend;
  front.certFile = front.certFile ? abs(front.certFile) : resolve(c.pki.dir, "proxy", "tls.crt");
  front.keyFile = front.keyFile ? abs(front.keyFile) : resolve(c.pki.dir, "proxy", "tls.key");
  const gt = c.grpcproxy.tls;
  if (gt.certFile) gt.certFile = abs(gt.certFile);
  if (gt.keyFile) gt.keyFile = abs(gt.keyFile);
  if (c.workerCallbackProxy.enabled && !c.global.workerEndpoints.invocationProxyURL) {
    c.global.workerEndpoints.invocationProxyURL = `https://invocation.${c.workerCallbackProxy.workerDomain}:${parseHostPort(c.workerCallbackProxy.listen).port}`;
  }
}
