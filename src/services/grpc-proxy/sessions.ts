// The session table (contract §4.1): which session a call belongs to. A client's HTTP/2 connection
// and function routing (function-id, function-version-id metadata) make a session: the first call
// puts one work message on the version's queue, carrying a single-use CONNECT token (30 s) and the
// address of this replica's tunnel listener. A call that names a session (nvcf-reqid metadata, or
// the session cookie) joins the one held here, or asks the worker that serves it to open one more
// tunnel, to this replica. The worker's tunnel claims its session by the token (tunnels.ts).
// Resuming is for the session's account only: a key of another account gets the very answer an
// unknown id gets (SESSION_NOT_FOUND), here and from the worker (which checks the work message's
// ncaId against its session's), so a request id tells it nothing.
import { create, toBinary } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { RequestError } from "@nats-io/transport-node";
import type { Http2Session, IncomingHttpHeaders } from "node:http2";
import { WorkerInvokeFunctionRequestSchema } from "../../gen/nvcf/worker_pb.js";
import { CallplaneError, toCallplaneError } from "../../lib/errors.js";
import { isUuid, newRequestId } from "../../lib/ids.js";
import type { Logger } from "../../lib/log.js";
import { subjects } from "../../lib/nats/index.js";
import type { Grant } from "../../plane/auth-cache.js";
import { PendingTable } from "../../plane/pending.js";
import { TokenTable } from "../../plane/tokens.js";
import { cookieValue, first } from "./metadata.js";
import type { GrpcProxyMetrics } from "./metrics.js";
import type { KeyInFlight } from "../../plane/key-limit.js";
import { Session } from "./session.js";
import type { ProxyState } from "./state.js";
import type { TraceSpan } from "../../lib/tracing/index.js";
import { NVCF_HEADERS } from "../../lib/contract.js";

export const SESSION_COOKIE = "nvcf-request-id";

/** The session a call names: its nvcf-reqid metadata, else the session cookie; undefined for none. */
export function resumeIdOf(headers: IncomingHttpHeaders): string | undefined {
  return first(headers[NVCF_HEADERS.reqId]) ?? cookieValue(headers.cookie, SESSION_COOKIE);
}

/** The cookie the first answer of a session carries, so that a client that keeps cookies resumes it. */
export function sessionCookie(requestId: string): string {
  return `${SESSION_COOKIE}=${requestId}; Path=/; HttpOnly`;
}

/** Sent with SESSION_NOT_FOUND: the client forgets the session it named. */
export const CLEAR_SESSION_COOKIE = `${SESSION_COOKIE}=; Path=/; Max-Age=0`;

export interface SessionTableDeps {
  state: ProxyState;
  logger: Logger;
  holderId: number;
  region: string;
  /** A session with no call in flight this long closes. */
  idleMs: number;
  /** How long a CONNECT token is valid, and so how long a session waits for its worker. */
  tokenTtlMs: number;
  metrics: Pick<GrpcProxyMetrics, "openSessions" | "waitingSessions">;
  /** Each key's sessions held here (grpcproxy.maxInFlightPerKey). */
  budget: KeyInFlight;
}

export class SessionTable {
  private readonly tokens: TokenTable<Session>;
  /** Sessions whose worker has not opened its tunnel yet (each until the token expires). */
  private readonly waiting: PendingTable<Session>;
  private readonly sessions = new Map<string, Session>();
  /** Per client connection, its sessions by routing (`<function-id>|<pinned version or "">`). */
  private readonly byConnection = new WeakMap<Http2Session, Map<string, Session>>();
  /** Gives back the key's share of the session budget when the session ends. */
  private readonly releases = new WeakMap<Session, () => void>();

  constructor(private readonly deps: SessionTableDeps) {
    this.tokens = new TokenTable<Session>(deps.holderId, deps.tokenTtlMs);
    this.waiting = new PendingTable<Session>(deps.metrics.waitingSessions);
  }

  get tokenTtlMs(): number {
    return this.deps.tokenTtlMs;
  }

