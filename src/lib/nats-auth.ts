// Who may do what on NATS. Every connection authenticates and lands in a named account:
//   APP  the work queues, cancel and poll subjects, the replica registry; callplane's services and
//        the workers;
//   AUTH the auth callout service, alone;
//   SYS  the system account (system_account), with two users: the API's revoker, which closes the
//        connections of revoked workers (on whichever server of a cluster holds them), and the
//        monitor, which reads the servers' health (the stack waiting for a cluster, `callplane nats
//        status`) and may change nothing.
// No user sits outside an account and nothing is anonymous (the config shape CVE-2023-47090 asks
// for: no top-level `authorization { users }` beside the accounts, `system_account` set, never
// `no_auth_user`). callplane's services are configured users that skip the auth callout; every other
// login goes to the callout: the shared worker nkey (checked against the key file, so rotating it
// needs no change to nats-server's configuration, whose auth_callout block cannot be reloaded), a
// worker's own token (checked by the API), or a stranger (refused).
//
// A service's grant is one row of SERVICE_ROLES: adding a service is adding a row (and passing
// natsAccess(config, "<row>") to its factory). Each service replies on its own inbox prefix, so no
// one ever needs `_INBOX.>`.
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createAccount, createUser, fromSeed } from "@nats-io/nkeys";
import { writeFileAtomic } from "./auth.js";
import { subjects } from "./queue.js";

export const NATS_ACCOUNTS = { app: "APP", auth: "AUTH", sys: "SYS" } as const;
export type NatsAccount = (typeof NATS_ACCOUNTS)[keyof typeof NATS_ACCOUNTS];

/** The registries of live replicas, one per kind: each kind alone may write its own. */
export const REGISTRY_BUCKETS = {
  invocation: "callplane_replicas",
  grpcProxy: "callplane_grpc_replicas",
} as const;
export const REGISTRY_BUCKET = REGISTRY_BUCKETS.invocation;
export const pollBucket = (region: string) => `requestToFunctionVersion_${region}`;

/** The inbox prefix each kind of client uses; its grant covers that prefix and nothing else. */
export const INBOX = {
  service: (role: string) => `_INBOX_${role.replaceAll("-", "_")}`,
  /** Workers that share the worker nkey (one identity for all of them). */
  nkeyWorker: (instanceId: string) => `_INBOX_WK.${instanceId}`,
  /** A worker with its own identity: the prefix is bound to the instance its token names. */
  tokenWorker: (instanceId: string) => `_INBOX_WT.${instanceId}`,
} as const;

export interface Permissions {
  publish: { allow: string[]; deny?: string[] };
  subscribe: { allow: string[]; deny?: string[] };
  /** Lets the user answer a request it received (once), without a publish grant on the inbox. */
  allowResponses?: boolean;
}

export interface NatsRole {
  account: NatsAccount;
  permissions: (ctx: { region: string }) => Permissions;
}

const kv = (bucket: string) => ({
  api: [
    `$JS.API.STREAM.INFO.KV_${bucket}`,
    `$JS.API.STREAM.CREATE.KV_${bucket}`,
    `$JS.API.DIRECT.GET.KV_${bucket}.>`,
  ],
  write: `$KV.${bucket}.>`,
});

/** What no one but the replicas may do: create or write the buckets they own. */
const replicaOwned = (region: string) => [
  ...Object.values(REGISTRY_BUCKETS).flatMap((b) => [`$JS.API.STREAM.*.KV_${b}`, `$KV.${b}.>`]),
  `$JS.API.STREAM.*.KV_${pollBucket(region)}`,
  `$KV.${pollBucket(region)}.>`,
];

/**
 * The work-queue publishing side (invocation, grpc-proxy): work, cancels, polls, removal of one
 * cancelled message (by sequence, or a purge filtered on its subject).
 */
