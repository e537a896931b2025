// One authorization request on $SYS.REQ.USER.AUTH: decode it, decide, and answer with the user JWT
// or the refusal, signed with the issuer key; one (sampled) log line either way.
import { decode, encodeAuthorizationResponse, type AuthorizationRequest } from "@nats-io/jwt";
import { fromPublic } from "@nats-io/nkeys";
import type { Msg } from "@nats-io/transport-node";
import { authorize, type AuthorizeContext } from "./authorize.js";
import { Refusal } from "./refusal.js";

export async function handleAuthRequest(ctx: AuthorizeContext, m: Msg): Promise<void> {
  const { issuer, log } = ctx;
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
    const ok = await authorize(ctx, req);
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
