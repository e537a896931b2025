// Who may do what on NATS. Every connection authenticates and lands in a named account:
//   APP  the work queues, cancel and poll subjects, the replica registry; callplane's services and
//        the workers;
//   AUTH the auth callout service, alone;
//   SYS  the system account (system_account), with two users: the API's revoker, which closes the
//        connections of revoked workers (on whichever server of a cluster holds them) and reads the
//        servers' health for the console, and the monitor, which reads the servers' health (the
//        stack waiting for a cluster, `callplane nats status`) and may change nothing.
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
import { INBOX, pollBucket, REGISTRY_BUCKET, REGISTRY_BUCKETS, subjects } from "./subjects.js";

export const NATS_ACCOUNTS = { app: "APP", auth: "AUTH", sys: "SYS" } as const;
export type NatsAccount = (typeof NATS_ACCOUNTS)[keyof typeof NATS_ACCOUNTS];

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

/**
 * What no one but the replicas may do: create, change or write the buckets they own. The API may
 * read the registries (stream info, direct get: the console lists the live replicas), so the
 * stream's INFO is not in this list; its other verbs are.
 */
const replicaOwned = (region: string) =>
  [...Object.values(REGISTRY_BUCKETS), pollBucket(region)].flatMap((b) => [
    ...["CREATE", "UPDATE", "DELETE", "PURGE", "SNAPSHOT", "RESTORE", "LEADER.STEPDOWN"].map(
      (verb) => `$JS.API.STREAM.${verb}.KV_${b}`,
    ),
    `$JS.API.STREAM.MSG.DELETE.KV_${b}`,
    `$KV.${b}.>`,
  ]);

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
  /**
   * The control plane: creates each version's work-queue stream and consumer. For the operator
   * console it reads the replica registries and asks the invocation replicas what they hold
   * (callplane.console.>; their replies come to its inbox).
   */
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
          // the account's JetStream use and limits (the console's health page)
          "$JS.API.INFO",
          ...Object.values(REGISTRY_BUCKETS).map((b) => `$JS.API.DIRECT.GET.KV_${b}.>`),
          subjects.consoleAll,
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
   * server only). The console's health page reads through it what nats-monitor reads (each
   * server's health, routes and JetStream) and the auth callout's connections (PING.CONNZ).
   */
  "api-revoker": {
    account: NATS_ACCOUNTS.sys,
    permissions: () => ({
      publish: {
        allow: [
          "$SYS.REQ.SERVER.PING.CONNZ",
          "$SYS.REQ.SERVER.*.CONNZ",
          "$SYS.REQ.SERVER.*.KICK",
          "$SYS.REQ.SERVER.PING.HEALTHZ",
          "$SYS.REQ.SERVER.PING.ROUTEZ",
          "$SYS.REQ.SERVER.PING.JSZ",
        ],
      },
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
  /**
   * Invocation replicas: publish work, cancel, poll, purge a cancelled message; own the registry;
   * take the workers' small answers and the operator console's questions (and reply to each once).
   */
  invocation: {
    account: NATS_ACCOUNTS.app,
    permissions: ({ region }) => {
      const registry = kv(REGISTRY_BUCKET);
      const polls = kv(pollBucket(region));
      const grant = publisher("invocation", region, [
        ...registry.api,
        registry.write,
        ...polls.api,
        polls.write,
      ]);
      return {
        ...grant,
        subscribe: {
          allow: [
            ...grant.subscribe.allow,
            subjects.answerFilter,
            subjects.consoleInflight,
            subjects.consoleRequestFilter,
            subjects.consoleLogs,
          ],
        },
        allowResponses: true,
      };
    },
  },
  /**
   * gRPC proxy replicas: the same publishing side, their own registry (not the invocation
   * replicas'), and the session reconnect requests to workers (stateful_session.reconnect); the
   * console's logs question (and a reply to it).
   */
  "grpc-proxy": {
    account: NATS_ACCOUNTS.app,
    permissions: ({ region }) => {
      const registry = kv(REGISTRY_BUCKETS.grpcProxy);
      const grant = publisher("grpc-proxy", region, [
        ...registry.api,
        registry.write,
        "stateful_session.reconnect.*.*",
      ]);
      return {
        ...grant,
        subscribe: { allow: [...grant.subscribe.allow, subjects.consoleLogs] },
        allowResponses: true,
      };
    },
  },
  /**
   * The callback proxy's keeper: takes the console's logs question and answers it (once) with
   * HAProxy's access-log ring. It asks nothing, so it publishes nothing else and needs no inbox.
   */
  "callback-proxy": {
    account: NATS_ACCOUNTS.app,
    permissions: () => ({
      publish: { allow: [] },
      subscribe: { allow: [subjects.consoleLogs] },
      allowResponses: true,
    }),
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
 * and its own inbox; its small answers to the replicas (callplane.answer.*: a replica takes one
 * only with the token it minted for it). It creates nothing, purges nothing and answers a poll once.
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
        subjects.answerFilter,
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
      allow: [
        "$JS.API.CONSUMER.INFO.*.*",
        "$JS.API.CONSUMER.MSG.NEXT.*.*",
        "$JS.ACK.*.*.>",
        subjects.answerFilter,
      ],
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
