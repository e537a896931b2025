// `callplane nats rotate-worker-key`: the last step of the switch to token mode (docs/operations.md),
// and the answer to a leaked worker key. It runs on the stack's machine: it writes a new seed to
// nats.credentialsDir (the auth callout checks nkey logins against that file at every login) and
// closes, through the system account, every connection that logged in with the old key.
import type { Command } from "commander";
import { rotateWorkerKeyAndClose } from "../../lib/nats-admin.js";
import { natsAccess } from "../../lib/nats-auth.js";
import { CliError } from "../errors.js";
import { printJson } from "../output.js";
import { settingsFor } from "../settings.js";
import { stackConfig } from "./pki.js";

export function registerNats(program: Command): void {
  const nats = program.command("nats").description("the stack's NATS credentials");
  nats
    .command("rotate-worker-key")
    .description(
      "replace the shared worker nkey and close the connections that use the old one (after a switch to nats.workerAuth token, or a leak)",
    )
    .option(
      "--stack-config <file>",
      "the stack's environment file (default: ./callplane.yaml when present, else the defaults)",
    )
    .action(async (opts: { stackConfig?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const config = stackConfig(opts.stackConfig);
      let r;
      try {
        r = await rotateWorkerKeyAndClose(config.nats.credentialsDir, natsAccess(config, "api-revoker"));
      } catch (err) {
        throw new CliError(
          `could not rotate the worker key: ${(err as Error).message}. Run it on the stack's machine, with the stack's configuration (--stack-config), while nats-server runs`,
          "NATS",
        );
      }
      if (s.json) {
        printJson({ ...r, workerAuth: config.nats.workerAuth });
        return;
      }
      console.log(`new worker key: ${r.newPublicKey}`);
      console.log(`closed ${r.closed} NATS connection(s) that logged in as ${r.oldUser}`);
      if (config.nats.workerAuth === "nkey")
        console.log(
          "nats.workerAuth is nkey: workers started from now on get the new key; running ones must be replaced (redeploy)",
        );
    });
}
