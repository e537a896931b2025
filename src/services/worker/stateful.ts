// A gRPC session on the worker side (contract §4.3): open the tunnel the work message names, serve
// HTTP/2 over it (the roles invert: the proxy is the client) and pass each call to the inference
// server's gRPC port, streaming both ways with resets and trailers intact. More tunnels may join
// the same session (a client resuming it through another replica asks over NATS). The session
// ends when no tunnel is left and none came back within the reconnect wait, when it is cancelled,
// or when the first tunnel cannot be opened; the agent keeps its queue message alive until then
// and acks it after.
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import {
  connect as h2connect,
  performServerHandshake,
  type ClientHttp2Session,
  type IncomingHttpHeaders,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from "node:http2";
import { connect as netConnect } from "node:net";
import type { SecureContext } from "node:tls";
import type { MessageShape } from "@bufbuild/protobuf";
import { fromBinary } from "@bufbuild/protobuf";
import { WorkerInvokeFunctionRequestSchema } from "../../gen/nvcf/worker_pb.js";
import {
  H2_SESSION_OPTIONS,
  forwardStream,
  nextHopRequestHeaders,
  resetFailure,
  widenWindow,
} from "../../lib/grpc/index.js";
import type { Logger } from "../../lib/log.js";
import { ATTR, traceGrpcInference, traceTunnelOpen, type TraceSpan } from "../../lib/tracing/index.js";
import type { LookupFunction } from "../../lib/net/index.js";
import { subjects } from "../../lib/nats/index.js";
import type { WorkerConfig } from "./config.js";
import { openTunnel, type TunnelTarget } from "./tunnel.js";
import { NVCF_HEADERS } from "../../lib/contract.js";
import { formatHostPort } from "../../lib/net/index.js";

type WorkRequest = MessageShape<typeof WorkerInvokeFunctionRequestSchema>;

export interface StatefulDeps {
  cfg: WorkerConfig;
  logger: Logger;
  nc: NatsConnection;
  lookup: LookupFunction;
  secureContext: SecureContext | undefined;
  /** The session's span (dispatch.ts): its tunnels are spans under it, and each call links to it. */
  trace?: TraceSpan | undefined;
}

export type SessionOutcome = "answered" | "cancelled" | "failed";

/** The tunnel targets a message offers (HTTP/1 CONNECT; HTTP/3 ones are skipped: not served here). */
function targets(req: WorkRequest): TunnelTarget[] {
  const out: TunnelTarget[] = [];
  for (const c of req.statefulConfig?.connectionConfigs ?? []) {
    if (c.config.case === "http1Config" && c.config.value.proxyURI)
      out.push({
        proxyUri: c.config.value.proxyURI,
        token: c.config.value.proxyAuthorizationToken,
        requestId: req.requestId,
      });
  }
  return out;
}

export class StatefulSession {
  private readonly tunnels = new Set<ServerHttp2Session>();
  private inference: ClientHttp2Session | undefined;
  private reconnectSub: Subscription | undefined;
  private lingerTimer: NodeJS.Timeout | undefined;
  private finish: ((o: SessionOutcome) => void) | undefined;
  private calls = 0;
  readonly requestId: string;
  /** Aborted by a cancel or the agent's stop: every tunnel of the session closes. */
  readonly abort = new AbortController();
  private readonly signal = this.abort.signal;

  constructor(
    private readonly deps: StatefulDeps,
    private readonly req: WorkRequest,
  ) {
    this.requestId = req.requestId;
  }

  async run(): Promise<SessionOutcome> {
    const { logger } = this.deps;
    const offered = targets(this.req);
    if (!offered.length) {
      logger.error(
        { requestId: this.req.requestId },
        "the gRPC work message offers no HTTP/1 CONNECT target",
      );
      return "failed";
    }
    const done = new Promise<SessionOutcome>((resolve) => (this.finish = resolve));
    const onAbort = () => this.end("cancelled");
    this.signal.addEventListener("abort", onAbort, { once: true });
    try {
      let opened = false;
      for (const t of offered) {
        try {
          await this.addTunnel(t);
          opened = true;
          break;
        } catch (err) {
          logger.warn(
            { requestId: this.req.requestId, target: t.proxyUri, err: (err as Error).message },
            "tunnel not opened",
          );
        }
      }
      if (!opened) return this.signal.aborted ? "cancelled" : "failed";
      this.listenForReconnects();
      return await done;
    } finally {
      this.signal.removeEventListener("abort", onAbort);
      this.reconnectSub?.unsubscribe();
      if (this.lingerTimer) clearTimeout(this.lingerTimer);
      for (const t of this.tunnels) t.destroy();
      this.inference?.destroy();
      logger.info({ requestId: this.req.requestId, calls: this.calls }, "gRPC session ended");
    }
  }

  private end(outcome: SessionOutcome): void {
    const f = this.finish;
    this.finish = undefined;
    f?.(outcome);
  }

  private async addTunnel(t: TunnelTarget): Promise<void> {
    const traced = this.deps.trace && traceTunnelOpen(this.deps.trace, t.proxyUri);
    const opening = openTunnel(traced ? { ...t, traceparent: traced.traceparent } : t, {
      lookup: this.deps.lookup,
      secureContext: this.deps.secureContext,
      signal: this.signal,
    });
    const socket = await (traced ? traced.span.until(opening) : opening);
    if (this.lingerTimer) clearTimeout(this.lingerTimer);
    this.lingerTimer = undefined;
    const session = performServerHandshake(socket, { ...H2_SESSION_OPTIONS });
    widenWindow(session);
    this.tunnels.add(session);
    session.on("error", () => undefined);
    session.on("stream", (stream: ServerHttp2Stream, headers: IncomingHttpHeaders, flags: number) => {
      stream.on("error", () => undefined);
      void this.serve(stream, headers, flags);
    });
    session.once("close", () => {
      this.tunnels.delete(session);
      if (this.tunnels.size === 0) {
        // a client may resume the session through another replica: wait a while for its tunnel
        this.lingerTimer = setTimeout(() => this.end("answered"), this.deps.cfg.sessionReconnectWaitMs);
      }
    });
    this.deps.logger.info({ requestId: this.req.requestId, target: t.proxyUri }, "tunnel open");
  }

  private inferenceSession(): ClientHttp2Session {
    if (this.inference && !this.inference.closed && !this.inference.destroyed) return this.inference;
    const { host, port } = this.deps.cfg.inference;
    const s = h2connect(`http://${formatHostPort({ host, port })}`, {
      ...H2_SESSION_OPTIONS,
      // small calls one at a time: no Nagle delay
      createConnection: () => netConnect({ host, port, noDelay: true }),
    });
    s.on("error", (err: Error) =>
      this.deps.logger.warn(
        { requestId: this.req.requestId, err: err.message },
        "inference connection failed",
      ),
    );
    s.once("connect", () => widenWindow(s));
    this.inference = s;
    return s;
  }

  private async serve(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, flags: number): Promise<void> {
    const { cfg } = this.deps;
    this.calls++;
    const { host, port } = cfg.inference;
    const extra: Record<string, string> = {};
    const span = this.deps.trace && traceGrpcInference(this.deps.trace, headers, cfg.inference, extra);
    const result = await forwardStream(
      stream,
      headers,
      !!(flags & 0x1),
      this.inferenceSession(),
      nextHopRequestHeaders(headers, new Set(), {
        ":authority": formatHostPort({ host, port }),
        [NVCF_HEADERS.reqId]: this.req.requestId,
        "nvcf-function-id": cfg.functionId,
        "nvcf-function-version-id": cfg.functionVersionId,
        "nvcf-ncaid": this.req.ncaId || cfg.ncaId,
        "nvcf-sub": this.req.subject,
        ...extra,
      }),
      { failure: resetFailure(`the inference server at ${host}:${port}`) },
    );
    span
      ?.set("rpc.grpc.status_code", result.grpcStatus === undefined ? undefined : Number(result.grpcStatus))
      .set(ATTR.outcome, result.outcome)
      .end(result.outcome === "ok" ? undefined : result.outcome);
  }

  /** A client resuming the session through another replica: one more tunnel, to that replica. */
  private listenForReconnects(): void {
    this.reconnectSub = this.deps.nc.subscribe(
      subjects.reconnect(this.deps.cfg.functionVersionId, this.req.requestId),
      {
        callback: (err, m) => {
          if (err) return;
          let ask: WorkRequest;
          try {
            ask = fromBinary(WorkerInvokeFunctionRequestSchema, m.data);
          } catch {
            m.respond("the reconnect request is not a work message");
            return;
          }
          // a session is its caller's account's (issue 19): another account's key is refused
          if (ask.ncaId !== this.req.ncaId) {
            m.respond(`session ${this.req.requestId} belongs to another account`);
            return;
          }
          const fid = ask.requestHeaders.find((h) => h.key === "function-id")?.value;
          if (fid !== this.deps.cfg.functionId) {
            m.respond(`session ${this.req.requestId} serves another function`);
            return;
          }
          const t = targets(ask)[0];
          if (!t) {
            m.respond("the reconnect request offers no HTTP/1 CONNECT target");
            return;
          }
          m.respond("");
          this.addTunnel({ ...t, requestId: this.req.requestId }).catch((e: unknown) =>
            this.deps.logger.warn(
              { requestId: this.req.requestId, target: t.proxyUri, err: (e as Error).message },
              "reconnect tunnel not opened",
            ),
          );
        },
      },
    );
  }
}
