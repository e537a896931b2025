// The health of the stack's NATS servers, read through the system account as the nats-monitor role
// (no monitoring port is opened: every answer comes over the same TLS, authenticated connections as
// everything else). Every server answers a $SYS.REQ.SERVER.PING.<kind> request for itself, so one
// connection to any node sees the whole cluster: each node's health (HEALTHZ: up, JetStream ready,
// its streams current), the routes it holds (ROUTEZ), and JetStream's view (JSZ: the meta leader,
// each work queue's leader and replicas). A node that is down does not answer; it shows as missing.
import type { NatsConnection } from "@nats-io/transport-node";
import { setTimeout as sleep } from "node:timers/promises";

interface ServerInfo {
  name: string;
  id: string;
  host?: string;
  cluster?: string;
  ver?: string;
}

interface Reply<T> {
  server: ServerInfo;
  data?: T;
  error?: { code: number; description: string };
}

interface Healthz {
  status: string;
  status_code?: number;
  error?: string;
}

interface Routez {
  routes?: Array<{ remote_name?: string; remote_id: string }>;
}

interface StreamDetail {
  name: string;
  cluster?: {
    leader?: string;
    replicas?: Array<{ name: string; current: boolean; offline?: boolean; lag?: number }>;
  };
  state?: { messages: number; consumer_count: number };
}

interface Jsz {
  disabled?: boolean;
  storage?: number;
  streams?: number;
  consumers?: number;
  config?: { max_storage?: number };
  meta_cluster?: {
    name?: string;
    leader?: string;
    cluster_size?: number;
    replicas?: Array<{ name: string; current: boolean; offline?: boolean }>;
  };
  account_details?: Array<{ name: string; stream_detail?: StreamDetail[] }>;
}

export interface NatsServerHealth {
  name: string;
  id: string;
  host: string | undefined;
  version: string | undefined;
  /** HEALTHZ said ok: the server is up, JetStream is ready and its streams are current. */
  healthy: boolean;
  status: string;
  error: string | undefined;
  /** The servers this one has routes to (by name). */
  routesTo: string[];
  /** The JetStream meta leader this server knows of. */
  metaLeader: string | undefined;
  /** This server's JetStream: streams and consumers it holds, bytes stored and its storage limit. */
  jetstream: { streams: number; consumers: number; storage: number; maxStorage: number } | undefined;
}

export interface NatsStreamHealth {
  name: string;
  leader: string | undefined;
  replicas: Array<{ name: string; current: boolean; offline: boolean; lag: number }>;
  messages: number | undefined;
}

export interface NatsClusterHealth {
  /** How many servers were expected to answer (nats.cluster.size). */
  expected: number;
  servers: NatsServerHealth[];
  /** The JetStream meta leader, when every server that answered names the same one. */
  metaLeader: string | undefined;
  /** Streams as their leader reports them (a stream with no leader right now is missing). */
  streams: NatsStreamHealth[];
  /** Every expected server answered healthy, and (in a cluster) they agree on one meta leader. */
  ok: boolean;
  /** What is wrong, one line each (empty when ok). */
  problems: string[];
}

async function ask<T>(
  nc: NatsConnection,
  kind: string,
  body: unknown,
  expected: number,
  waitMs: number,
): Promise<Map<string, Reply<T>>> {
  const out = new Map<string, Reply<T>>();
  const replies = await nc.requestMany(`$SYS.REQ.SERVER.PING.${kind}`, JSON.stringify(body), {
    strategy: "count",
    maxMessages: expected,
    maxWait: waitMs,
  });
  for await (const m of replies) {
    const r = m.json<Reply<T>>();
    if (r.server?.name) out.set(r.server.name, r);
  }
  return out;
}

function jetstreamOf(j: Jsz | undefined): NatsServerHealth["jetstream"] {
  if (!j || j.disabled) return undefined;
  return {
    streams: j.streams ?? 0,
    consumers: j.consumers ?? 0,
    storage: j.storage ?? 0,
    maxStorage: j.config?.max_storage ?? 0,
  };
}

/**
 * Asks every server for its health, routes and JetStream view. A server that does not answer
 * within `waitMs` is left out (and named in `problems` by count).
 */
