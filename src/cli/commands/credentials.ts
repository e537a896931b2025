// `callplane credentials generate -f <env.yaml> -o <dir>`: the contents of the Secrets that
// `callplane render`'s manifests reference by name (service tokens, NATS nkeys, signing keys, the MEK
// keyring), one folder per Secret, made by the same functions the local stack uses on first start.
// They stay on this machine until you create the Secrets from them; nothing is sent anywhere.
import { existsSync } from "node:fs";
import { join } from "node:path";
import type { Command } from "commander";
import { writeFileAtomic } from "../../lib/fs.js";
import { CliError } from "../errors.js";
import { printJson } from "../output.js";
import { settingsFor } from "../settings.js";

export function registerCredentials(program: Command): void {
  const credentials = program
    .command("credentials")
    .description("the control plane's own keys and tokens, for the Secrets of a Kubernetes install");
  credentials
    .command("generate")
    .description("write the contents of every Secret `callplane render` references, one folder per Secret")
    .requiredOption("-f, --file <env.yaml>", "the environment file you render")
    .requiredOption("-o, --out <dir>", "the folder to write them into (mode 0700); what exists is kept")
    .addHelpText(
      "after",
      `
Writes <dir>/<secret>/<key> for the Secrets callplane-service-tokens, callplane-nats-keys,
callplane-admin-key, callplane-admin-issuer-key and callplane-issuer-operator (the operator
credential \`callplane init --operator-credential\` presents; while adminIssuerProxy.enabled),
callplane-worker-identity-key and callplane-mek (file or env provider), and the stack's admin
signing key in <dir>/private/ (it stays with you: \`callplane admin token\` signs with it; the
cluster gets only its public key). Files that exist are kept, so running it again changes nothing.
Then create each Secret with the kubectl line it prints. The output is key material: keep the
folder private, and out of version control.`,
    )
    .action(async (opts: { file: string; out: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      // the deploy module loads every Kubernetes model (most of a second): only this command pays for it
      const { loadForCluster } = await import("../../deploy/index.js");
      const { clusterNames } = await import("../../deploy/cluster-config.js");
      const { SECRETS } = await import("../../deploy/layout.js");
      const { ConfigError } = await import("../../lib/config/index.js");
      const { ensureAdminKeyPair, ensureIdentityKey, ensureOperatorCredential, ensureServiceTokens } =
        await import("../../lib/identity/index.js");
      const { ensureNatsKeys } = await import("../../lib/nats/index.js");
      const { ensureKeyringFile, KEYRING_FORMAT, newKeyringEntry } =
        await import("../../lib/secrets/index.js");
      let config;
      try {
        config = loadForCluster(opts.file).config;
      } catch (err) {
        if (err instanceof ConfigError) throw new CliError(err.message, "CONFIG");
        throw err;
      }
      const ns = clusterNames(config.global.serviceDomain)?.namespace;
      if (!ns)
        throw new CliError(
          `global.serviceDomain is ${config.global.serviceDomain}, not <namespace>.svc.<cluster domain>: it names the namespace the Secrets go in`,
          "CONFIG",
        );
      const dir = (secret: string) => join(opts.out, secret);
      const made: Array<{ secret: string; folder: string }> = [];
      try {
        ensureServiceTokens(dir(SECRETS.serviceTokens));
        made.push({ secret: SECRETS.serviceTokens, folder: dir(SECRETS.serviceTokens) });
        ensureNatsKeys(dir(SECRETS.natsKeys));
        made.push({ secret: SECRETS.natsKeys, folder: dir(SECRETS.natsKeys) });
        ensureAdminKeyPair(
          join(opts.out, "private", "admin-signing.key.pem"),
          join(dir(SECRETS.adminKey), "admin-signing.pub.pem"),
        );
        made.push({ secret: SECRETS.adminKey, folder: dir(SECRETS.adminKey) });
        if (config.adminIssuerProxy.enabled) {
          ensureAdminKeyPair(
            join(dir(SECRETS.issuerKey), "admin-issuer.key.pem"),
            join(dir(SECRETS.issuerKey), "admin-issuer.pub.pem"),
          );
          made.push({ secret: SECRETS.issuerKey, folder: dir(SECRETS.issuerKey) });
          ensureOperatorCredential(join(dir(SECRETS.issuerOperator), "issuer-operator.secret"));
          made.push({ secret: SECRETS.issuerOperator, folder: dir(SECRETS.issuerOperator) });
        }
        ensureIdentityKey(join(dir(SECRETS.workerIdentity), "worker-identity.key.pem"));
        made.push({ secret: SECRETS.workerIdentity, folder: dir(SECRETS.workerIdentity) });
        const mek = config.secrets.mek.provider;
        if (mek === "file") {
          ensureKeyringFile(join(dir(SECRETS.mek), "mek.json"));
          made.push({ secret: SECRETS.mek, folder: dir(SECRETS.mek) });
        } else if (mek === "env") {
          const file = join(dir(SECRETS.mek), "keyring");
          if (!existsSync(file))
            writeFileAtomic(
              file,
              JSON.stringify({ format: KEYRING_FORMAT, keys: [newKeyringEntry()] }),
              0o600,
            );
          made.push({ secret: SECRETS.mek, folder: dir(SECRETS.mek) });
        }
      } catch (err) {
        throw new CliError(
          `cannot write the credentials into ${opts.out}: ${(err as Error).message}`,
          "WRITE_FAILED",
        );
      }
      const commands = made.map(
        (m) => `kubectl create secret generic ${m.secret} -n ${ns} --from-file=${m.folder}/`,
      );
      if (config.api.database.driver === "postgres")
        commands.push(
          `kubectl create secret generic ${SECRETS.database} -n ${ns} --from-literal=url='postgres://<user>:<password>@<host>:5432/<database>'`,
        );
      if (s.json) {
        printJson({ namespace: ns, secrets: made, commands });
        return;
      }
      console.log(`wrote the credentials into ${opts.out} (existing files kept); create the Secrets with:`);
      for (const c of commands) console.log(`  ${c}`);
      console.log(
        `the stack's admin signing key stays in ${join(opts.out, "private")}: \`callplane admin token\` signs admin tokens with it`,
      );
    });
}
