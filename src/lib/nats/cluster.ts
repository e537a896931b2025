// Where the NATS servers of a stack are: one server on nats.server.listen, or a JetStream cluster
// of nats.cluster.size nodes. On one machine each node gets its own loopback address (host i of
// nats.cluster.nodeNetwork, as pods get their own IPs), with the client port of nats.server.listen
// and the route port nats.cluster.routePort, so no two nodes' listeners collide and no node shares
// an address with another service. Pure functions: the config's rules, the stack and the tests
// derive the same layout from them.
import { cidrHost, formatHostPort, parseCidr, parseHostPort, type HostPort } from "../net/index.js";

export interface NatsLayoutConfig {
  server: { listen: string };
  cluster: { size: number; name: string; nodeNetwork: string; routePort: number };
}

export interface NatsNode {
  /** 1-based. */
  index: number;
  /** The node's server_name (unique in the cluster, as JetStream requires). */
  name: string;
  /** Where clients connect. */
  client: HostPort;
  /** Where the other nodes open their routes (a cluster only). */
  route: HostPort | undefined;
  /** tls://host:port, as clients are given it. */
  url: string;
}

/** The server_name of the one server a stack runs without a cluster (kept from before clusters). */
export const SINGLE_SERVER_NAME = "callplane-local";

/** The nodes of the stack's NATS: one, or nats.cluster.size. Throws if the node network is too small. */
export function natsNodes(c: NatsLayoutConfig): NatsNode[] {
  const listen = parseHostPort(c.server.listen);
  if (c.cluster.size <= 1)
    return [
      {
        index: 1,
        name: SINGLE_SERVER_NAME,
        client: listen,
        route: undefined,
        url: natsUrl(listen),
      },
    ];
  const net = parseCidr(c.cluster.nodeNetwork);
  return Array.from({ length: c.cluster.size }, (_, i) => {
    const host = cidrHost(net, i + 1);
    const client = { host, port: listen.port };
    return {
      index: i + 1,
      name: `${c.cluster.name}-${i + 1}`,
      client,
      route: { host, port: c.cluster.routePort },
      url: natsUrl(client),
    };
  });
}

/** How many node addresses a node network holds (its hosts, without network and broadcast). */
export function nodeNetworkCapacity(nodeNetwork: string): number {
  const bits = parseCidr(nodeNetwork).bits;
  return Math.max(0, 2 ** (32 - bits) - 2);
}

export function natsUrl(addr: HostPort): string {
  return `tls://${formatHostPort(addr)}`;
}

/**
 * The servers of a NATS URL list: one URL, or several separated by commas (the form the Go client
 * and the nats CLI take, so NVCF_FQDN_NATS can name every node of a cluster).
 */
export function natsServers(url: string): string[] {
  return url
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
}

/** host:port of each server a URL list names (a missing port is NATS's 4222). */
export function natsServerAddresses(url: string): HostPort[] {
  return natsServers(url).map((s) => {
    const u = new URL(s.replace(/^(nats|tls):/, "http:"));
    return { host: u.hostname.replace(/^\[|\]$/g, ""), port: Number(u.port || 4222) };
  });
}
