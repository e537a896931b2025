// The callback proxy's process. By default it starts HAProxy with the configuration it writes and
// keeps it (service.ts). With `--runtime-api <socket>` it is the certificate keeper beside an
// HAProxy that runs on its own (a Kubernetes pod's haproxy container, configured from the rendered
// ConfigMap): it watches the same certificate files and replaces them in HAProxy through the
// runtime API, and when the pod stops it withdraws HAProxy's readiness at once. Either way it
// answers the operator console's logs question with HAProxy's access-log ring
// (access-log-answers.ts), over a NATS connection of its own when it has one.
import { hostname } from "node:os";
import { natsAccess } from "../../lib/nats/index.js";
import { parseHostPort } from "../../lib/net/index.js";
import { runService, type Running } from "../../lib/process/index.js";
import { TlsReloader } from "../../lib/tls/index.js";
import { createRegistry } from "../../lib/metrics.js";
import { podTlsServers } from "./haproxy-backends.js";
import { READY_SERVER } from "./haproxy-config.js";
import { haproxySettings } from "./haproxy-options.js";
import { HaproxyRuntime } from "./haproxy.js";
import { answerAccessLogQuestions } from "./access-log-answers.js";
import { createCallbackProxy, frontendPem } from "./service.js";

function runtimeApiFromArgs(argv = process.argv.slice(2)): string | undefined {
  const i = argv.indexOf("--runtime-api");
  return i === -1 ? undefined : argv[i + 1];
}

runService(
  "callback-proxy",
  async (config, logger) => {
    const p = config.workerCallbackProxy;
    if (!p.enabled)
      throw new Error(
        "workerCallbackProxy.enabled is false: the callback proxy is turned off and must not be started",
      );
    const files = {
      frontend: { certFile: p.tls.frontend.certFile, keyFile: p.tls.frontend.keyFile },
      ca: { caFile: config.pki.caCertFile },
    };
    // the reloads are logged; HAProxy's own exporter serves the proxy's metrics
    const registry = createRegistry("callback-proxy");
    const socket = runtimeApiFromArgs();
    const accessLog = (adminSocket: string) =>
      answerAccessLogQuestions({
        nats: () => natsAccess(config, "callback-proxy"),
        adminSocket,
        // on Kubernetes the pod's name (the Downward API), else the host and pid
        replica: process.env.POD_NAME || `${hostname()}:${process.pid}`,
        logger,
      });
    if (socket) {
      // HAProxy loaded these very files (the same mounts); they are replaced under the same names
      const runtime = new HaproxyRuntime(socket, logger);
      const frontend = new TlsReloader(
        "frontend",
        files.frontend,
        (m) => runtime.replaceCertificate(files.frontend.certFile, frontendPem(m.cert!, m.key!)),
        logger,
        registry,
      );
      const podCa = new TlsReloader(
        "pod-ca",
        files.ca,
        // the TLS servers to pods as the rendered configuration has them (the same settings)
        (m) => runtime.replaceCa(files.ca.caFile, m.ca!, podTlsServers(haproxySettings(config))),
        logger,
        registry,
      );
      // the reloaders' watches and poll do not hold the process open: this does, until the stop
      const hold = setInterval(() => undefined, 2 ** 30);
      logger.info({ socket }, "keeping the certificates of the callback proxy's HAProxy");
      const answers = accessLog(socket);
      const running: Running = {
        urls: {},
        async close() {
          clearInterval(hold);
          frontend.close();
          podCa.close();
          // the pod is stopping: balancers are told at once; HAProxy drains on its own stop signal
          await runtime
            .withdrawReadiness(READY_SERVER)
            .catch((err: unknown) => logger.warn({ err }, "callback proxy readiness not withdrawn"));
          await answers.close();
        },
        destroy: () => {
          clearInterval(hold);
          frontend.close();
          podCa.close();
          void answers.close();
        },
      };
      return running;
    }
    const frontend = new TlsReloader(
      "frontend",
      files.frontend,
      (m) => proxy.setFrontend(m),
      logger,
      registry,
    );
    const podCa = new TlsReloader("pod-ca", files.ca, (m) => proxy.setPodCa(m.ca!), logger, registry);
    const settings = haproxySettings(config);
    const proxy = await createCallbackProxy({
      ...settings,
      listen: parseHostPort(p.listen),
      metricsListen: parseHostPort(p.metricsListen),
      grpcPodPort: config.grpcproxy.replicaCount > 0 ? config.grpcproxy.workerTlsPort : undefined,
      podNetworks: [...p.podNetworks],
      podPort: settings.upstreamTls ? p.invocation.workerTlsPort : config.invocation.port,
      frontend: { cert: frontend.material.cert!, key: frontend.material.key! },
      podCa: podCa.material.ca!,
      logger,
    });
    const urls = await proxy.listen();
    const answers = accessLog(proxy.adminSocket);
    return {
      urls: { proxy: urls.proxy.origin, metrics: urls.metrics.origin },
      async close(g, delay) {
        frontend.close();
        podCa.close();
        await Promise.all([answers.close(), proxy.close(g, delay)]);
      },
      destroy: () => {
        void answers.close();
        proxy.destroy();
      },
    };
  },
  {
    graceMs: (c) => c.workerCallbackProxy.shutdownGraceSeconds * 1000,
    drainDelayMs: (c) => c.workerCallbackProxy.drainDelaySeconds * 1000,
  },
);
