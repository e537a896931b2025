import { ADMISSION_WEBHOOK_STOP, computeAgentUsername } from "../../lib/config/index.js";
import { parseHostPort } from "../../lib/net/index.js";
import { runService } from "../../lib/process/index.js";
import { createAdmissionWebhook } from "./service.js";

runService(
  "admission-webhook",
  async (config, logger) => {
    const w = config.admissionWebhook;
    const agentUsername = computeAgentUsername(config);
    const hook = createAdmissionWebhook({
      listen: parseHostPort(w.listen),
      tls: { certFile: w.tls.certFile, keyFile: w.tls.keyFile },
      agentUsername,
      logger,
    });
    const url = await hook.listen();
    logger.info({ agentUsername }, "nvcf-worker-* service accounts are reserved for the compute agent");
    return {
      urls: { webhook: url.origin },
      close: (g, delay) => hook.close(g, delay),
      destroy: () => hook.destroy(),
    };
  },
  {
    graceMs: () => ADMISSION_WEBHOOK_STOP.graceSeconds * 1000,
    drainDelayMs: () => ADMISSION_WEBHOOK_STOP.drainDelaySeconds * 1000,
  },
);