  /**
   * The session a call on this connection with this routing belongs to, started if need be (its
   * publish is a span under `span`, the call that started it).
   */
  sessionFor(
    conn: Http2Session,
    grant: Grant,
    functionId: string,
    pinned: string | undefined,
    span?: TraceSpan,
  ): Session {
    let routes = this.byConnection.get(conn);
    if (!routes) {
      routes = new Map();
      this.byConnection.set(conn, routes);
    }
    // keyed by the caller's account too: a connection that carries calls of several accounts (a
    // gateway pooling its upstream connections) never puts one account's call in another's session
    const route = routeKey(grant, functionId, pinned);
    const known = routes.get(route);
    if (known && known.state !== "closed" && known.owner === grant.clientNcaId) return known;
    const versions = grant.functionVersions;
    const version =
      versions.length === 1 ? versions[0] : versions[Math.floor(Math.random() * versions.length)];
    const s = this.newSession(newRequestId(this.deps.holderId), functionId, version.functionVersionId, grant);
    routes.set(route, s);
    this.deps.state
      .publisher!.publish(
        version.functionVersionId,
        s.requestId,
        this.workMessage(s, s.token!, grant),
        span?.identify(s.requestId, functionId, version.functionVersionId),
      )
      .then(
        (seq) => {
          s.seq = seq;
          this.deps.logger.debug({ requestId: s.requestId, functionId, seq }, "session queued");
        },
        (err: unknown) => s.end(toCallplaneError(err), "publish failed"),
      );
    return s;
  }

  /** A call that names a session (nvcf-reqid): the one held here, or the worker asked for a tunnel here. */
  async resume(
    conn: Http2Session,
    requestId: string,
    grant: Grant,
    functionId: string,
    pinned: string | undefined,
  ): Promise<Session> {
    const notFound = (why: string) =>
      new CallplaneError(
        "SESSION_NOT_FOUND",
        `no existing session found: ${why}; call without nvcf-reqid to start a new one`,
      );
    if (!isUuid(requestId))
      throw notFound(`nvcf-reqid ${JSON.stringify(requestId.slice(0, 60))} is not a request id`);
    // what an id nobody holds gets, and so what a key of another account gets, word for word
    const unknown = notFound(`no worker holds session ${requestId} any more`);
    const held = this.sessions.get(requestId);
    const fits = (s: Session) =>
      s.functionId === functionId && (pinned === undefined || s.functionVersionId === pinned);
    if (held && held.state !== "closed") {
      if (held.owner !== grant.clientNcaId) throw unknown;
      if (!fits(held)) throw notFound(`session ${requestId} belongs to another function`);
      this.byConnection.get(conn)?.set(routeKey(grant, functionId, pinned), held);
      return held;
    }
    // Held by another replica, or by this one before its tunnel closed: the worker that serves it
    // (if any) opens one more tunnel, to this replica. The reconnect subject names the version
    // (workers may hear only their own), so each version the key may call is asked in turn.
    const versions = pinned ? [pinned] : grant.functionVersions.map((v) => v.functionVersionId);
    let s: Session | undefined;
    let failure: CallplaneError = unknown;
    for (const version of versions) {
      const candidate = this.newSession(requestId, functionId, version, grant);
      candidate.resumed = true;
      try {
        const reply = await this.deps.state.nc!.request(
          subjects.reconnect(version, requestId),
          this.workMessage(candidate, candidate.token!, grant),
          { timeout: 3000 },
        );
        const refusal = reply.string();
        if (refusal) {
          // the worker's reason (another account, another function) is logged, never sent
          this.deps.logger.info({ requestId, functionId, version, refusal }, "worker refused a resumption");
          throw unknown;
        }
        s = candidate;
        break;
      } catch (err) {
        const noOne = err instanceof RequestError && err.isNoResponders();
        if (!noOne)
          failure =
            err instanceof CallplaneError
              ? err
              : new CallplaneError(
                  "UNAVAILABLE",
                  `asking the worker of session ${requestId} to reconnect failed; retry`,
                  { cause: err },
                );
        candidate.end(failure, "reconnect refused");
        if (!noOne) break;
      }
    }
    if (!s) throw failure;
    this.byConnection.get(conn)?.set(routeKey(grant, functionId, pinned), s);
    return s;
  }

