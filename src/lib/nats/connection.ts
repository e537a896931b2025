// The one way callplane connects to NATS, and the one way it lets go of a connection.
import { connect, nkeyAuthenticator, tokenAuthenticator, type NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "../log.js";
import { Gauge, type Registry } from "../metrics.js";
import type { NatsAccess } from "./access.js";
import { natsServers } from "./cluster.js";

/**
 * The one way callplane connects to NATS: TLS verified against the stack CA, the caller's own
 * credentials, and its own inbox prefix (its grant covers that prefix, never `_INBOX.>`). `url` may
 * name several servers, separated by commas: every node of a cluster.
 */
/** Connections between a disconnect and the reconnect that ends it (the client keeps trying). */
const disconnected = new WeakSet<NatsConnection>();

/** Whether a connection is up now: open, and not between a disconnect and its reconnect. */
export function natsConnected(nc: NatsConnection | undefined): boolean {
  return nc !== undefined && !nc.isClosed() && !disconnected.has(nc);
}

/**
 * callplane_nats_connected on `registry`: 1 while the service's connection is up. The first
 * connection a registry is given is the one it reports (a service's own, to the APP account).
 */
function reportConnection(registry: Registry, nc: NatsConnection): void {
  if (registry.getSingleMetric("callplane_nats_connected")) return;
  new Gauge({
    name: "callplane_nats_connected",
    help: "1 while this service's NATS connection is up (0 while it reconnects or after it closed)",
    registers: [registry],
    collect() {
      this.set(natsConnected(nc) ? 1 : 0);
    },
  });
}

export async function connectNats(
  access: NatsAccess,
  name: string,
  logger: Logger,
  registry?: Registry,
): Promise<NatsConnection> {
  const enc = new TextEncoder();
  const auth = access.auth;
  // noAsyncTraces: the client would otherwise build an Error (a stack capture) for every request,
  // a measurable share of the hot path's CPU; timeouts still reject with clear errors.
  const nc = await connect({
    noAsyncTraces: true,
    // every node of a cluster (a comma-separated list): the client picks one and, if it goes, moves on
    servers: natsServers(access.url),
    tls: { ca: access.caPem },
    // a token is read again at every reconnect: a worker's identity token is refreshed in its file
    authenticator:
      "nkeySeed" in auth ? nkeyAuthenticator(enc.encode(auth.nkeySeed)) : tokenAuthenticator(auth.token),
    inboxPrefix: access.inboxPrefix,
    name,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 500,
    pingInterval: 10_000,
  });
  if (registry) reportConnection(registry, nc);
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === "disconnect") disconnected.add(nc);
      else if (s.type === "reconnect") disconnected.delete(nc);
      if (s.type === "disconnect" || s.type === "reconnect" || s.type === "error")
        logger.warn(
          {
            nats: s.type,
            server: "server" in s ? s.server : undefined,
            err: "error" in s ? s.error.message : undefined,
          },
          // a permission violation arrives here (NATS reports it without closing the connection)
          `nats ${s.type}`,
        );
    }
  })();
  return nc;
}

/**
 * Drains a connection, but never waits longer than `ms`: with the server gone, the client keeps
 * reconnecting and a drain would never end (nor let the process exit).
 */
export async function drainOrClose(nc: NatsConnection | undefined, ms = 2000): Promise<void> {
  if (!nc || nc.isClosed()) return;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    nc.drain().catch(() => undefined),
    new Promise<void>((r) => (timer = setTimeout(r, ms))),
  ]);
  clearTimeout(timer);
  if (!nc.isClosed()) await nc.close().catch(() => undefined);
}
