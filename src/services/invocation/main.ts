import { join } from "node:path";
import { readServiceToken } from "../../lib/identity/index.js";
import { TLS_FILES, invocationCertFolder } from "../../lib/tls/index.js";
import { natsAccess } from "../../lib/nats/index.js";
import { runService } from "../../lib/process/index.js";
import { createInvocationService } from "./service.js";

runService(
  "invocation",
  async (config, logger, tracing) => {
    // As in Kubernetes, each replica learns its own address from POD_IP; the local stack sets it.
    const host = process.env.POD_IP;
    if (!host)
      throw new Error(
        "POD_IP is not set: the invocation service listens on its pod's own address (the local stack sets POD_IP per replica)",
      );
    const proxy = config.workerCallbackProxy;
    const upstreamTls = proxy.enabled && proxy.invocation.upstreamTls.enabled;
    // The pod's worker-listener certificate: on one machine each replica's own folder under
    // pki.dir; on Kubernetes the mounted Secret of the service's certificate (CALLPLANE_POD_TLS_DIR).
    const certs = process.env.CALLPLANE_POD_TLS_DIR || invocationCertFolder(config.pki.dir, host);
    const service = createInvocationService({
      listen: { host, port: config.invocation.port },
      region: config.global.region,
      serviceDomain: config.global.serviceDomain,
      selfAddress:
        config.invocation.selfAddress || config.global.workerEndpoints.invocationServiceURL || undefined,
      nats: natsAccess(config, "invocation"),
      apiUrl: config.api.url,
      serviceToken: readServiceToken(config.auth.serviceTokenDir, "invocation"),
      inlineBodyBytes: config.invocation.inlineBodyBytes,
      poll: config.invocation.poll,
      statusRequestTimeoutMs: config.invocation.statusRequestTimeoutSeconds * 1000,
      authCache: config.invocation.authCache,
      queue: { ...config.nats.stream, ackWaitSeconds: config.nats.consumer.ackWaitSeconds },
      workerTls: upstreamTls
        ? {
            port: proxy.invocation.workerTlsPort,
            certFile: join(certs, TLS_FILES.cert),
            keyFile: join(certs, TLS_FILES.key),
          }
        : undefined,
      proxyUri: proxy.enabled ? config.global.workerEndpoints.invocationProxyURL : undefined,
      relay: { enabled: config.invocation.relay.enabled, idleMs: proxy.timeouts.idleSeconds * 1000 },
      maxInFlightPerKey: config.invocation.maxInFlightPerKey,
      inlineBodyMs: config.invocation.inlineBodySeconds * 1000,
      bodyIdleMs: config.invocation.bodyIdleSeconds * 1000,
      attachOnClientPort: config.invocation.attachOnClientPort,
      metricsOnClientPort: config.invocation.metricsOnClientPort ?? false,
      hosts: config.global.hosts,
      logger,
      tracing,
    });
    const url = await service.listen();
    return {
      urls: { invocation: url.origin, target: service.targetUri },
      close: (g, delay) => service.close(g, delay),
      destroy: () => service.destroy(),
    };
  },
  {
    graceMs: (c) => c.invocation.shutdownGraceSeconds * 1000,
    drainDelayMs: (c) => c.invocation.drainDelaySeconds * 1000,
    traced: true,
  },
);
