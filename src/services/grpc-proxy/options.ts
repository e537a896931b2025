// What a grpc-proxy replica is given (GrpcProxyOptions) and the addresses it listens on once
// started (GrpcProxyUrls). Apart from service.ts so that its modules can read the options without
// importing the shell that wires them.
import type { HostNames } from "../../lib/http/index.js";
import type { HostPort } from "../../lib/net/index.js";
import type { Logger } from "../../lib/log.js";
import type { Registry } from "../../lib/metrics.js";
import type { NatsAccess, QueueLimits } from "../../lib/nats/index.js";
import type { AuthCacheSettings } from "../../plane/auth-cache.js";
import type { Tracing } from "../../lib/tracing/index.js";

export interface GrpcProxyOptions {
  /** The client listener (the pod's address, port 10081). */
  listen: HostPort;
  /** The HTTP/1 CONNECT listener for in-cluster workers (10086; 0 picks one). */
  connectPort: number;
  /** Workers through the callback proxy: a TLS listener with the pod certificate (10084). */
  workerTls?: { port: number; certFile: string; keyFile: string } | undefined;
  /** TLS with ALPN h2 on the client listener, instead of cleartext HTTP/2. */
  clientTls?: { certFile: string; keyFile: string } | undefined;
  region: string;
  serviceDomain: string;
  /** How this replica reaches NATS (natsAccess(config, "grpc-proxy")). */
  nats: NatsAccess;
  apiUrl: string;
  serviceToken: string;
  queue: QueueLimits;
  authCache?: AuthCacheSettings;
  /** A connect URL shared by every replica (grpcproxy.workerConnectBaseURL), instead of the pod's own. */
  sharedConnectUrl?: string | undefined;
  /** Workers reach this replica through the callback proxy: the name its SNI routing reads. */
  callbackProxy?: { workerDomain: string; port: number } | undefined;
  /** A session with no call in flight this long closes (30 s). */
  sessionIdleMs?: number;
  /** How long a CONNECT token is valid, and so how long a call waits for its worker (30 s). */
  connectTokenTtlMs?: number;
  relay?: { enabled: boolean; registryTtlMs?: number };
  /** Host names the client listener serves besides IP literals and localhost (global.hosts; default none). */
  hosts?: HostNames | undefined;
  /** The most calls in flight, and the most sessions, one API key holds on this replica (1024). */
  maxInFlightPerKey?: number;
  holderId?: number;
  logger?: Logger;
  registry?: Registry;
  /** Spans for its calls and tunnels (observability.tracing); none without. */
  tracing?: Tracing | undefined;
}

export interface GrpcProxyUrls {
  client: URL;
  connect: URL;
  workerTls: URL | undefined;
}
