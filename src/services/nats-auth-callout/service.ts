// The NATS auth callout (nats-server 2.10+): every login that is not one of callplane's configured
// users arrives here as an authorization request on $SYS.REQ.USER.AUTH. A worker in token mode
// sends auth_token = base64url({account, pluginName, payload}) (contract §3.4); the plugin for
// (account, pluginName), in callplane only (APP, webhook) and only in token mode, asks the API's
// webhook, and the API's answer becomes a user JWT (the user, its account, its permissions, an
// expiry) that this service signs with the issuer key nats-server trusts. Everything else is refused.
// Plugins are read once, at start-up: a change of nats.workerAuth or of the webhook URL restarts this
// service (docs/operations.md).
import { decode, encodeAuthorizationResponse, encodeUser, type AuthorizationRequest } from "@nats-io/jwt";
import { fromPublic, fromSeed } from "@nats-io/nkeys";
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import type { Logger } from "../../lib/log.js";
import {
  NATS_ACCOUNTS,
  nkeyWorkerPermissions,
  nkeyWorkerUser,
  parseWorkerAuthToken,
  type NatsAccess,
} from "../../lib/nats/index.js";
import { connectNats, drainOrClose } from "../../lib/nats/index.js";

export interface WebhookPlugin {
  url: string;
  /** The callout's service token for the API. */
  serviceToken: string;
  timeoutMs?: number;
  retries?: number;
}

export interface NatsAuthCalloutOptions {
  nats: NatsAccess;
  /** Seed of the account key nats-server's auth_callout.issuer names. */
  issuerSeed: string;
  /** Plugins by account, then plugin name: token mode has { APP: { webhook } }, nkey mode none. */
  plugins: Record<string, Record<string, WebhookPlugin>>;
  logger: Logger;
  /**
   * The shared worker nkey (nkey logins work in both modes, as upstream's): its public key, read
   * when asked so that a rotation takes effect at once, and the grants of the region.
   */
  nkeyWorker?: { publicKey: () => string; region: string };
  /** Per message: the first `initial` lines a second, then 1 in `thereafter`; initial 0 logs all. */
  sampling?: { initial: number; thereafter: number };
}

interface WebhookAnswer {
  userId: string;
  account: string;
  expiresAt?: number;
  permissions: {
    publish: { allow: string[]; deny?: string[] };
    subscribe: { allow: string[]; deny?: string[] };
    response?: { maxMsgs: number };
  };
}

/** Sampled logging, as the upstream service does it (zap's sampler): per message text, per second. */
export function sampler(opts: { initial: number; thereafter: number }, now: () => number = Date.now) {
  const counts = new Map<string, { second: number; n: number }>();
  return (message: string): boolean => {
    if (opts.initial <= 0) return true;
    const second = Math.floor(now() / 1000);
    let c = counts.get(message);
    if (!c || c.second !== second) {
      c = { second, n: 0 };
      counts.set(message, c);
    }
    c.n++;
    return c.n <= opts.initial || (c.n - opts.initial) % opts.thereafter === 0;
  };
}

