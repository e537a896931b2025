// The invocation service's options (re-exported by service.ts, where main.ts, the stack and the
// tests take them from). Kept apart so that the replica state can read them without importing the
// service shell that builds it.
import type { HostPort } from "../../lib/net/index.js";
import type { Logger } from "../../lib/log.js";
import type { Registry } from "../../lib/metrics.js";
import type { Tracing } from "../../lib/tracing/index.js";
import type { NatsAccess, QueueLimits } from "../../lib/nats/index.js";
import type { AuthCacheSettings } from "../../plane/auth-cache.js";

export interface InvocationServiceOptions {
  listen: HostPort;
  region: string;
  serviceDomain: string;
  /** Overrides the pod address handed to workers (WORKER_STREAM_PROPERTIES__SELF_ADDRESS upstream). */
  selfAddress?: string;
  /** How this replica reaches NATS (natsAccess(config, "invocation")). */
  nats: NatsAccess;
  apiUrl: string;
  serviceToken: string;
  inlineBodyBytes?: number;
  poll?: PollSettings;
  statusRequestTimeoutMs?: number;
  authCache?: AuthCacheSettings;
  queue: QueueLimits;
  logger?: Logger;
  registry?: Registry;
  holderId?: number;
  /**
   * Worker callbacks through the callback proxy: a TLS listener for the attach routes, with the
   * pod certificate (reloaded when its files change); its port goes into the pod address.
   */
  workerTls?: { port: number; certFile: string; keyFile: string } | undefined;
  /** The port named in the pod address when it is not the TLS listener's or the plain one's. */
  callbackPort?: number | undefined;
  /** Handed to workers as proxyURI: the callback proxy's address. */
  proxyUri?: string | undefined;
  /** Relay callbacks for requests held elsewhere (found through the replica registry). */
  relay?: { enabled: boolean; registryTtlMs?: number; idleMs?: number };
  /** The most requests one API key may have in flight on this replica (default 1024). */
  maxInFlightPerKey?: number;
  /** How long the inline part of a body may take to arrive (default 30 s; never past the poll window). */
  inlineBodyMs?: number;
  /** How long a body may send no byte while a reader waits for it (default 10 s). */
  bodyIdleMs?: number;
  /** Whether the client port also takes workers' callbacks (request-attach); default true. */
  attachOnClientPort?: boolean;
  /** Whether the client port serves GET /metrics; default false. */
  metricsOnClientPort?: boolean;
  /** Function versions with series of their own before the rest share `other` (plane/function-series.ts). */
  functionSeriesLimit?: number;
  /**
   * Host names the client port serves besides IP literals, localhost and the replica's own pod
   * address (global.hosts); a request naming another is refused with HOST_NOT_SERVED.
   */
  hosts?: readonly string[];
  /** Spans for its requests (observability.tracing); none without. */
  tracing?: Tracing | undefined;
}

export interface PollSettings {
  defaultSeconds: number;
  streamingDefaultSeconds: number;
  maxSeconds: number;
  graceSeconds: number;
}