export async function natsClusterHealth(
  nc: NatsConnection,
  expected: number,
  /**
   * `streams: false` leaves each stream's replicas out (the JSZ answer then stays small however
   * many work queues there are: the console's health page asks this way).
   */
  opts: { waitMs?: number; streams?: boolean } = {},
): Promise<NatsClusterHealth> {
  const waitMs = opts.waitMs ?? 2000;
  const [health, routes, jsz] = await Promise.all([
    ask<Healthz>(nc, "HEALTHZ", {}, expected, waitMs),
    ask<Routez>(nc, "ROUTEZ", {}, expected, waitMs),
    ask<Jsz>(nc, "JSZ", opts.streams === false ? {} : { accounts: true, streams: true }, expected, waitMs),
  ]);
  const names = [...new Set([...health.keys(), ...routes.keys(), ...jsz.keys()])].sort();
  const servers: NatsServerHealth[] = names.map((name) => {
    const h = health.get(name);
    const info = (h ?? routes.get(name) ?? jsz.get(name))!.server;
    return {
      name,
      id: info.id,
      host: info.host,
      version: info.ver,
      healthy: h?.data?.status === "ok",
      status: h?.data?.status ?? "no answer",
      error: h?.data?.error ?? h?.error?.description,
      routesTo: [
        ...new Set((routes.get(name)?.data?.routes ?? []).map((r) => r.remote_name ?? r.remote_id)),
      ].sort(),
      metaLeader: jsz.get(name)?.data?.meta_cluster?.leader || undefined,
      jetstream: jetstreamOf(jsz.get(name)?.data),
    };
  });
  const leaders = new Set(servers.map((s) => s.metaLeader));
  const metaLeader = leaders.size === 1 ? [...leaders][0] : undefined;
  const streams = new Map<string, NatsStreamHealth>();
  for (const [server, r] of jsz) {
    for (const acc of r.data?.account_details ?? []) {
      for (const s of acc.stream_detail ?? []) {
        // one report per stream: its leader's (the others' views of the replicas are partial)
        if (s.cluster?.leader && s.cluster.leader !== server) continue;
        if (streams.has(s.name) && !s.cluster?.leader) continue;
        streams.set(s.name, {
          name: s.name,
          leader: s.cluster?.leader,
          replicas: (s.cluster?.replicas ?? []).map((x) => ({
            name: x.name,
            current: x.current,
            offline: x.offline ?? false,
            lag: x.lag ?? 0,
          })),
          messages: s.state?.messages,
        });
      }
    }
  }
  const problems: string[] = [];
  if (servers.length < expected)
    problems.push(
      `${expected - servers.length} of ${expected} servers did not answer (answered: ${servers.map((s) => s.name).join(", ") || "none"})`,
    );
  for (const s of servers) {
    if (!s.healthy) problems.push(`${s.name}: ${s.status}${s.error ? ` (${s.error})` : ""}`);
    if (expected > 1 && s.routesTo.length < expected - 1)
      problems.push(`${s.name}: routes to ${s.routesTo.length} of the ${expected - 1} other servers`);
  }
  if (expected > 1 && servers.length > 0 && !metaLeader)
    problems.push(
      `the servers do not agree on a JetStream meta leader (${servers.map((s) => `${s.name}: ${s.metaLeader ?? "none"}`).join(", ")})`,
    );
  for (const s of streams.values()) {
    const behind = s.replicas.filter((r) => !r.current || r.offline);
    if (behind.length)
      problems.push(
        `stream ${s.name}: replica(s) ${behind.map((r) => `${r.name}${r.offline ? " offline" : " not current"}`).join(", ")}`,
      );
  }
  return {
    expected,
    servers,
    metaLeader,
    streams: [...streams.values()].sort((a, b) => a.name.localeCompare(b.name)),
    ok: problems.length === 0,
    problems,
  };
}

/**
 * Waits until every expected server answers healthy and they agree on a meta leader (a cluster
 * that has just started elects one within seconds). Throws with the last problems at the deadline.
 */
export async function waitForNatsCluster(
  nc: NatsConnection,
  expected: number,
  timeoutMs = 60_000,
): Promise<NatsClusterHealth> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const h = await natsClusterHealth(nc, expected, { waitMs: 1000 });
    if (h.ok) return h;
    if (Date.now() > deadline)
      throw new Error(
        `the NATS cluster was not healthy within ${timeoutMs / 1000} s: ${h.problems.join("; ")}`,
      );
    await sleep(250);
  }
}

interface Connz {
  connections?: Array<{ cid: number; name?: string; start?: string; subscriptions_list?: string[] }>;
  total?: number;
}

/** One connection of an account, as the server that holds it lists it. */
export interface AccountConnection {
  server: string;
  cid: number;
  name: string | undefined;
  start: string | undefined;
  subscriptions: string[];
}

/**
 * The connections of one account on every server (PING.CONNZ, which the API's SYS user may ask:
 * the console's health page finds the auth callout this way, in AUTH, and its subscription to
 * $SYS.REQ.USER.AUTH). `servers`: the servers that answered, by name.
 */
export async function accountConnections(
  nc: NatsConnection,
  account: string,
  expected: number,
  waitMs: number,
): Promise<{ servers: string[]; connections: AccountConnection[] }> {
  const replies = await ask<Connz>(
    nc,
    "CONNZ",
    { acc: account, subscriptions: true, limit: 256 },
    expected,
    waitMs,
  );
  const connections = [...replies].flatMap(([server, r]) =>
    (r.data?.connections ?? []).map((c) => ({
      server,
      cid: c.cid,
      name: c.name,
      start: c.start,
      subscriptions: c.subscriptions_list ?? [],
    })),
  );
  return { servers: [...replies.keys()].sort(), connections };
}
