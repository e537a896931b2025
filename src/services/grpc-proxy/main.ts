import { join } from "node:path";
import { readServiceToken } from "../../lib/identity/index.js";
import { parseHostPort } from "../../lib/net/index.js";
import { TLS_FILES, grpcProxyCertFolder } from "../../lib/tls/index.js";
import { natsAccess } from "../../lib/nats/index.js";
import { runService } from "../../lib/process/index.js";
import { CONNECT_PATH, createGrpcProxy } from "./service.js";

runService(
  "grpc-proxy",
  async (config, logger, tracing) => {
    // As in Kubernetes, each replica learns its own address from POD_IP; the local stack sets it.
    const host = process.env.POD_IP;
    if (!host)
      throw new Error(
        "POD_IP is not set: grpc-proxy listens on its pod's own address (the local stack sets POD_IP per replica)",
      );
    const g = config.grpcproxy;
    const proxy = config.workerCallbackProxy;
    const shared = g.workerConnectBaseURL || config.global.workerEndpoints.grpcProxyWorkerConnectURL;
    // The pod's worker-listener certificate: on one machine each replica's own folder under
    // pki.dir; on Kubernetes the mounted Secret of the service's certificate (CALLPLANE_POD_TLS_DIR).
    const certs = process.env.CALLPLANE_POD_TLS_DIR || grpcProxyCertFolder(config.pki.dir, host);
    const service = createGrpcProxy({
      listen: { host, port: g.port },
      connectPort: g.connectPort,
      workerTls: proxy.enabled
        ? {
            port: g.workerTlsPort,
            certFile: join(certs, TLS_FILES.cert),
            keyFile: join(certs, TLS_FILES.key),
          }
        : undefined,
      clientTls: g.tls.enabled ? { certFile: g.tls.certFile, keyFile: g.tls.keyFile } : undefined,
      region: config.global.region,
      serviceDomain: config.global.serviceDomain,
      nats: natsAccess(config, "grpc-proxy"),
      apiUrl: config.api.url,
      // the invocation plane's service identity at the API (the key check is the same for HTTP and gRPC)
      serviceToken: readServiceToken(config.auth.serviceTokenDir, "invocation"),
      queue: { ...config.nats.stream, ackWaitSeconds: config.nats.consumer.ackWaitSeconds },
      authCache: config.invocation.authCache,
      sharedConnectUrl: shared ? `${shared.replace(/\/+$/, "")}${CONNECT_PATH}` : undefined,
      callbackProxy: proxy.enabled
        ? { workerDomain: proxy.workerDomain, port: parseHostPort(proxy.listen).port }
        : undefined,
      sessionIdleMs: g.sessionIdleSeconds * 1000,
      connectTokenTtlMs: g.connectTokenTtlSeconds * 1000,
      relay: { enabled: g.relay.enabled },
      hosts: config.global.hosts,
      maxInFlightPerKey: g.maxInFlightPerKey,
      logger,
      tracing,
    });
    const url = await service.listen();
    return {
      urls: {
        grpc: url.origin,
        connect: service.urls!.connect.origin,
        connectUri: service.connectUri,
      },
      close: (grace, delay) => service.close(grace, delay),
      destroy: () => service.destroy(),
    };
  },
  {
    graceMs: (c) => c.grpcproxy.shutdownGraceSeconds * 1000,
    drainDelayMs: (c) => c.grpcproxy.drainDelaySeconds * 1000,
    traced: true,
  },
);
