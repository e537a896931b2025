// Closing NATS connections by the user they logged in as, through the system account ($SYS.REQ
// CONNZ and KICK, nats-server 2.10+), on every server of a cluster: how a revoked worker identity,
// or a rotated worker key, loses the connections it already has. The caller connects as a SYS user
// (the api-revoker role).
import type { NatsConnection } from "@nats-io/transport-node";
import { silentLogger } from "../log.js";
import { NATS_ACCOUNTS } from "./permissions.js";
import { nkeyWorkerUser, publicKeyOf, readWorkerSeed, rotateWorkerKey } from "./credentials.js";
import { type NatsAccess } from "./access.js";
import { connectNats } from "./connection.js";

interface Connz {
  server: { id: string; name?: string };
  data: { connections?: Array<{ cid: number; authorized_user?: string }>; total: number };
}

export interface ClosedConnections {
  /** How many connections were closed, over every server. */
  closed: number;
  /** The servers that answered, by name (or id), and how many each closed. */
  servers: Array<{ id: string; name: string; closed: number }>;
  /** How many servers were asked for (nats.cluster.size). */
  expected: number;
}

const PAGE = 1024;
const WAIT_MS = 5000;

/**
 * Kicks every APP connection whose user matches, on every server of the cluster. A connection
 * lives on one server and its id (cid) means something there only, so each server is asked for
 * its own list (PING.CONNZ reaches every server; each answers with its id) and each kick goes to
 * the server that listed the connection. `servers` is how many answers to wait for (the cluster's
 * size); a server that does not answer within 5 s is reported as missing in the result, not
 * waited for: one that is down holds no connection, one that is cut off from the others cannot be
 * reached anyway (its connections end when their user JWT expires, in token mode).
 */
export async function closeConnections(
  sys: NatsConnection,
  match: (user: string) => boolean,
  opts: { servers?: number } = {},
): Promise<ClosedConnections> {
  const expected = Math.max(1, opts.servers ?? 1);
  const query = (offset: number) =>
    JSON.stringify({ acc: NATS_ACCOUNTS.app, auth: true, offset, limit: PAGE });
  const first = new Map<string, Connz>();
  const replies = await sys.requestMany("$SYS.REQ.SERVER.PING.CONNZ", query(0), {
    strategy: "count",
    maxMessages: expected,
    maxWait: WAIT_MS,
  });
  for await (const m of replies) {
    const body = m.json<Connz>();
    if (body.server?.id && !first.has(body.server.id)) first.set(body.server.id, body);
  }
  if (first.size === 0)
    throw new Error(
      `no NATS server answered $SYS.REQ.SERVER.PING.CONNZ within ${WAIT_MS / 1000} s (asked for ${expected})`,
    );
  const result: ClosedConnections = { closed: 0, servers: [], expected };
  for (const [id, firstPage] of first) {
    let closed = 0;
    let page: Connz = firstPage;
    for (let offset = 0; ;) {
      const conns = page.data.connections ?? [];
      for (const c of conns) {
        if (!c.authorized_user || !match(c.authorized_user)) continue;
        await sys.request(`$SYS.REQ.SERVER.${id}.KICK`, JSON.stringify({ cid: c.cid }), { timeout: WAIT_MS });
        closed++;
      }
      offset += conns.length;
      if (conns.length === 0 || offset >= page.data.total) break;
      // the next page of this server's list, from this server
      page = (
        await sys.request(`$SYS.REQ.SERVER.${id}.CONNZ`, query(offset), { timeout: WAIT_MS })
      ).json<Connz>();
    }
    result.servers.push({ id, name: firstPage.server.name ?? id, closed });
    result.closed += closed;
  }
  return result;
}

/**
 * Rotates the shared worker nkey and closes every connection that logged in with the old one (the
 * last step of the switch to token mode, or the answer to a leaked key). New nkey logins are
 * checked against the new key at once (the auth callout reads the key file at each login).
 */
export async function rotateWorkerKeyAndClose(
  credentialsDir: string,
  sysAccess: NatsAccess,
  /** How many servers the cluster has (nats.cluster.size): each is asked for its connections. */
  servers = 1,
): Promise<{
  oldUser: string;
  newPublicKey: string;
  closed: number;
  servers: ClosedConnections["servers"];
  expected: number;
}> {
  const oldUser = nkeyWorkerUser(publicKeyOf(readWorkerSeed(credentialsDir)));
  const { publicKey } = rotateWorkerKey(credentialsDir);
  const sys = await connectNats(sysAccess, "rotate-worker-key", silentLogger());
  try {
    const r = await closeConnections(sys, (u) => u === oldUser, { servers });
    return { oldUser, newPublicKey: publicKey, ...r };
  } finally {
    await sys.close();
  }
}
