// Helpers for the worker-trust tests: the auth callout in this process (with its log in a file the
// test reads), worker identities issued by the API as the compute agent asks for them, and NATS
// connections made the way a worker (or an attacker holding a worker's credentials) makes them.
import { connect as netConnect } from "node:net";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { connect, nkeyAuthenticator, tokenAuthenticator, type NatsConnection } from "@nats-io/transport-node";
import { INBOX, workerAuthToken } from "../../src/lib/nats/index.js";
import { call } from "./client.js";
import type { Nats } from "./nats.js";
import { tmpDir } from "./scope.js";
import type { ApiFixture } from "./services.js";
import { readLog } from "./plane.js";

type Ctx = Pick<TestContext, "after">;

export interface Callout {
  log(): Array<Record<string, unknown>>;
}

/** Replaces the server's auth callout: token mode asks `api`'s webhook; both modes know the worker nkey. */
export async function startCallout(
  t: Ctx,
  nats: Nats,
  api: ApiFixture,
  mode: "nkey" | "token",
): Promise<Callout> {
  const dir = tmpDir(t, "callplane-callout-");
  const file = join(dir, "callout.log");
  await nats.replaceCallout(
    mode === "token"
      ? {
          APP: {
            webhook: {
              url: `${api.url}/v2/nvcf/webhook/nats-auth`,
              serviceToken: api.serviceToken("nats-auth-callout"),
              retries: 1,
            },
          },
        }
      : {},
    file,
  );
  return { log: () => readLog(file) };
}

export interface Identity {
  instanceId: string;
  token: string;
  expiresAt: string;
}

/** Asks the API for an instance identity, as the compute agent does before it starts a worker. */
export async function issueIdentity(
  api: ApiFixture,
  fn: { functionId: string; versionId: string },
  instanceId: string,
): Promise<Identity> {
  const d = await api.store.getDeployment(fn.functionId, fn.versionId);
  if (!d) throw new Error("the function is not deployed");
  const r = await call<{ token: string; expiresAt: string }>(
    `${api.url}/v1/internal/instances/${instanceId}/identity`,
    {
      token: api.serviceToken("compute"),
      body: { functionId: fn.functionId, versionId: fn.versionId, deploymentId: d.deploymentId },
    },
  );
  if (r.status !== 200) throw new Error(`identity: ${r.status} ${r.text}`);
  return { instanceId, token: r.body.token, expiresAt: r.body.expiresAt };
}

export async function revokeIdentity(api: ApiFixture, instanceId: string): Promise<number> {
  const r = await call(`${api.url}/v1/internal/instances/${instanceId}/identity`, {
    method: "DELETE",
    token: api.serviceToken("compute"),
  });
  return r.status;
}

export interface Watched {
  nc: NatsConnection;
  /** Every error NATS reported on this connection (permission violations arrive this way). */
  errors: string[];
  closed: boolean;
}

function watch(nc: NatsConnection): Watched {
  const w: Watched = { nc, errors: [], closed: false };
  void (async () => {
    for await (const s of nc.status()) {
      if (s.type === "error") w.errors.push((s as { error: Error }).error.message);
    }
  })();
  void nc.closed().then(() => (w.closed = true));
  return w;
}

/** Connects as a token-mode worker (its identity token, its account, its inbox prefix). */
export async function connectWithToken(
  t: Ctx,
  nats: Nats,
  token: string | (() => string),
  opts: { account?: string; instanceId: string; reconnect?: boolean },
): Promise<Watched> {
  const read = typeof token === "string" ? () => token : token;
  const nc = await connect({
    servers: nats.url,
    tls: { ca: nats.pki.ca.certPem },
    authenticator: tokenAuthenticator(() => workerAuthToken(opts.account ?? "APP", read())),
    inboxPrefix: INBOX.tokenWorker(opts.instanceId),
    reconnect: opts.reconnect ?? false,
    maxReconnectAttempts: opts.reconnect ? -1 : 0,
    reconnectTimeWait: 200,
    name: `trust-test-${opts.instanceId}`,
  });
  t.after(() => nc.close().catch(() => undefined));
  return watch(nc);
}

/** Connects with an nkey seed (the shared worker key, or any other). */
export async function connectWithNkey(
  t: Ctx,
  nats: Nats,
  seed: string,
  inboxPrefix: string,
): Promise<Watched> {
  const nc = await connect({
    servers: nats.url,
    tls: { ca: nats.pki.ca.certPem },
    authenticator: nkeyAuthenticator(new TextEncoder().encode(seed)),
    inboxPrefix,
    reconnect: false,
  });
  t.after(() => nc.close().catch(() => undefined));
  return watch(nc);
}

/**
 * A client that does not speak TLS: reads INFO, sends CONNECT and PING in plain text, and returns
 * what the server said until it closed the connection (a server that requires TLS never says PONG).
 */
export function plainClient(
  host: string,
  port: number,
): Promise<{ tlsRequired: boolean; afterInfo: string }> {
  return new Promise((resolve, reject) => {
    const s = netConnect(port, host);
    let out = "";
    let sent = false;
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error("nats-server neither answered nor closed the plain connection within 10 s"));
    }, 10_000);
    s.on("data", (d: Buffer) => {
      out += d.toString("latin1");
      if (!sent && out.includes("\r\n")) {
        sent = true;
        s.write('CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n');
      }
    });
    s.once("error", () => undefined);
    s.once("close", () => {
      clearTimeout(timer);
      const nl = out.indexOf("\r\n");
      resolve({ tlsRequired: /"tls_required":true/.test(out.slice(0, nl)), afterInfo: out.slice(nl + 2) });
    });
  });
}