const publisher = (role: string, region: string, extra: string[] = []): Permissions => ({
  publish: {
    allow: [
      `rq.${region}.*.*`,
      "nvcf.cancel.*",
      "rq_polling.*.*",
      "$JS.API.INFO",
      "$JS.API.STREAM.PURGE.*",
      "$JS.API.STREAM.MSG.DELETE.*",
      ...extra,
    ],
    deny: [
      ...[...Object.values(REGISTRY_BUCKETS), pollBucket(region)].flatMap((b) => [
        `$JS.API.STREAM.PURGE.KV_${b}`,
        `$JS.API.STREAM.MSG.DELETE.KV_${b}`,
      ]),
    ],
  },
  subscribe: { allow: [`${INBOX.service(role)}.>`] },
});

export const SERVICE_ROLES = {
  /** The control plane: creates each version's work-queue stream and consumer; nothing else. */
  api: {
    account: NATS_ACCOUNTS.app,
    permissions: ({ region }) => ({
      publish: {
        allow: [
          "$JS.API.STREAM.INFO.*",
          "$JS.API.STREAM.CREATE.*",
          "$JS.API.CONSUMER.INFO.*.*",
          "$JS.API.CONSUMER.CREATE.*.>",
          "$JS.API.CONSUMER.DURABLE.CREATE.*.*",
        ],
        deny: replicaOwned(region),
      },
      subscribe: { allow: [`${INBOX.service("api")}.>`] },
    }),
  },
  /**
   * The API's second connection, in SYS: finds and closes the connections of revoked workers. It
   * asks every server (PING.CONNZ), reads further pages of one server's list (<id>.CONNZ) and closes
   * a connection on the server that holds it (<id>.KICK: a connection id means something on one
   * server only).
   */
  "api-revoker": {
    account: NATS_ACCOUNTS.sys,
    permissions: () => ({
      publish: { allow: ["$SYS.REQ.SERVER.PING.CONNZ", "$SYS.REQ.SERVER.*.CONNZ", "$SYS.REQ.SERVER.*.KICK"] },
      subscribe: { allow: [`${INBOX.service("api-revoker")}.>`] },
    }),
  },
  /**
   * Reads health from every server, in SYS: whether each is up and its JetStream ready, its routes,
   * the JetStream cluster's leader and peers. Read-only: no KICK, no account or JetStream API.
   */
  "nats-monitor": {
    account: NATS_ACCOUNTS.sys,
    permissions: () => ({
      publish: {
        allow: ["$SYS.REQ.SERVER.PING.HEALTHZ", "$SYS.REQ.SERVER.PING.ROUTEZ", "$SYS.REQ.SERVER.PING.JSZ"],
      },
      subscribe: { allow: [`${INBOX.service("nats-monitor")}.>`] },
    }),
  },
  /** Invocation replicas: publish work, cancel, poll, purge a cancelled message; own the registry. */
  invocation: {
    account: NATS_ACCOUNTS.app,
    permissions: ({ region }) => {
      const registry = kv(REGISTRY_BUCKET);
      const polls = kv(pollBucket(region));
      return publisher("invocation", region, [...registry.api, registry.write, ...polls.api, polls.write]);
    },
  },
  /**
   * gRPC proxy replicas: the same publishing side, their own registry (not the invocation
   * replicas'), and the session reconnect requests to workers (stateful_session.reconnect).
   */
  "grpc-proxy": {
    account: NATS_ACCOUNTS.app,
    permissions: ({ region }) => {
      const registry = kv(REGISTRY_BUCKETS.grpcProxy);
      return publisher("grpc-proxy", region, [
        ...registry.api,
        registry.write,
        "stateful_session.reconnect.*.*",
      ]);
    },
  },
  /** The auth callout: receives the server's authorization requests and answers them. */
  "nats-auth-callout": {
    account: NATS_ACCOUNTS.auth,
    permissions: () => ({
      publish: { allow: [] },
      subscribe: { allow: ["$SYS.REQ.USER.AUTH"] },
      allowResponses: true,
    }),
  },
} as const satisfies Record<string, NatsRole>;
export type NatsServiceRole = keyof typeof SERVICE_ROLES;

