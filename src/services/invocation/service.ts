// The invocation service: clients invoke functions over HTTP (contract §2), the request is queued
// to a worker through JetStream (§3.2), and the worker calls back to this replica, the one that
// holds the client's connection, to fetch the rest of the body and to stream the answer (§3.6).
//
// This file is the lifecycle shell (start, stop, wiring). One invocation, by module:
// listeners.ts (routes) → invoke.ts (the client's POST, up to the publish) → attach.ts (the
// worker's callbacks, back to the client); poll.ts serves status polls; state.ts holds what they
// share (ReplicaState).
import { holderHex } from "../../lib/ids.js";
import type { Registry } from "../../lib/metrics.js";
import { connectNats, REGISTRY_BUCKETS, Replies } from "../../lib/nats/index.js";
import { answerOwnLogs } from "../../plane/console-logs.js";
import { ReplicaRegistry } from "../../plane/registry.js";
import { Relay } from "../../plane/relay.js";
import { WorkPublisher, askApiForQueue } from "../../plane/work-queue.js";
import { WorkerTlsListener, callbackHostName, createClientListener, podAddress } from "./listeners.js";
import type { InvocationServiceOptions } from "./options.js";
import { listenForAnswers } from "./answer-message.js";
import { listenForConsole } from "./console-report.js";
import { ReplicaState } from "./state.js";

export type { InvocationServiceOptions } from "./options.js";

export interface InvocationService {
  listen(): Promise<URL>;
  close(graceMs?: number, drainDelayMs?: number): Promise<void>;
  destroy(): void;
  /** The callback target handed to workers (the pod address). */
  readonly targetUri: string;
  readonly holderId: number;
  readonly registry: Registry;
}

export function createInvocationService(opts: InvocationServiceOptions): InvocationService {
  const replica = new ReplicaState(opts);
  const { logger, holderId } = replica;
  // global.hosts, and (pushed by listen()) the names workers call this replica back under
  const hosts: string[] = [...(opts.hosts ?? [])];
  const attachOnClientPort = opts.attachOnClientPort ?? true;
  const http = createClientListener(replica, opts.listen, {
    hosts,
    attach: attachOnClientPort,
    metrics: opts.metricsOnClientPort ?? false,
  });
  const workerTls = opts.workerTls
    ? new WorkerTlsListener(replica, opts.listen.host, opts.workerTls)
    : undefined;

  return {
    get targetUri() {
      return replica.targetUri;
    },
    holderId,
    registry: replica.registry,
    async listen() {
      const nc = await connectNats(opts.nats, `invocation-${holderHex(holderId)}`, logger, replica.registry);
      replica.nc = nc;
      replica.publisher = new WorkPublisher(
        nc,
        opts.region,
        opts.queue,
        logger,
        askApiForQueue(opts.apiUrl, opts.serviceToken),
        new Replies(nc, opts.nats.inboxPrefix),
      );
      replica.answers = listenForAnswers(replica, nc);
      replica.console = listenForConsole(replica, nc);
      const logs = answerOwnLogs(nc, { service: "invocation", replica: holderHex(holderId) }, logger);
      if (logs) replica.console.push(logs);
      const url = await http.listen();
      const tlsUrl = await workerTls?.listen();
      replica.targetUri = podAddress(opts, url, tlsUrl);
      // Workers that call back to the client port name the pod address (a pod DNS name on a
      // cluster) or the configured callback address in Host. Only then is that name served: a
      // name a neighbour can answer for (mDNS answers *.local on a LAN) is not served for nothing.
      const own =
        attachOnClientPort && (!tlsUrl || opts.selfAddress) ? callbackHostName(replica.targetUri) : undefined;
      if (own && !hosts.includes(own)) hosts.push(own);
      // Every replica is in the registry, relay or not: the console counts the replicas it waits
      // for by it (services/api/replica-reports.ts), and lists them on its health page. Only the
      // relay looks addresses up in it.
      replica.replicas = new ReplicaRegistry(
        nc,
        { holder: holderId, relayUrl: url.origin, certificates: () => workerTls?.certificates() ?? [] },
        logger,
        opts.relay?.registryTtlMs,
        REGISTRY_BUCKETS.invocation,
        opts.queue.replicas,
      );
      await replica.replicas.start();
      if (opts.relay?.enabled)
        replica.relay = new Relay(replica.replicas, holderId, opts.relay.idleMs ?? 300_000, logger);
      logger.info(
        {
          targetUri: replica.targetUri,
          proxyUri: opts.proxyUri,
          holder: holderHex(holderId),
          relay: !!replica.relay,
        },
        "workers call back at the pod address",
      );
      return url;
    },
    async close(graceMs = 30_000, drainDelayMs = 0) {
      // Drain first, then leave the registry: while draining, callbacks for the requests this
      // replica still holds may land on another replica and must be relayed here. (It takes no new
      // requests meanwhile, so nothing else is relayed to it.) The clients' listener drains first
      // (readiness fails, requests are still taken for the drain delay, then refused, and the
      // requests in flight finish); the workers' listener stays open all that time, since those
      // requests' callbacks arrive on it, and closes after.
      await http.close(graceMs, drainDelayMs);
      await workerTls?.close(1000);
      await replica.replicas?.close();
      replica.releaseAll("replica stopping");
      replica.tokens.close();
      await replica.relay?.close();
      await replica.auth.close();
      await replica.nc?.drain().catch(() => undefined);
    },
    destroy() {
      http.destroy();
      workerTls?.destroy();
      replica.relay?.destroy();
      // destroy, not close: close() waits for lookups in flight; and it is safe after close()
      replica.auth.destroy();
      void replica.nc?.close();
    },
  };
}
