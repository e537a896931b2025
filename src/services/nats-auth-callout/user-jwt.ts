// Issuing the user JWT that admits a login: the user, bound to the nkey the server made for this
// connection, with its permissions, signed with the issuer key nats-server's auth_callout trusts.
import { encodeUser } from "@nats-io/jwt";
import { fromPublic, type KeyPair } from "@nats-io/nkeys";

/** Publish and subscribe grants, as the webhook and the nkey worker's permissions give them. */
export interface UserGrants {
  publish: { allow: string[]; deny?: string[] };
  subscribe: { allow: string[]; deny?: string[] };
}

export function issueUserJwt(
  issuer: KeyPair,
  u: {
    /** The user's name in the JWT. */
    name: string;
    /** The request's user_nkey: the key the server made for this connection. */
    userNkey: string;
    grants: UserGrants;
    /** How many responses the user may publish to a request it got (none: no response grant). */
    response?: { maxMsgs: number };
    account: string;
    /** Unix seconds; none: it does not expire. */
    expiresAt?: number;
  },
): Promise<string> {
  const p = u.grants;
  return encodeUser(
    u.name,
    fromPublic(u.userNkey),
    issuer,
    {
      pub: { allow: p.publish.allow, deny: p.publish.deny ?? [] },
      sub: { allow: p.subscribe.allow, deny: p.subscribe.deny ?? [] },
      ...(u.response ? { resp: { max: u.response.maxMsgs, ttl: 0 } } : {}),
    },
    { aud: u.account, ...(u.expiresAt ? { exp: u.expiresAt } : {}) },
  );
}
