// The decision on one login: a worker's token goes to its plugin's webhook (token mode), the shared
// worker nkey is checked against the current key and the server's nonce; everything else is
// refused. The answer is a user JWT, or a Refusal.
import type { AuthorizationRequest } from "@nats-io/jwt";
import { fromPublic, type KeyPair } from "@nats-io/nkeys";
import {
  NATS_ACCOUNTS,
  nkeyWorkerPermissions,
  nkeyWorkerUser,
  parseWorkerAuthToken,
} from "../../lib/nats/index.js";
import type { SampledLog } from "./log-sampling.js";
import { Refusal } from "./refusal.js";
import { issueUserJwt } from "./user-jwt.js";
import { askWebhook, type WebhookAnswer, type WebhookPlugin } from "./webhook.js";

/** What the decision depends on, fixed at start-up. */
export interface AuthorizeContext {
  /** Plugins by account, then plugin name. */
  plugins: Record<string, Record<string, WebhookPlugin>>;
  /** The shared worker nkey's current public key (read when asked) and the grants of its region. */
  nkeyWorker: { publicKey: () => string; region: string } | undefined;
  /** The key the user JWTs are signed with. */
  issuer: KeyPair;
  log: SampledLog;
}

export interface Admitted {
  jwt: string;
  account: string;
  user: string;
}

export async function authorize(ctx: AuthorizeContext, req: AuthorizationRequest): Promise<Admitted> {
  const token = req.connect_opts.auth_token;
  const client = { host: req.client_info.host, name: req.client_info.name, cid: req.client_info.id };
  const nkey = req.connect_opts.nkey;
  if (nkey && !token) return nkeyLogin(ctx, req, nkey, client);
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
  // own properties only: an account of "__proto__" or a plugin named "toString" is not one
  const plugins = Object.hasOwn(ctx.plugins, env.account) ? ctx.plugins[env.account] : undefined;
  const plugin = plugins && Object.hasOwn(plugins, env.pluginName) ? plugins[env.pluginName] : undefined;
  if (!plugin)
    throw new Refusal(
      "denied",
      `Authentication denied: plugin ${env.pluginName} not found for account ${env.account}`,
      { client },
    );
  let a: WebhookAnswer;
  try {
    a = await askWebhook(
      plugin,
      {
        account: env.account,
        pluginName: env.pluginName,
        payload: env.payload,
      },
      ctx.log,
    );
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
  const jwt = await issueUserJwt(ctx.issuer, {
    name: a.userId,
    userNkey: req.user_nkey,
    grants: p,
    ...(p.response ? { response: p.response } : {}),
    account: a.account,
    ...(a.expiresAt ? { expiresAt: a.expiresAt } : {}),
  });
  return { jwt, account: a.account, user: a.userId };
}

/** The shared worker nkey: the signature over the server's nonce proves the seed; the key must be the current one. */
export async function nkeyLogin(
  ctx: AuthorizeContext,
  req: AuthorizationRequest,
  nkey: string,
  client: Record<string, unknown>,
): Promise<Admitted> {
  const w = ctx.nkeyWorker;
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
  const user = nkeyWorkerUser(nkey);
  const jwt = await issueUserJwt(ctx.issuer, {
    name: user,
    userNkey: req.user_nkey,
    grants: nkeyWorkerPermissions(w.region),
    response: { maxMsgs: 1 },
    account: NATS_ACCOUNTS.app,
  });
  return { jwt, account: NATS_ACCOUNTS.app, user };
}
