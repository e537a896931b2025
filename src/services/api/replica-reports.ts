// The operator console's view of the replicas, asked over the API's NATS connection (APP): what
// every invocation replica holds now (callplane.console.inflight, one reply per replica), how one
// request went (callplane.console.request.<holder>: the replica its id names), every service's
// recent log lines (callplane.console.logs, plane/console-logs.ts: the replicas' and the callback
// proxies' access logs), and which replicas are live (the registry buckets, read directly). The replicas' side is
// services/invocation/console-report.ts; the shapes are plane/console-wire.ts.
import type { Msg, NatsConnection } from "@nats-io/transport-node";
import { holderHex, holderOf } from "../../lib/ids.js";
import type { Logger } from "../../lib/log.js";
import type { CertificateInfo } from "../../lib/tls/index.js";
import { natsConnected, REGISTRY_BUCKETS, subjects } from "../../lib/nats/index.js";
import type { ConsoleLogsQuery, LogsReply } from "../../plane/console-logs.js";
import type { ConsoleInflightQuery, ReplicaReport, RequestLookup } from "../../plane/console-wire.js";

export type {
  ConsoleInflightQuery,
  FunctionStats,
  InFlightRow,
  ReplicaReport,
  RequestLookup,
  VersionHour,
} from "../../plane/console-wire.js";
export type { ConsoleLogsQuery, LogsReply } from "../../plane/console-logs.js";

export interface RegistryEntry {
  kind: "invocation" | "grpc-proxy";
  holder: string;
  relayUrl: string;
  startedAt: string;
  /** The certificates the replica serves with, as its entry names them (plane/registry.ts). */
  certificates: CertificateInfo[];
}

const REGISTRIES = [
  { kind: "invocation", bucket: REGISTRY_BUCKETS.invocation },
  { kind: "grpc-proxy", bucket: REGISTRY_BUCKETS.grpcProxy },
] as const;

/** How long the count of registered replicas (how many replies to wait for) is reused. */
const REGISTRY_COUNT_TTL_MS = 5000;
const LOOKUP_TIMEOUT_MS = 1000;
const REGISTRY_TIMEOUT_MS = 2000;

