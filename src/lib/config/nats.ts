// The nats section (the stack's NATS server or cluster, its streams, worker auth and TLS), and its
// rules: the worker token webhook, and the rules of a NATS cluster, with the local stack's own
// (its servers are all there are, on loopback networks of their own).
import { z } from "zod";
import { natsNodes, natsServerAddresses, natsServers, nodeNetworkCapacity } from "../nats/index.js";
import { cidrContains, parseCidr, parseHostPort } from "../net/index.js";
import type { ComputeConfig } from "./compute.js";
import { cidr, hostPort, seconds, section } from "./fields.js";
import type { GrpcproxyConfig } from "./grpc-proxy.js";
import type { InvocationConfig } from "./invocation.js";
import { podAnnotations, resources } from "./kubernetes.js";

export const natsSection = section({
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
        message: "must be a nats:// or tls:// URL, or several separated by commas (every node of a cluster)",
      },
    ),
  // token by default: each worker proves its own identity (an API-signed per-instance token on the
  // local backend, its pod's token on Kubernetes) and reaches its own version only; nkey hands every
  // worker one shared key that reaches every version, for workers that cannot do token mode
  workerAuth: z.enum(["nkey", "token"], { error: "nats.workerAuth must be nkey or token" }).default("token"),
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
});

export type NatsConfig = z.output<typeof natsSection>;

/** The worker token webhook, and the rules of a NATS cluster. */
export function natsProblems(
  c: { nats: NatsConfig },
  explicitlyEmpty: { webhookUrl: boolean; natsUrl: boolean; clusterSizeSet: boolean },
): string[] {
  const p: string[] = [];
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
  return p;
}

/** The rules of a NATS cluster: replicas within the cluster, node addresses, every node given to clients. */
function replicaProblems(c: { nats: NatsConfig }): string[] {
  const n = c.nats;
  if (n.stream.replicas <= n.cluster.size) return [];
  return [
    `nats.stream.replicas is ${n.stream.replicas} but nats.cluster.size is ${n.cluster.size}: a work-queue stream cannot have more replicas than the cluster has servers, and JetStream would refuse to create it. ` +
      `Lower nats.stream.replicas to at most ${n.cluster.size}, or raise nats.cluster.size to at least ${n.stream.replicas}`,
  ];
}

function natsClusterProblems(c: { nats: NatsConfig }, urlUnset: boolean, sizeSet: boolean): string[] {
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

/**
 * The local stack's NATS: its servers are all there are, so nats.stream.replicas may not exceed
 * nats.cluster.size (set or not). On one machine, the nodes of the stack's NATS cluster (nats.cluster.nodeNetwork) take loopback
 * addresses of their own: a network that overlaps the pods' or the instances' would give a node
 * and a replica or an instance the same address. (Across machines the nodes are pods.)
 */
export function localNatsClusterProblems(c: {
  nats: NatsConfig;
  invocation: InvocationConfig;
  grpcproxy: GrpcproxyConfig;
  compute: ComputeConfig;
}): string[] {
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
