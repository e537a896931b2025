// The replica relay: a worker callback that reaches a replica that does not hold the request (a
// shared, load-balanced callback address; an old pod address) is forwarded to the replica that
// does, instead of being dropped. The holder is named by the request id inside the attach token;
// its address comes only from the registry of live replicas, never from the callback. A relayed
// callback carries a marker so that it is never relayed a second time.
import type { IncomingMessage, ServerResponse } from "node:http";
import { Agent } from "undici";
import { CallplaneError } from "../lib/errors.js";
import { forward, forwardHeaders } from "../lib/http/index.js";
import { holderHex } from "../lib/ids.js";
import type { Logger } from "../lib/log.js";
import { ATTR, traceRelay, type TraceSpan } from "../lib/tracing/index.js";
import type { ReplicaRegistry } from "./registry.js";
import { ATTACH_PATH } from "../lib/contract.js";

export const RELAYED_HEADER = "x-callplane-relayed";
const PROTECTED = new Set(["authorization", "content-type", "content-length", "accept"]);
const DROP = new Set(["host", RELAYED_HEADER]);

function errorCode(err: Error | undefined): string | undefined {
  return err && "code" in err && typeof err.code === "string" ? err.code : undefined;
}

export class Relay {
  private readonly agent = new Agent({ keepAliveTimeout: 30_000, connections: 64 });

  constructor(
    private readonly registry: ReplicaRegistry,
    private readonly self: number,
    private readonly idleMs: number,
    private readonly logger: Logger,
  ) {}

  /**
   * Forwards the callback to the replica that holds it; throws HOLDER_GONE when there is none.
   * With `span` (the callback's), the relay is a span of its own under it.
   */
  async forward(req: IncomingMessage, res: ServerResponse, holder: number, span?: TraceSpan): Promise<void> {
    const started = performance.now();
    const entry = await this.registry.lookup(holder);
    if (!entry) {
      throw new CallplaneError(
        "HOLDER_GONE",
        `the replica ${holderHex(holder)} that holds this request is not in the registry of live replicas (it stopped or crashed); give up on this request`,
      );
    }
    const headers = forwardHeaders(req, PROTECTED, DROP);
    headers[RELAYED_HEADER] = holderHex(this.self);
    // the holder tells the worker by where its callback came from (the console shows it), not by us
    if (headers["x-forwarded-for"] === undefined && req.socket.remoteAddress)
      headers["x-forwarded-for"] = req.socket.remoteAddress;
    const relaySpan = span && traceRelay(span, req, holderHex(holder), entry.relayUrl, headers);
    const r = await forward(req, res, {
      dispatcher: this.agent,
      origin: entry.relayUrl,
      path: ATTACH_PATH,
      headers,
      idleMs: this.idleMs,
      onFailure: (result) =>
        errorCode(result.error) === "ECONNREFUSED"
          ? new CallplaneError(
              "HOLDER_GONE",
              `the replica ${holderHex(holder)} that holds this request no longer answers at ${entry.relayUrl}; give up on this request`,
            )
          : new CallplaneError(
              result.outcome === "upstream_timeout" ? "UPSTREAM_TIMEOUT" : "UPSTREAM_UNAVAILABLE",
              `relaying to the replica ${holderHex(holder)} failed: ${result.reason ?? result.error?.message ?? "unknown error"}`,
            ),
    });
    relaySpan
      ?.set("http.response.status_code", r.status || undefined)
      .set(ATTR.outcome, r.outcome)
      .end(r.outcome === "forwarded" ? undefined : (r.error ?? r.reason ?? r.outcome));
    this.logger.info(
      {
        holder: holderHex(holder),
        to: entry.relayUrl,
        method: req.method,
        status: r.status,
        outcome: r.outcome,
        bytesIn: r.bytesIn,
        bytesOut: r.bytesOut,
        durationMs: Math.round(performance.now() - started),
        ...(r.reason ? { reason: r.reason } : {}),
      },
      "relayed a callback to the replica that holds it",
    );
  }

  close(): Promise<void> {
    return this.agent.close();
  }

  destroy(): void {
    void this.agent.destroy();
  }
}
