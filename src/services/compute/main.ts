import { hostname } from "node:os";
import { readServiceToken } from "../../lib/auth.js";
import { parseHostPort } from "../../lib/net.js";
import { runService } from "../../lib/service-main.js";
import { createComputeAgent } from "./agent.js";

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
        ackWaitSeconds: config.nats.consumer.ackWaitSeconds,
        streamMaxMessages: config.nats.stream.maxMessages,
        stopGraceMs: config.compute.stopGraceSeconds * 1000,
        restart: {
          initialMs: config.compute.restartBackoff.initialSeconds * 1000,
          maxMs: config.compute.restartBackoff.maxSeconds * 1000,
        },
        logLevel: config.log.level,
        workerExtraEnv: {},
      },
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