export class ReplicaReports {
  /** How many replicas the registry lists, by kind, and when it was read. */
  private expected: { invocation: number; all: number; at: number } | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly logger: Logger,
    /**
     * Callback proxies that answer the logs question besides the registered replicas (they are in
     * no registry); undefined when not known, and the logs question then spends its whole wait.
     */
    private readonly callbackProxies: number | undefined = 0,
  ) {}

  /**
   * Every replica that answers within `waitMs` (default 300). When the registry says how many
   * invocation replicas are live (every replica registers, relay or not), the wait ends as soon as
   * that many have answered (a replica not in the registry yet still answers, but may be missed).
   */
  async snapshot(
    opts: { limit?: number; functionId?: string; hour?: boolean; waitMs?: number } = {},
  ): Promise<ReplicaReport[]> {
    if (!natsConnected(this.nc)) return [];
    const waitMs = opts.waitMs ?? 300;
    const expected = await this.expectedReplicas("invocation");
    const query: ConsoleInflightQuery = {};
    if (opts.limit !== undefined) query.limit = opts.limit;
    if (opts.functionId !== undefined) query.functionId = opts.functionId;
    if (opts.hour === true) query.hour = true;
    const reports: ReplicaReport[] = [];
    try {
      const replies = await this.nc.requestMany(subjects.consoleInflight, JSON.stringify(query), {
        maxWait: waitMs,
        ...(expected > 0
          ? { strategy: "count" as const, maxMessages: expected }
          : { strategy: "timer" as const }),
      });
      for await (const m of replies) {
        const r = parse<ReplicaReport>(m);
        if (r?.kind === "invocation") reports.push(r);
      }
    } catch (err) {
      // no replica listens (none running): an empty plane, not an error
      if (!isNoResponders(err)) throw err;
    }
    return reports.sort((a, b) => (a.holder < b.holder ? -1 : a.holder > b.holder ? 1 : 0));
  }

  /** Asks the replica the id names; undefined when it does not answer (gone) or the id is not callplane's. */
  async lookup(requestId: string): Promise<RequestLookup | undefined> {
    const holder = holderOf(requestId.toLowerCase());
    if (holder === undefined || !natsConnected(this.nc)) return undefined;
    try {
      const m = await this.nc.request(subjects.consoleRequest(holderHex(holder)), requestId.toLowerCase(), {
        timeout: LOOKUP_TIMEOUT_MS,
      });
      return parse<RequestLookup>(m);
    } catch (err) {
      if (!isNoResponders(err) && !isTimeout(err))
        this.logger.warn(
          { requestId, err: (err as Error).message },
          "could not ask the replica about a request",
        );
      return undefined;
    }
  }

  /**
   * Recent log lines of every service that keeps them (invocation and grpc-proxy replicas, and the
   * callback proxies' access logs), filtered by the query, from those that answer within `waitMs`
   * (default 300). The wait ends early once every registered replica and as many callback proxies
   * as configured have answered.
   */
  async logs(query: ConsoleLogsQuery, waitMs = 300): Promise<LogsReply[]> {
    if (!natsConnected(this.nc)) return [];
    const replies: LogsReply[] = [];
    const registered = await this.expectedReplicas("all");
    const expected =
      registered > 0 && this.callbackProxies !== undefined ? registered + this.callbackProxies : 0;
    try {
      const answers = await this.nc.requestMany(subjects.consoleLogs, JSON.stringify(query), {
        maxWait: waitMs,
        ...(expected > 0
          ? { strategy: "count" as const, maxMessages: expected }
          : { strategy: "timer" as const }),
      });
      for await (const m of answers) {
        const r = parse<LogsReply>(m);
        if (r?.kind === "logs" && Array.isArray(r.lines)) replies.push(r);
      }
    } catch (err) {
      if (!isNoResponders(err)) throw err;
    }
    return replies;
  }

  /** The live replicas by the registry buckets (invocation and grpc-proxy); a missing bucket has none. */
  async registry(): Promise<RegistryEntry[]> {
    if (!natsConnected(this.nc)) return [];
    const lists = await Promise.all(REGISTRIES.map(({ kind, bucket }) => this.readRegistry(kind, bucket)));
    const all = lists.flat();
    this.expected = {
      invocation: all.filter((e) => e.kind === "invocation").length,
      all: all.length,
      at: Date.now(),
    };
    return all;
  }

  private async expectedReplicas(kind: "invocation" | "all"): Promise<number> {
    if (!this.expected || Date.now() - this.expected.at >= REGISTRY_COUNT_TTL_MS) {
      try {
        await this.registry();
      } catch (err) {
        this.logger.debug({ err: (err as Error).message }, "could not read the replica registry");
        this.expected = { invocation: 0, all: 0, at: Date.now() };
      }
    }
    return this.expected?.[kind] ?? 0;
  }

  /**
   * One bucket's live entries: its stream's subjects (one per key), then each key's last value by
   * direct get. A deleted key's last message is a delete marker (KV-Operation), skipped; an expired
   * one is gone from the stream.
   */
  private async readRegistry(kind: RegistryEntry["kind"], bucket: string): Promise<RegistryEntry[]> {
    const stream = `KV_${bucket}`;
    const prefix = `$KV.${bucket}.`;
    const info = await this.nc.request(
      `$JS.API.STREAM.INFO.${stream}`,
      JSON.stringify({ subjects_filter: `${prefix}>` }),
      { timeout: REGISTRY_TIMEOUT_MS },
    );
    const body = info.json<{
      error?: { code: number; description?: string };
      state?: { subjects?: Record<string, number> };
    }>();
    if (body.error) {
      if (body.error.code === 404) return [];
      throw new Error(`stream info ${stream}: ${body.error.description ?? body.error.code}`);
    }
    const keys = Object.keys(body.state?.subjects ?? {});
    const entries = await Promise.all(
      keys.map(async (subject): Promise<RegistryEntry | undefined> => {
        const m = await this.nc.request(`$JS.API.DIRECT.GET.${stream}.${subject}`, "", {
          timeout: REGISTRY_TIMEOUT_MS,
        });
        const status = m.headers?.code ?? 0;
        const op = m.headers?.get("KV-Operation");
        if (status >= 400 || m.data.length === 0 || op === "DEL" || op === "PURGE") return undefined;
        const e = parse<{ holder?: string; relayUrl?: string; startedAt?: string; certificates?: unknown }>(
          m,
        );
        if (!e || typeof e.holder !== "string") return undefined;
        return {
          kind,
          holder: e.holder,
          relayUrl: typeof e.relayUrl === "string" ? e.relayUrl : "",
          startedAt: typeof e.startedAt === "string" ? e.startedAt : "",
          certificates: certificatesOf(e.certificates),
        };
      }),
    );
    return entries.filter((e): e is RegistryEntry => e !== undefined);
  }
}

/** The well-formed certificate descriptions of an entry (an older replica's entry has none). */
function certificatesOf(v: unknown): CertificateInfo[] {
  if (!Array.isArray(v)) return [];
  return v.filter(
    (c): c is CertificateInfo =>
      c !== null &&
      typeof c === "object" &&
      ["name", "subject", "issuer", "notBefore", "notAfter"].every(
        (k) => typeof (c as Record<string, unknown>)[k] === "string",
      ),
  );
}

function parse<T>(m: Msg): T | undefined {
  try {
    return m.json<T>();
  } catch {
    return undefined;
  }
}

function isNoResponders(err: unknown): boolean {
  const e = err as Error | undefined;
  return (
    e?.name === "NoRespondersError" ||
    (e?.cause as Error | undefined)?.name === "NoRespondersError" ||
    /no responders/i.test(e?.message ?? "")
  );
}

function isTimeout(err: unknown): boolean {
  const e = err as Error | undefined;
  return e?.name === "TimeoutError" || /timeout/i.test(e?.message ?? "");
}
