// The mutable state one grpc-proxy replica's modules share: its link to NATS (made by listen()) and
// the flags of a stop. One object, so that a reader finds every piece of it in one place.
import type { NatsConnection } from "@nats-io/transport-node";
import type { ReplicaRegistry } from "../../plane/registry.js";
import type { WorkPublisher } from "../../plane/work-queue.js";
import type { Tracing } from "../../lib/tracing/index.js";

export class ProxyState {
  nc: NatsConnection | undefined;
  publisher: WorkPublisher | undefined;
  /** The registry of live replicas (set by listen(), relay or not). */
  replicas: ReplicaRegistry | undefined;
  /** Whether a tunnel for a session another replica holds is piped there (grpcproxy.relay.enabled). */
  relay = false;
  /** Where workers open their tunnels: put in every work message (set by listen()). */
  connectUri = "";
  /** A stop is under way: no new calls. */
  closing = false;
  // readiness has failed (a stop began); calls are still taken until the drain delay is over
  draining = false;
  /** destroy(): NATS is being closed under everything, so nothing publishes any more. */
  destroyed = false;
  /** Spans for calls and tunnels, when the replica traces. */
  tracing: Tracing | undefined;

  /** The connect listener's readiness (/health). */
  get ready(): boolean {
    return this.nc !== undefined && !this.nc.isClosed() && !this.closing && !this.draining;
  }
}