  /** The waiting session a worker's CONNECT token is for (the token is used up), if it fits. */
  claim(token: string, requestId: string): Session | undefined {
    return this.tokens.take(token, (s) => s.requestId === requestId && s.state === "waiting");
  }

  /** Whether this replica minted `token` (so no other replica can hold its session). */
  isOwnToken(token: string): boolean {
    return this.tokens.isOwn(token);
  }

  /** The worker's tunnel for `s` is up: it no longer waits. */
  opened(s: Session): void {
    s.token = undefined;
    this.waiting.release(s);
    this.deps.metrics.openSessions.inc();
  }

  /** Ends every session (a stop); `destroyTunnels` cuts their tunnels instead of closing them. */
  endAll(err: CallplaneError, why: string, destroyTunnels = false): void {
    for (const s of [...this.sessions.values()]) {
      s.end(err, why);
      if (destroyTunnels) s.tunnel?.destroy();
    }
  }

  close(): void {
    this.tokens.close();
  }

  private newSession(
    requestId: string,
    functionId: string,
    functionVersionId: string,
    grant: Pick<Grant, "clientNcaId" | "keyId">,
  ): Session {
    const { tokenTtlMs } = this.deps;
    const release = this.deps.budget.acquire(grant.keyId).release;
    const s = new Session(
      requestId,
      functionId,
      functionVersionId,
      grant.clientNcaId,
      this.deps.idleMs,
      (ended, why) => this.ended(ended, why),
    );
    this.releases.set(s, release);
    s.token = this.tokens.mint(s);
    this.sessions.set(requestId, s);
    this.waiting.add(s, tokenTtlMs, () =>
      s.end(
        new CallplaneError(
          "WORKER_LINK_TIMEOUT",
          `failed to establish link to worker: no worker of function ${functionId} (version ${functionVersionId}) connected within ${Math.round(tokenTtlMs / 1000)} s; check that the function is deployed and its instances are ACTIVE (callplane deploy get)`,
        ),
        "no worker in time",
      ),
    );
    return s;
  }

  /** A session has ended (Session.end): its token, its place in the table and any queued work go. */
  private ended(s: Session, why: string): void {
    this.releases.get(s)?.();
    this.tokens.delete(s.token);
    if (this.waiting.release(s)) {
      // never reached by a worker: take the work back (a resumption queued none)
      if (!s.resumed && !this.deps.state.destroyed)
        this.deps.state.publisher?.cancel(s.functionVersionId, s.requestId, why, s.seq);
    } else this.deps.metrics.openSessions.dec();
    if (this.sessions.get(s.requestId) === s) this.sessions.delete(s.requestId);
    this.deps.logger.info({ requestId: s.requestId, functionId: s.functionId, why }, "session ended");
  }

  private workMessage(s: Session, token: string, grant: Pick<Grant, "clientNcaId" | "subject">): Uint8Array {
    return toBinary(
      WorkerInvokeFunctionRequestSchema,
      create(WorkerInvokeFunctionRequestSchema, {
        requestId: s.requestId,
        ncaId: grant.clientNcaId,
        subject: grant.subject,
        requestTime: timestampFromMs(Date.now()),
        // the worker checks a reconnect against the function it serves
        requestHeaders: [
          { key: "function-id", value: s.functionId },
          { key: "function-version-id", value: s.functionVersionId },
        ],
        statefulConfig: {
          nvcfRegionOfInvoker: this.deps.region,
          connectionConfigs: [
            {
              config: {
                case: "http1Config",
                value: { proxyURI: this.deps.state.connectUri, proxyAuthorizationToken: token },
              },
            },
          ],
        },
      }),
    );
  }
}

/** Where a connection keeps its session for a caller's account and a routing. */
function routeKey(grant: Grant, functionId: string, pinned: string | undefined): string {
  return `${grant.clientNcaId}|${functionId}|${pinned ?? ""}`;
}
