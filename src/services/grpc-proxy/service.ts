// grpc-proxy: clients invoke functions over gRPC (contract §4). A client's HTTP/2 connection and
// function routing (function-id, function-version-id metadata) make a session: the first call
// puts one work message on the version's queue, carrying a single-use CONNECT token (30 s) and the
// address of this replica's tunnel listener; the worker that takes it opens a tunnel back
// (HTTP/1 CONNECT, §4.3), over which the roles invert: this replica is the HTTP/2 client, the
// worker serves it and passes each call to the inference server. Every call of the session reuses
// that tunnel; calls pass through as bytes (any method of the function's services), with
// metadata, trailers, deadlines, resets and flow control intact. Only gRPC methods of gRPC
// functions (inferenceUrl /grpc) pass, and a session belongs to its caller's account (no other
// account can resume it).
//
// Tunnels can reach this replica three ways: directly on its CONNECT listener (in-cluster), on its
// worker TLS listener through the callback proxy (another network), or relayed from another
// replica that a shared connect address sent them to (the token names its holder, the registry of
// live replicas gives its address).
//
// This file is the lifecycle shell: it wires the modules and starts and stops them. One call, in
// the order it meets them: listeners.ts (ClientListener.onStream) → calls.ts (Calls.onStream) →
// sessions.ts (SessionTable.sessionFor / resume; session.ts) → tunnels.ts (Tunnels.onConnect,
// attach, relay) → back in calls.ts (Calls.forward through the tunnel).
import { CallplaneError } from "../../lib/errors.js";
import { holderHex, newHolderId } from "../../lib/ids.js";
import { silentLogger } from "../../lib/log.js";
import { createRegistry } from "../../lib/metrics.js";
import { connectNats, REGISTRY_BUCKETS, Replies } from "../../lib/nats/index.js";
import { answerOwnLogs } from "../../plane/console-logs.js";
import { createAuthCache } from "../../plane/auth-cache.js";
import { ReplicaRegistry } from "../../plane/registry.js";
import { WorkPublisher, askApiForQueue } from "../../plane/work-queue.js";
import { Calls } from "./calls.js";
import { KeyInFlight } from "../../plane/key-limit.js";
import { ClientListener, WorkerListeners, connectUriFor } from "./listeners.js";
import { grpcProxyMetrics } from "./metrics.js";
import type { GrpcProxyOptions, GrpcProxyUrls } from "./options.js";
import { SessionTable } from "./sessions.js";
import { ProxyState } from "./state.js";
import { Tunnels } from "./tunnels.js";

export type { GrpcProxyOptions, GrpcProxyUrls } from "./options.js";
export { SESSION_COOKIE } from "./sessions.js";
export { CONNECT_PATH } from "./tunnels.js";

export function createGrpcProxy(opts: GrpcProxyOptions) {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("grpc-proxy");
  const holderId = opts.holderId ?? newHolderId();
  const auth = createAuthCache(opts, logger, registry);
  const metrics = grpcProxyMetrics(registry);
  const state = new ProxyState();
  state.tracing = opts.tracing;
  const maxInFlightPerKey = opts.maxInFlightPerKey ?? 1024;
  const sessions = new SessionTable({
    state,
    budget: new KeyInFlight(maxInFlightPerKey, "grpcproxy.maxInFlightPerKey", "sessions"),
    logger,
    holderId,
    region: opts.region,
    idleMs: opts.sessionIdleMs ?? 30_000,
    tokenTtlMs: opts.connectTokenTtlMs ?? 30_000,
    metrics,
  });
  const calls = new Calls({
    auth,
    sessions,
    state,
    metrics,
    logger,
    holderId,
    hosts: opts.hosts ?? [],
    callBudget: new KeyInFlight(maxInFlightPerKey, "grpcproxy.maxInFlightPerKey", "calls in flight"),
  });
  const tunnels = new Tunnels({ sessions, state, metrics, logger, holderId, listenHost: opts.listen.host });
  const clients = new ClientListener(opts, calls, { logger, registry });
  const workers = new WorkerListeners(opts, tunnels, state, { logger, registry });
  const started: { urls?: GrpcProxyUrls } = {};

  return {
    holderId,
    registry,
    get connectUri() {
      return state.connectUri;
    },
    get urls() {
      return started.urls;
    },
    async listen(): Promise<URL> {
      const nc = await connectNats(opts.nats, `grpc-proxy-${holderHex(holderId)}`, logger, registry);
      state.nc = nc;
      // the console's Logs page (ended with the connection's drain)
      answerOwnLogs(nc, { service: "grpc-proxy", replica: holderHex(holderId) }, logger);
      state.publisher = new WorkPublisher(
        nc,
        opts.region,
        opts.queue,
        logger,
        askApiForQueue(opts.apiUrl, opts.serviceToken),
        new Replies(nc, opts.nats.inboxPrefix),
      );
      const { connect, workerTls } = await workers.listen();
      const client = await clients.listen();
      state.connectUri = connectUriFor(opts, connect.port);
      // in the registry relay or not (the console's health page lists it); only the relay, when
      // on, looks holders up in it (state.relay)
      state.replicas = new ReplicaRegistry(
        nc,
        {
          holder: holderId,
          relayUrl: connect.origin,
          certificates: () => [...clients.certificates(), ...workers.certificates()],
        },
        logger,
        opts.relay?.registryTtlMs,
        REGISTRY_BUCKETS.grpcProxy,
        opts.queue.replicas,
      );
      await state.replicas.start();
      state.relay = opts.relay?.enabled ?? false;
      started.urls = { client, connect, workerTls };
      logger.info(
        {
          client: client.origin,
          connect: connect.origin,
          workerTls: workerTls?.origin,
          connectUri: state.connectUri,
          holder: holderHex(holderId),
          relay: state.relay,
        },
        "grpc-proxy listening; workers open tunnels at the connect URI",
      );
      return client;
    },
    /**
     * Graceful stop, as balancers expect it: readiness fails at once (/health 503), calls and new
     * sessions are still taken for the drain delay (the balancer has not noticed yet), then GOAWAY to
     * every client and no new sessions; calls in flight finish within the grace.
     */
    async close(graceMs = 30_000, drainDelayMs = 0): Promise<void> {
      state.draining = true;
      if (drainDelayMs > 0) await new Promise((r) => setTimeout(r, drainDelayMs));
      state.closing = true;
      const stopping = new CallplaneError("SHUTTING_DOWN", "grpc-proxy is stopping");
      // past the grace, cutting the tunnels ends each call left with UNAVAILABLE as trailers
      // (forwardStream), and a call still waiting for its worker with SHUTTING_DOWN
      await clients.close(graceMs, () => sessions.endAll(stopping, "grace over", true));
      sessions.endAll(stopping, "replica stopping");
      await state.replicas?.close();
      await workers.close();
      sessions.close();
      await auth.close();
      await state.nc?.drain().catch(() => undefined);
    },
    destroy(): void {
      state.closing = true;
      state.destroyed = true;
      clients.destroy();
      sessions.endAll(new CallplaneError("SHUTTING_DOWN", "grpc-proxy stopped"), "replica destroyed", true);
      workers.destroy();
      sessions.close();
      auth.destroy();
      // closed after the work just aborted has run its last steps (acks, unsubscribes): a publish
      // made while nats.js closes is flushed after its socket ended, an uncaught "write after end"
      setImmediate(() => void state.nc?.close());
    },
  };
}

export type GrpcProxy = ReturnType<typeof createGrpcProxy>;
