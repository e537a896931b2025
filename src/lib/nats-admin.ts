// Closing NATS connections by the user they logged in as, through the system account ($SYS.REQ
// CONNZ and KICK, nats-server 2.10+): how a revoked worker identity, or a rotated worker key, loses
// the connections it already has. The caller connects as a SYS user (the api-revoker role).
import type { NatsConnection } from "@nats-io/transport-node";
import { silentLogger } from "./log.js";
import {
  NATS_ACCOUNTS,
  nkeyWorkerUser,
  publicKeyOf,
  readWorkerSeed,
  rotateWorkerKey,
  type NatsAccess,
} from "./nats-auth.js";
import { connectNats } from "./queue.js";

interface Connz {
  server: { id: string };
  data: { connections?: Array<{ cid: number; authorized_user?: string }>; total: number };
}

/** Kicks every APP connection whose user matches; returns how many. Assumes one nats-server (no cluster). */
export async function closeConnections(
  sys: NatsConnection,
  match: (user: string) => boolean,
): Promise<number> {
  let kicked = 0;
  for (let offset = 0; ;) {
    const reply = await sys.request(
      "$SYS.REQ.SERVER.PING.CONNZ",
      JSON.stringify({ acc: NATS_ACCOUNTS.app, auth: true, offset, limit: 1024 }),
      { timeout: 5000 },
    );
    const body = reply.json<Connz>();
    const conns = body.data.connections ?? [];
    for (const c of conns) {
      if (!c.authorized_user || !match(c.authorized_user)) continue;
      await sys.request(`$SYS.REQ.SERVER.${body.server.id}.KICK`, JSON.stringify({ cid: c.cid }), {
        timeout: 5000,
      });
      kicked++;
    }
    offset += conns.length;
    if (conns.length === 0 || offset >= body.data.total) break;
  }
  return kicked;
}

/**
 * Rotates the shared worker nkey and closes every connection that logged in with the old one (the
 * last step of the switch to token mode, or the answer to a leaked key). New nkey logins are
 * checked against the new key at once (the auth callout reads the key file at each login).
 */
export async function rotateWorkerKeyAndClose(
  credentialsDir: string,
  sysAccess: NatsAccess,
): Promise<{ oldUser: string; newPublicKey: string; closed: number }> {
  const oldUser = nkeyWorkerUser(publicKeyOf(readWorkerSeed(credentialsDir)));
  const { publicKey } = rotateWorkerKey(credentialsDir);
  const sys = await connectNats(sysAccess, "rotate-worker-key", silentLogger());
  try {
    const closed = await closeConnections(sys, (u) => u === oldUser);
    return { oldUser, newPublicKey: publicKey, closed };
  } finally {
    await sys.close();
  }
}
