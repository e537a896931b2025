import { readServiceToken } from "../../lib/identity/index.js";
import { loadConfig } from "../../lib/config/index.js";
import {
  NATS_ACCOUNTS,
  natsAccess,
  publicKeyOf,
  readCalloutIssuerSeed,
  readWorkerSeed,
} from "../../lib/nats/index.js";
import { configFileFromArgs, runProcess } from "../../lib/process/index.js";
import { createNatsAuthCallout, type WebhookPlugin } from "./service.js";

// Its own logging settings (natsAuthCalloutService.serviceConfig.logging), as upstream's chart has;
// plugins are read here, once: a change of nats.workerAuth or the webhook URL needs a restart.
runProcess(
  "nats-auth-callout",
  () => loadConfig({ file: configFileFromArgs() }),
  (c) => c.natsAuthCalloutService.serviceConfig.logging.level,
  async (config, logger) => {
    const hook = config.nats.authCallout.workerTokenAuth.webhookUrl;
    const plugins: Record<string, Record<string, WebhookPlugin>> = config.nats.workerAuth === "token"
      ? {
          [NATS_ACCOUNTS.app]: {
            webhook: {
              url: hook,
              serviceToken: readServiceToken(config.auth.serviceTokenDir, "nats-auth-callout"),
            },
          },
        }
      : {};
    const callout = createNatsAuthCallout({
      nats: natsAccess(config, "nats-auth-callout"),
      issuerSeed: readCalloutIssuerSeed(config.nats.credentialsDir),
      plugins,
      // read at every nkey login: `callplane nats rotate-worker-key` takes effect at once
      nkeyWorker: {
        publicKey: () => publicKeyOf(readWorkerSeed(config.nats.credentialsDir)),
        region: config.global.region,
      },
      sampling: config.natsAuthCalloutService.serviceConfig.logging.sampling,
      logger,
    });
    await callout.start();
    logger.info({ workerAuth: config.nats.workerAuth, webhookUrl: hook }, "worker auth mode");
    return { urls: {}, close: () => callout.close(), destroy: () => callout.destroy() };
  },
);