/**
 * A worker with its own identity (token mode): its version's consumer, cancel and poll subjects,
 * and its own inbox. It creates nothing, purges nothing and answers a poll once.
 */
export function tokenWorkerPermissions(region: string, fvid: string, instanceId: string): Permissions {
  const stream = subjects.stream(region, fvid);
  const consumer = subjects.consumer(region, fvid);
  return {
    publish: {
      allow: [
        `$JS.API.CONSUMER.INFO.${stream}.${consumer}`,
        `$JS.API.CONSUMER.MSG.NEXT.${stream}.${consumer}`,
        `$JS.ACK.${stream}.${consumer}.>`,
      ],
    },
    subscribe: {
      allow: [
        `${INBOX.tokenWorker(instanceId)}.>`,
        subjects.cancel(fvid),
        subjects.pollingFilter(fvid),
        subjects.reconnectFilter(fvid),
      ],
    },
    allowResponses: true,
  };
}

/**
 * Workers that share the worker nkey (nkey mode): the same kinds of subjects, for every version,
 * since one key cannot tell versions apart. No JetStream admin, no registry, no service inboxes.
 */
export function nkeyWorkerPermissions(region: string): Permissions {
  return {
    publish: {
      allow: ["$JS.API.CONSUMER.INFO.*.*", "$JS.API.CONSUMER.MSG.NEXT.*.*", "$JS.ACK.*.*.>"],
      deny: [...Object.values(REGISTRY_BUCKETS), pollBucket(region)].flatMap((b) => [
        `$JS.API.CONSUMER.INFO.KV_${b}.*`,
        `$JS.API.CONSUMER.MSG.NEXT.KV_${b}.*`,
        `$JS.ACK.KV_${b}.>`,
      ]),
    },
    subscribe: {
      allow: ["_INBOX_WK.>", "nvcf.cancel.*", "rq_polling.*.*", "stateful_session.reconnect.*.*"],
    },
    allowResponses: true,
  };
}

// ---- keys

/** The nkey files a stack keeps in nats.credentialsDir: one per service role, the worker's, the callout's issuer. */
export const KEY_FILES = {
  role: (dir: string, role: NatsServiceRole) => join(dir, `${role}.nk`),
  worker: (dir: string) => join(dir, "worker.nk"),
  calloutIssuer: (dir: string) => join(dir, "auth-callout-issuer.nk"),
  /** The password a NATS cluster's routes authenticate with (a cluster only). */
  routePassword: (dir: string) => join(dir, "cluster-route.pass"),
} as const;

/** The user a NATS cluster's routes authenticate as (with the password in KEY_FILES.routePassword). */
export const ROUTE_USER = "callplane-route";

function readSeed(file: string): string {
  return readFileSync(file, "utf8").trim();
}

export function publicKeyOf(seed: string): string {
  return fromSeed(new TextEncoder().encode(seed)).getPublicKey();
}

function ensureKey(file: string, create: () => { getSeed(): Uint8Array }): boolean {
  if (existsSync(file)) return false;
  writeFileAtomic(file, `${new TextDecoder().decode(create().getSeed())}\n`, 0o600);
  return true;
}

/** Creates whatever key is missing; returns the files it created. */
export function ensureNatsKeys(dir: string): string[] {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const created: string[] = [];
  for (const role of Object.keys(SERVICE_ROLES) as NatsServiceRole[]) {
    const f = KEY_FILES.role(dir, role);
    if (ensureKey(f, createUser)) created.push(f);
  }
  if (ensureKey(KEY_FILES.worker(dir), createUser)) created.push(KEY_FILES.worker(dir));
  if (ensureKey(KEY_FILES.calloutIssuer(dir), createAccount)) created.push(KEY_FILES.calloutIssuer(dir));
  return created;
}

/** The NATS user of workers that log in with the shared worker nkey: named after the key. */
export const nkeyWorkerUser = (publicKey: string) => `worker-nkey.${publicKey.slice(0, 12)}`;

