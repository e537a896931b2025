import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Config } from "../../lib/config/index.js";
import { TLS_FILES } from "../../lib/tls/index.js";
import { hostname } from "node:os";
import { readServiceToken } from "../../lib/identity/index.js";
import { parseHostPort } from "../../lib/net/index.js";
import { runService } from "../../lib/process/index.js";
import { createComputeAgent } from "./agent.js";
import { secretsRoot } from "./secrets.js";
import { tokenSource } from "./identity.js";

/**
 * What workers need to call back through the callback proxy on this machine: its name mapped to its
 * address (no DNS serves *.<workerDomain> here), and the stack CA when the proxy's certificate
 * comes from it.
 */
function workerProxyEnv(config: Config): Record<string, string> {
  const p = config.workerCallbackProxy;
  if (!p.enabled) return {};
  const host = new URL(config.global.workerEndpoints.invocationProxyURL).hostname;
  const proxyIp = parseHostPort(p.listen).host;
  const env: Record<string, string> = {};
  // invocation.<workerDomain> for HTTP callbacks, every <dashed-ip>.<workerDomain> for gRPC tunnels.
  // A proxy on every address (0.0.0.0: a pod of `callplane render`) is not on this machine: there
  // the names resolve through DNS, as they do for any worker.
  if (proxyIp !== "0.0.0.0" && proxyIp !== "::")
    env.CALLPLANE_WORKER_HOST_MAP = `${host}=${proxyIp},*.${p.workerDomain}=${proxyIp}`;
  if (p.tls.frontend.certFile === join(config.pki.dir, "proxy", TLS_FILES.cert))
    env.NVCF_PROXY_CA_PEM = readFileSync(config.pki.caCertFile, "utf8");
  return env;
}

runService(
  "compute",
  async (config, logger) => {
    const agent = createComputeAgent({
      listen: parseHostPort(config.compute.listen),
      apiUrl: config.api.url,
      serviceToken: readServiceToken(config.auth.serviceTokenDir, "compute"),
      instanceNetwork: config.compute.instanceNetwork,
      syncIntervalMs: config.compute.syncIntervalSeconds * 1000,
      reporter: `local-${hostname()}`,
      instanceEnv: {
        natsUrl: config.nats.url,
        region: config.global.region,
        serviceDomain: config.global.serviceDomain,
        dataDir: config.global.dataDir,
        keepAliveSeconds: config.worker.keepAliveSeconds,
        inferenceIdleSeconds: config.worker.inferenceIdleSeconds,
        ackWaitSeconds: config.nats.consumer.ackWaitSeconds,
        streamMaxMessages: config.nats.stream.maxMessages,
        streamMaxMessageBytes: config.nats.stream.maxMessageBytes,
        streamReplicas: config.nats.stream.replicas,
        stopGraceMs: config.compute.stopGraceSeconds * 1000,
        restart: {
          initialMs: config.compute.restartBackoff.initialSeconds * 1000,
          maxMs: config.compute.restartBackoff.maxSeconds * 1000,
        },
        logLevel: config.log.level,
        workerExtraEnv: workerProxyEnv(config),
        natsCaPem: readFileSync(config.nats.tls.caFile, "utf8"),
      },
      secrets: {
        root: secretsRoot(config.global.dataDir, config.compute.secrets.dir),
        env: config.compute.secrets.env,
      },
      tokenSource: tokenSource(config.compute.workerIdentity.tokenSource),
      local: config.compute.local,
      logger,
    });
    // Fix: an agent that dies (an uncaught error, a second stop signal) left its inference servers
    // running: unlike the workers they have no control channel to notice, and they kept the
    // instance addresses busy for the agent's next start. Whatever ends this process ends them.
    process.on("exit", () => {
      for (const i of agent.instances()) i.killNow();
    });
    const url = await agent.listen();
    return { urls: { compute: url.origin }, close: (g) => agent.close(g), destroy: () => agent.destroy() };
  },
  { graceMs: (c) => (c.compute.stopGraceSeconds + 5) * 1000 },
);
