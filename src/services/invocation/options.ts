// The invocation service's options (re-exported by service.ts, where main.ts, the stack and the
// tests take them from). Kept apart so that the replica state can read them without importing the
// service shell that builds it.
import type { HostPort } from "../../lib/net/index.js";
import type { Logger } from "../../lib/log.js";
import type { Registry } from "../../lib/metrics.js";
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
}

export interface PollSettings {
  defaultSeconds: number;
  streamingDefaultSeconds: number;
  maxSeconds: number;
  graceSeconds: number;
}
