// The health page's NATS rows, all from the API's own two connections:
// - `nats`: the APP connection, and the server it is on (its INFO: name, version, cluster, the
//   client URLs of the cluster's other nodes);
// - `nats-node`, one per server: HEALTHZ, ROUTEZ and JSZ through the SYS connection (every server
//   answers a PING for itself, so one connection sees the whole cluster; a server that does not
//   answer within the deadline shows as missing);
// - `jetstream`: the APP account's JetStream use and limits ($JS.API.INFO);
// - `auth-callout`: the NATS servers' own view of the callout, the AUTH account's connections that
//   subscribe to $SYS.REQ.USER.AUTH (PING.CONNZ). The callout has no listener of its own, and a
//   connection with that subscription is what nats-server needs to hand it a login.
// The cluster's answers are kept a few seconds (ProbeCache).
import { formatBytes, type ConsoleDeps } from "./context.js";
import type { Row } from "./health-row.js";
import { withDeadline } from "./probe-cache.js";

const AUTH_SUBJECT = "$SYS.REQ.USER.AUTH";

function connectionRow(c: ConsoleDeps): Row | undefined {
  const n = c.api.trust.natsServer();
  if (!n) return undefined;
  const others = n.connectUrls.length
    ? `; the cluster${n.cluster ? ` ${n.cluster}` : ""} offers clients ${n.connectUrls.join(", ")}`
    : "";
  return {
    component: "nats",
    state: n.connected ? "up" : "down",
    version: n.version,
    where: n.name,
    detail:
      (n.connected ? "the API's connection is up" : "the API's connection is down (reconnecting)") + others,
  };
}

async function nodeRows(c: ConsoleDeps): Promise<Row[]> {
  const trust = c.api.trust;
  let h;
  try {
    h = await c.probes.get("nats cluster", () => trust.natsCluster(c.probeTimeoutMs));
  } catch (err) {
    return [
      {
        component: "nats-node",
        state: "unknown",
        detail: `the servers could not be asked: ${(err as Error).message}`,
      },
    ];
  }
  if (!h)
    return [
      {
        component: "nats-node",
        state: "unknown",
        detail: "the API's system-account connection is down or not configured: the servers cannot be asked",
      },
    ];
  const rows: Row[] = h.servers.map((s) => {
    const js = s.jetstream;
    const parts = [
      s.healthy ? "healthy" : `${s.status}${s.error ? ` (${s.error})` : ""}`,
      h.expected > 1
        ? `routes to ${s.routesTo.length} of ${h.expected - 1} others${s.routesTo.length ? ` (${s.routesTo.join(", ")})` : ""}`
        : "no cluster routes (one server)",
      js
        ? `JetStream: ${js.streams} streams, ${js.consumers} consumers, ${formatBytes(js.storage)} stored of ${formatBytes(js.maxStorage)}${s.metaLeader ? `; meta leader ${s.metaLeader}` : ""}`
        : "JetStream off",
    ];
    const routed = h.expected <= 1 || s.routesTo.length >= h.expected - 1;
    return {
      component: "nats-node",
      id: s.name,
      state: !s.healthy ? "down" : routed ? "up" : "degraded",
      version: s.version,
      where: s.host,
      detail: parts.join("; "),
    };
  });
  if (h.servers.length < h.expected)
    rows.push({
      component: "nats-node",
      state: "down",
      detail: `${h.expected - h.servers.length} of ${h.expected} servers did not answer within ${c.probeTimeoutMs} ms`,
    });
  return rows;
}

async function jetStreamRow(c: ConsoleDeps): Promise<Row> {
  try {
    const a = await c.probes.get("jetstream", () =>
      withDeadline(c.api.trust.jetStreamAccount(), c.probeTimeoutMs, "JetStream"),
    );
    if (!a) return { component: "jetstream", state: "unknown", detail: "the API's NATS connection is down" };
    const limit = (n: number, what: (n: number) => string) => (n < 0 ? "no account limit" : `of ${what(n)}`);
    return {
      component: "jetstream",
      state: "up",
      where: a.domain ? `domain ${a.domain}` : "account APP",
      detail: `${a.streams} streams (${limit(a.limits.max_streams, String)}), ${a.consumers} consumers, ${formatBytes(a.storage)} stored (${limit(a.limits.max_storage, formatBytes)}), ${formatBytes(a.memory)} in memory`,
    };
  } catch (err) {
    return {
      component: "jetstream",
      state: "down",
      detail: `account info failed: ${(err as Error).message}`,
    };
  }
}

async function authCalloutRows(c: ConsoleDeps): Promise<Row[]> {
  const trust = c.api.trust;
  const mode =
    trust.opts.workerAuth === "token"
      ? "worker auth token: it checks each worker's token with this API's webhook"
      : "worker auth nkey: it checks the shared worker key";
  let seen;
  try {
    seen = await c.probes.get("auth callout", () => trust.authCalloutConnections(c.probeTimeoutMs));
  } catch (err) {
    return [
      {
        component: "auth-callout",
        state: "unknown",
        detail: `the servers could not be asked: ${(err as Error).message}`,
      },
    ];
  }
  if (!seen)
    return [
      {
        component: "auth-callout",
        state: "unknown",
        detail: "the API's system-account connection is down or not configured: the servers cannot be asked",
      },
    ];
  const callouts = seen.connections.filter((x) => x.subscriptions.includes(AUTH_SUBJECT));
  if (callouts.length === 0)
    return [
      {
        component: "auth-callout",
        state: "down",
        detail: `no connection subscribes to ${AUTH_SUBJECT} on the ${seen.servers.length} server(s) that answered (${seen.servers.join(", ") || "none"}): every login that is not one of callplane's services is refused; ${mode}`,
      },
    ];
  return callouts.map((x) => ({
    component: "auth-callout",
    id: `${x.server} #${x.cid}`,
    state: "up" as const,
    where: x.server,
    detail: `connected${x.start ? ` since ${x.start}` : ""} and subscribed to ${AUTH_SUBJECT} (as NATS sees it); ${mode}`,
  }));
}

/** Every NATS row; none while the API runs without NATS but the one saying so. */
export async function natsRows(c: ConsoleDeps): Promise<Row[]> {
  const conn = connectionRow(c);
  if (!conn) return [{ component: "nats", state: "unknown", detail: "NATS is not configured for this API" }];
  const [nodes, js, callout] = await Promise.all([nodeRows(c), jetStreamRow(c), authCalloutRows(c)]);
  return [conn, ...nodes, js, ...callout];
}
