import { parseHostPort } from "../../lib/net/index.js";
import { runService } from "../../lib/process/index.js";
import { TlsReloader } from "../../lib/tls/index.js";
import { createRegistry } from "../../lib/metrics.js";
import { createCallbackProxy } from "./service.js";

runService(
  "callback-proxy",
  async (config, logger) => {
    const p = config.workerCallbackProxy;
    if (!p.enabled)
      throw new Error(
        "workerCallbackProxy.enabled is false: the callback proxy is turned off and must not be started",
      );
    // the reloads are logged; HAProxy's own exporter serves the proxy's metrics
    const registry = createRegistry("callback-proxy");
    const frontend = new TlsReloader(
      "frontend",
      { certFile: p.tls.frontend.certFile, keyFile: p.tls.frontend.keyFile },
      (m) => void proxy.setFrontend(m),
      logger,
      registry,
    );
    const podCa = new TlsReloader(
      "pod-ca",
      { caFile: config.pki.caCertFile },
      (m) => void proxy.setPodCa(m.ca!),
      logger,
      registry,
    );
    const proxy = createCallbackProxy({
      listen: parseHostPort(p.listen),
      metricsListen: parseHostPort(p.metricsListen),
      serviceDomain: config.global.serviceDomain,
      workerDomain: p.workerDomain,
      grpcPodPort: config.grpcproxy.replicaCount > 0 ? config.grpcproxy.workerTlsPort : undefined,
      podNetworks: [...p.podNetworks],
      upstreamTls: p.invocation.upstreamTls.enabled,
      podPort: p.invocation.upstreamTls.enabled ? p.invocation.workerTlsPort : config.invocation.port,
      frontend: { cert: frontend.material.cert!, key: frontend.material.key! },
      podCa: podCa.material.ca!,
      timeouts: {
        headersMs: p.timeouts.headersSeconds * 1000,
        idleMs: p.timeouts.idleSeconds * 1000,
        connectMs: p.timeouts.connectSeconds * 1000,
      },
      maxHeaderBytes: p.maxHeaderBytes,
      shutdownGraceMs: p.shutdownGraceSeconds * 1000,
      logger,
    });
    const urls = await proxy.listen();
    return {
      urls: { proxy: urls.proxy.origin, metrics: urls.metrics.origin },
      async close(g, delay) {
        frontend.close();
        podCa.close();
        await proxy.close(g, delay);
      },
      destroy: () => proxy.destroy(),
    };
  },
  {
    graceMs: (c) => c.workerCallbackProxy.shutdownGraceSeconds * 1000,
    drainDelayMs: (c) => c.workerCallbackProxy.drainDelaySeconds * 1000,
  },
);