/** Replaces the shared worker nkey (after a switch to token mode, or when it may have leaked). */
export function rotateWorkerKey(dir: string): { publicKey: string } {
  const seed = new TextDecoder().decode(createUser().getSeed());
  writeFileAtomic(KEY_FILES.worker(dir), `${seed}\n`, 0o600);
  return { publicKey: publicKeyOf(seed) };
}

/**
 * The route credentials of a NATS cluster, created (0600, in the 0700 credentials folder) when
 * missing. Every node's configuration holds them: the node checks the routes that come in, and
 * presents them on the routes it opens.
 */
export function ensureRouteCredentials(dir: string): { user: string; password: string; created: boolean } {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const file = KEY_FILES.routePassword(dir);
  let created = false;
  if (!existsSync(file)) {
    writeFileAtomic(file, `${randomBytes(32).toString("base64url")}\n`, 0o600);
    created = true;
  }
  const password = readSeed(file);
  if (!/^[A-Za-z0-9_-]{16,}$/.test(password))
    throw new Error(
      `the NATS route password in ${file} must be at least 16 letters, digits, dashes or underscores; delete the file to have a new one generated (then restart every node)`,
    );
  return { user: ROUTE_USER, password, created };
}

export function readRoleSeed(dir: string, role: NatsServiceRole): string {
  const file = KEY_FILES.role(dir, role);
  try {
    return readSeed(file);
  } catch (err) {
    throw new Error(
      `cannot read the NATS key of ${role} at ${file}: ${(err as Error).message}; the stack creates it on start, or copy it from nats.credentialsDir`,
      { cause: err },
    );
  }
}

export function readWorkerSeed(dir: string): string {
  return readSeed(KEY_FILES.worker(dir));
}

export function readCalloutIssuerSeed(dir: string): string {
  return readSeed(KEY_FILES.calloutIssuer(dir));
}

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

// ---- what a client needs to connect

/** Everything a NATS client of callplane needs: where, how it proves itself, what CA it trusts. */
export interface NatsAccess {
  url: string;
  /** PEM of the CA that issued the server's certificate. */
  caPem: string;
  /** An nkey seed (services, nkey-mode workers) or a token read anew at every (re)connect. */
  auth: { nkeySeed: string } | { token: () => string };
  inboxPrefix: string;
}

/** The NatsAccess of one of callplane's services, as a main.ts builds it from the configuration. */
export function natsAccess(
  config: { nats: { url: string; tls: { caFile: string }; credentialsDir: string } },
  role: NatsServiceRole,
): NatsAccess {
  return serviceNatsAccess({
    url: config.nats.url,
    caFile: config.nats.tls.caFile,
    credentialsDir: config.nats.credentialsDir,
    role,
  });
}

/** The NatsAccess of one of callplane's services, from its key file and the stack CA. */
export function serviceNatsAccess(opts: {
  url: string;
  caFile: string;
  credentialsDir: string;
  role: NatsServiceRole;
}): NatsAccess {
  let caPem: string;
  try {
    caPem = readFileSync(opts.caFile, "utf8");
  } catch (err) {
    throw new Error(
      `cannot read the CA of the NATS server's certificate at ${opts.caFile} (nats.tls.caFile): ${(err as Error).message}`,
      { cause: err },
    );
  }
  return {
    url: opts.url,
    caPem,
    auth: { nkeySeed: readRoleSeed(opts.credentialsDir, opts.role) },
    inboxPrefix: INBOX.service(opts.role),
  };
}

/** The token a worker presents in token mode: base64url JSON {account, pluginName, payload} (contract §3.4). */
export function workerAuthToken(account: string, payload: string, pluginName = "webhook"): string {
  return Buffer.from(JSON.stringify({ account, pluginName, payload })).toString("base64url");
}

export function parseWorkerAuthToken(
  token: string,
): { account: string; pluginName: string; payload: string } | undefined {
  try {
    const j = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as Record<string, unknown>;
    if (typeof j.account === "string" && typeof j.pluginName === "string" && typeof j.payload === "string")
      return { account: j.account, pluginName: j.pluginName, payload: j.payload };
  } catch {
    // not ours
  }
  return undefined;
}