class Refusal extends Error {
  constructor(
    readonly kind: "denied" | "failed",
    message: string,
    readonly fields: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

export function createNatsAuthCallout(opts: NatsAuthCalloutOptions) {
  const logger = opts.logger;
  const issuer = fromSeed(new TextEncoder().encode(opts.issuerSeed));
  const keep = sampler(opts.sampling ?? { initial: 100, thereafter: 100 });
  const log = (level: "info" | "warn" | "debug", fields: Record<string, unknown>, msg: string) => {
    if (keep(msg)) logger[level](fields, msg);
  };
  let nc: NatsConnection | undefined;
  let sub: Subscription | undefined;
  const inflight = new Set<Promise<void>>();

  async function askWebhook(p: WebhookPlugin, body: Record<string, string>): Promise<WebhookAnswer> {
    const retries = p.retries ?? 3;
    let last = "";
    for (let attempt = 0; attempt <= retries; attempt++) {
      if (attempt > 0) await sleep(100 * 2 ** (attempt - 1));
      log("debug", { url: p.url, account: body.account, attempt }, "webhook request");
      let res;
      try {
        res = await request(p.url, {
          method: "POST",
          headers: { authorization: `Bearer ${p.serviceToken}`, "content-type": "application/json" },
          body: JSON.stringify(body),
          headersTimeout: p.timeoutMs ?? 30_000,
          bodyTimeout: p.timeoutMs ?? 30_000,
        });
      } catch (err) {
        last = (err as Error).message;
        continue;
      }
      const text = await res.body.text();
      if (res.statusCode === 401 || res.statusCode === 403) {
        let detail = text.slice(0, 500);
        try {
          detail = (JSON.parse(text) as { detail?: string }).detail ?? detail;
        } catch {
          // not a problem document
        }
        throw new Refusal("denied", "Authentication denied", { status_code: res.statusCode, cause: detail });
      }
      if (res.statusCode >= 500) {
        last = `status ${res.statusCode}: ${text.slice(0, 200)}`;
        continue;
      }
      if (res.statusCode !== 200)
        throw new Refusal("denied", "Authentication denied", {
          status_code: res.statusCode,
          cause: text.slice(0, 500),
        });
      const a = JSON.parse(text) as Partial<WebhookAnswer>;
      if (typeof a.userId !== "string" || !a.userId || !a.permissions)
        throw new Refusal("failed", "Authentication failed", {
          cause: "the webhook answer carries no userId",
        });
      return a as WebhookAnswer;
    }
    throw new Refusal("failed", "Authentication failed", { cause: `webhook request failed: ${last}` });
  }

  async function authorize(
    req: AuthorizationRequest,
  ): Promise<{ jwt: string; account: string; user: string }> {
    const token = req.connect_opts.auth_token;
    const client = { host: req.client_info.host, name: req.client_info.name, cid: req.client_info.id };
    const nkey = req.connect_opts.nkey;
    if (nkey && !token) return nkeyLogin(req, nkey, client);
    if (!token)
      throw new Refusal("denied", "Authentication denied", {
        cause: "the client sent no credentials",
        client,
      });
    const env = parseWorkerAuthToken(token);
    if (!env)
      throw new Refusal("denied", "Authentication denied", {
        cause: "the token is not base64url JSON {account, pluginName, payload}",
        client,
      });
    const plugin = opts.plugins[env.account]?.[env.pluginName];
    if (!plugin)
      throw new Refusal(
        "denied",
        `Authentication denied: plugin ${env.pluginName} not found for account ${env.account}`,
        { client },
      );
    let a: WebhookAnswer;
    try {
      a = await askWebhook(plugin, {
        account: env.account,
        pluginName: env.pluginName,
        payload: env.payload,
      });
    } catch (err) {
      if (err instanceof Refusal) Object.assign(err.fields, { client, account: env.account });
      throw err;
    }
    if (a.account !== env.account)
      throw new Refusal("denied", "Authentication denied", {
        cause: `the webhook placed the user in account ${a.account}, not the one asked for (${env.account})`,
        client,
      });
    const p = a.permissions;
    const jwt = await encodeUser(
      a.userId,
      fromPublic(req.user_nkey),
      issuer,
      {
        pub: { allow: p.publish.allow, deny: p.publish.deny ?? [] },
        sub: { allow: p.subscribe.allow, deny: p.subscribe.deny ?? [] },
        ...(p.response ? { resp: { max: p.response.maxMsgs, ttl: 0 } } : {}),
      },
      { aud: a.account, ...(a.expiresAt ? { exp: a.expiresAt } : {}) },
    );
    return { jwt, account: a.account, user: a.userId };
  }

  /** The shared worker nkey: the signature over the server's nonce proves the seed; the key must be the current one. */
  async function nkeyLogin(
    req: AuthorizationRequest,
    nkey: string,
    client: Record<string, unknown>,
  ): Promise<{ jwt: string; account: string; user: string }> {
    const w = opts.nkeyWorker;
    const current = w?.publicKey();
    if (!w || nkey !== current)
      throw new Refusal("denied", "Authentication denied", {
        cause: `the client sent an nkey (${nkey}) that is neither a configured user nor the current worker key`,
        client,
      });
    const nonce = req.client_info.nonce;
    const sig = req.connect_opts.sig;
    let good = false;
    try {
      good =
        !!nonce &&
        !!sig &&
        fromPublic(nkey).verify(new TextEncoder().encode(nonce), Buffer.from(sig, "base64"));
    } catch {
      good = false;
    }
    if (!good)
      throw new Refusal("denied", "Authentication denied", {
        cause: "the worker key's signature over the server's nonce does not verify",
        client,
      });
    const p = nkeyWorkerPermissions(w.region);
    const user = nkeyWorkerUser(nkey);
    const jwt = await encodeUser(
      user,
      fromPublic(req.user_nkey),
      issuer,
      {
        pub: { allow: p.publish.allow, deny: p.publish.deny ?? [] },
        sub: { allow: p.subscribe.allow, deny: p.subscribe.deny ?? [] },
        resp: { max: 1, ttl: 0 },
      },
      { aud: NATS_ACCOUNTS.app },
    );
    return { jwt, account: NATS_ACCOUNTS.app, user };
  }

  async function handle(m: Msg): Promise<void> {
    let req: AuthorizationRequest;
    try {
      req = decode<AuthorizationRequest>(m.string()).nats as AuthorizationRequest;
    } catch (err) {
      log("warn", { cause: (err as Error).message }, "Authentication failed");
      return;
    }
    const user = fromPublic(req.user_nkey);
    const server = fromPublic(req.server_id.id);
    let answer: string;
    try {
      const ok = await authorize(req);
      answer = await encodeAuthorizationResponse(user, server, issuer, { jwt: ok.jwt }, {});
      log(
        "info",
        {
          account: ok.account,
          user: ok.user,
          client: { host: req.client_info.host, cid: req.client_info.id },
          // which node asked: in a cluster, logins on every node come to this one callout
          server: req.server_id.name,
        },
        "Authentication successful",
      );
    } catch (err) {
      const r =
        err instanceof Refusal
          ? err
          : new Refusal("failed", "Authentication failed", { cause: (err as Error).message });
      log("warn", r.fields, r.message);
      answer = await encodeAuthorizationResponse(user, server, issuer, { error: r.message }, {});
    }
    m.respond(answer);
  }

  return {
    async start(): Promise<void> {
      nc = await connectNats(opts.nats, "nats-auth-callout", logger);
      // a queue group: several callout replicas answer each request once between them
      sub = nc.subscribe("$SYS.REQ.USER.AUTH", {
        queue: "nats-auth-callout",
        callback: (err, m) => {
          if (err) return;
          const p = handle(m).catch((e: unknown) => logger.error({ err: e }, "auth callout failed"));
          inflight.add(p);
          void p.finally(() => inflight.delete(p));
        },
      });
      await nc.flush();
      logger.info(
        {
          plugins: Object.entries(opts.plugins).flatMap(([acc, ps]) =>
            Object.keys(ps).map((n) => `${acc}/${n}`),
          ),
        },
        "auth callout is answering",
      );
    },
    async close(): Promise<void> {
      sub?.unsubscribe();
      await Promise.all([...inflight]);
      await drainOrClose(nc);
    },
    destroy(): void {
      void nc?.close();
    },
  };
}
