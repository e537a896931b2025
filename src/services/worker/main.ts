import { runProcess } from "../../lib/process/index.js";
import { createWorkerAgent } from "./agent.js";
import { workerConfigFromEnv } from "./config.js";

// The worker is configured by environment (contract §3.1), not by the stack's YAML file, because it
// runs beside the inference server, wherever that is.
runProcess(
  "worker",
  () => workerConfigFromEnv(),
  (cfg) => cfg.logLevel,
  async (cfg, logger, tracing) => {
    const agent = createWorkerAgent(cfg, { logger, tracing });
    const { health } = await agent.start();
    return { urls: { health: health.origin }, close: (g) => agent.close(g), destroy: () => agent.destroy() };
  },
  { graceMs: () => 30_000, tracing: (cfg) => cfg.tracing },
);
