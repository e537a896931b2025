// The accounts and authorization part of nats-server's configuration, from the credentials folder.
import {
  NATS_ACCOUNTS,
  SERVICE_ROLES,
  type NatsAccount,
  type NatsRole,
  type NatsServiceRole,
  type Permissions,
} from "./permissions.js";
import { publicKeyOf, readCalloutIssuerSeed, readRoleSeed } from "./credentials.js";

// ---- the server side

function permissionsConf(p: Permissions): string {
  const list = (allow: string[], deny?: string[]) =>
    `{ allow: ${JSON.stringify(allow)}${deny?.length ? `, deny: ${JSON.stringify(deny)}` : ""} }`;
  return `{ publish: ${list(p.publish.allow, p.publish.deny)}, subscribe: ${list(p.subscribe.allow, p.subscribe.deny)}${p.allowResponses ? ", allow_responses: true" : ""} }`;
}

/**
 * The accounts and authorization part of nats-server's configuration: every user in a named
 * account, system_account set, and the auth callout for everyone who is not a configured user.
 */
export function natsServerAuthConfig(
  credentialsDir: string,
  /** The region the grants name (the region-specific bucket names). */
  region: string,
  /** More configured users of APP (tests add an observer); without permissions, a user may do anything. */
  extraAppUsers: Array<{ nkey: string; permissions?: Permissions }> = [],
): string {
  const users: Record<NatsAccount, string[]> = { APP: [], AUTH: [], SYS: [] };
  const bypass: string[] = [];
  for (const u of extraAppUsers) {
    users.APP.push(
      u.permissions
        ? `{ nkey: ${u.nkey}, permissions: ${permissionsConf(u.permissions)} }`
        : `{ nkey: ${u.nkey} }`,
    );
    bypass.push(u.nkey);
  }
  for (const [role, def] of Object.entries(SERVICE_ROLES) as Array<[NatsServiceRole, NatsRole]>) {
    const pub = publicKeyOf(readRoleSeed(credentialsDir, role));
    users[def.account].push(`{ nkey: ${pub}, permissions: ${permissionsConf(def.permissions({ region }))} }`);
    bypass.push(pub);
  }
  const issuer = publicKeyOf(readCalloutIssuerSeed(credentialsDir));
  const block = (name: NatsAccount, extra = "") =>
    [`  ${name} {${extra}`, "    users: [", ...users[name].map((u) => `      ${u}`), "    ]", "  }"].join(
      "\n",
    );
  return [
    "accounts {",
    block("APP", "\n    jetstream: enabled"),
    block("AUTH"),
    block("SYS"),
    "}",
    `system_account: ${NATS_ACCOUNTS.sys}`,
    "authorization {",
    "  # everyone who is not a configured user above goes to the auth callout",
    "  auth_callout {",
    `    issuer: ${issuer}`,
    `    account: ${NATS_ACCOUNTS.auth}`,
    `    auth_users: [ ${bypass.join(", ")} ]`,
    "  }",
    "}",
  ].join("\n");
}
