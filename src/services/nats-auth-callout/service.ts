// The NATS auth callout (nats-server 2.10+): every login that is not one of callplane's configured
// users arrives here as an authorization request on $SYS.REQ.USER.AUTH. A worker in token mode
// sends auth_token = base64url({account, pluginName, payload}) (contract §3.4); the plugin for
// (account, pluginName), in callplane only (APP, webhook) and only in token mode, asks the API's
// webhook, and the API's answer becomes a user JWT (the user, its account, its permissions, an
// expiry) that this service signs with the issuer key nats-server trusts. Everything else is refused.
// Plugins are read once, at start-up: a change of nats.workerAuth or of the webhook URL restarts this
// service (docs/operations.md).
//
// This is its lifecycle shell: one request is request.ts, the decision authorize.ts, the webhook
// client webhook.ts, the user JWT user-jwt.ts.
import { fromSeed } from "@nats-io/nkeys";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type { Logger } from "../../lib/log.js";
import { connectNats, drainOrClose, type NatsAccess } from "../../lib/nats/index.js";
import type { AuthorizeContext } from "./authorize.js";
import { sampledLog } from "./log-sampling.js";
import { handleAuthRequest } from "./request.js";
import type { WebhookPlugin } from "./webhook.js";

export { sampler } from "./log-sampling.js";
export type { WebhookPlugin } from "./webhook.js";

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

/** The running callout: its connection, its subscription, and the requests being answered. */
interface CalloutState {
  nc: NatsConnection | undefined;
  sub: Subscription | undefined;
  inflight: Set<Promise<void>>;
}

export function createNatsAuthCallout(opts: NatsAuthCalloutOptions) {
  const logger = opts.logger;
  const ctx: AuthorizeContext = {
    plugins: opts.plugins,
    nkeyWorker: opts.nkeyWorker,
    issuer: fromSeed(new TextEncoder().encode(opts.issuerSeed)),
    log: sampledLog(logger, opts.sampling),
  };
  const state: CalloutState = { nc: undefined, sub: undefined, inflight: new Set() };
  return {
    async start(): Promise<void> {
      const nc = await connectNats(opts.nats, "nats-auth-callout", logger);
      state.nc = nc;
      // a queue group: several callout replicas answer each request once between them
      state.sub = nc.subscribe("$SYS.REQ.USER.AUTH", {
        queue: "nats-auth-callout",
        callback: (err, m) => {
          if (err) return;
          track(state, handleAuthRequest(ctx, m), logger);
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
      state.sub?.unsubscribe();
      await Promise.all([...state.inflight]);
      await drainOrClose(state.nc);
    },
    destroy(): void {
      void state.nc?.close();
    },
  };
}

/** Keeps a request being answered until it is done, so that close() waits for it. */
function track(state: CalloutState, handling: Promise<void>, logger: Logger): void {
  const p = handling.catch((e: unknown) => logger.error({ err: e }, "auth callout failed"));
  state.inflight.add(p);
  void p.finally(() => state.inflight.delete(p));
}
