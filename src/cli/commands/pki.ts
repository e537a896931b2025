// `callplane pki show|issue`: the stack's CA and the certificates it issues for worker callbacks
// (the proxy's *.<workerDomain> frontend and each invocation replica's pod-name certificate).
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { Command } from "commander";
import type { Config } from "../../lib/config/index.js";
import { CliError } from "../errors.js";
import { printJson } from "../output.js";
import { settingsFor } from "../settings.js";

// lib/config, lib/nats, lib/net and lib/tls load only in the actions that read the stack's config
async function stackConfig(file: string | undefined): Promise<Config> {
  const { loadConfig, ConfigError } = await import("../../lib/config/index.js");
  try {
    return loadConfig({ file: file ?? (existsSync("callplane.yaml") ? "callplane.yaml" : undefined) });
  } catch (err) {
    if (err instanceof ConfigError) throw new CliError(err.message, "CONFIG");
    throw err;
  }
}

async function pkiModules() {
  const [nats, net, tls] = await Promise.all([
    import("../../lib/nats/index.js"),
    import("../../lib/net/index.js"),
    import("../../lib/tls/index.js"),
  ]);
  return { nats, net, tls };
}
type PkiModules = Awaited<ReturnType<typeof pkiModules>>;

function certificatesOf(config: Config, m: PkiModules) {
  const net = m.net.parseCidr(config.invocation.podNetwork);
  return m.tls.stackCertificates({
    pkiDir: config.pki.dir,
    serviceDomain: config.global.serviceDomain,
    workerDomain: config.workerCallbackProxy.workerDomain,
    proxyEnabled: config.workerCallbackProxy.enabled,
    upstreamTls: config.workerCallbackProxy.invocation.upstreamTls.enabled,
    frontendCertFile: config.workerCallbackProxy.tls.frontend.certFile,
    replicaIps: Array.from({ length: config.invocation.replicaCount }, (_, i) => m.net.cidrHost(net, i + 1)),
    natsNames: config.nats.server.enabled ? m.nats.natsCertNames(config.nats) : [],
    natsCertFile: config.nats.tls.certFile,
    natsRouteNames: config.nats.server.enabled ? m.nats.natsRouteCertNames(config.nats) : [],
    natsRouteCertFile: config.nats.cluster.tls.certFile,
  });
}

function describeFile(file: string, m: PkiModules) {
  if (!existsSync(file)) return { file, present: false as const };
  const info = m.tls.describeCert(readFileSync(file, "utf8"));
  const daysLeft = Math.floor((info.notAfter.getTime() - Date.now()) / 86_400_000);
  return {
    file,
    present: true as const,
    ...info,
    notBefore: info.notBefore.toISOString(),
    notAfter: info.notAfter.toISOString(),
    daysLeft,
  };
}

export { stackConfig };

export function registerPki(program: Command): void {
  const pki = program
    .command("pki")
    .description("the stack CA and the certificates it issues for worker callbacks");
  pki
    .command("show")
    .description("list the stack CA and every certificate the stack uses, with names and expiry")
    .option(
      "--stack-config <file>",
      "the stack's environment file (default: ./callplane.yaml when present, else the defaults)",
    )
    .action(async (opts: { stackConfig?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const config = await stackConfig(opts.stackConfig);
      const m = await pkiModules();
      const rows = [
        { name: "stack CA", ...describeFile(config.pki.caCertFile, m) },
        ...(config.workerCallbackProxy.enabled &&
        !certificatesOf(config, m).some((c) => c.name.startsWith("callback proxy"))
          ? [
              {
                name: "callback proxy frontend (operator-supplied)",
                ...describeFile(config.workerCallbackProxy.tls.frontend.certFile, m),
              },
            ]
          : []),
        ...certificatesOf(config, m).map((c) => ({
          name: c.name,
          expectedNames: c.dnsNames,
          ...describeFile(join(c.folder, m.tls.TLS_FILES.cert), m),
        })),
      ];
      if (s.json) {
        printJson({ pkiDir: config.pki.dir, certificates: rows });
        return;
      }
      console.log(`PKI folder: ${config.pki.dir}`);
      for (const r of rows) {
        if (!r.present) {
          console.log(
            `\n${r.name}\n  file:      ${r.file}\n  status:    missing (the stack issues it at start; or run \`callplane pki issue\`)`,
          );
          continue;
        }
        console.log(
          `\n${r.name}\n  file:      ${r.file}\n  subject:   ${r.subject}\n  issuer:    ${r.issuer}`,
        );
        if (r.dnsNames.length) console.log(`  names:     ${r.dnsNames.join(", ")}`);
        console.log(
          `  valid:     ${r.notBefore} to ${r.notAfter} (${r.daysLeft >= 0 ? `${r.daysLeft} days left` : "EXPIRED"})`,
        );
        console.log(`  sha256:    ${r.fingerprint256}`);
      }
    });
  pki
    .command("issue")
    .description("create the stack CA if missing, and (re)issue the certificates the stack needs")
    .option(
      "--stack-config <file>",
      "the stack's environment file (default: ./callplane.yaml when present, else the defaults)",
    )
    .option("--force", "issue new certificates even when the current ones are still good")
    .addHelpText(
      "after",
      "\nRunning services pick up new certificates by themselves (they watch the files); no restart is needed.",
    )
    .action(async (opts: { stackConfig?: string; force?: boolean }, cmd: Command) => {
      const s = settingsFor(cmd);
      const config = await stackConfig(opts.stackConfig);
      const m = await pkiModules();
      const ca = await m.tls
        .ensureCa({
          dir: config.pki.dir,
          caCertFile: config.pki.caCertFile,
          caKeyFile: config.pki.caKeyFile,
        })
        .catch((err: unknown) => {
          throw new CliError((err as Error).message, "PKI");
        });
      const done: Array<{ name: string; folder: string; action: string }> = [];
      for (const c of certificatesOf(config, m)) {
        done.push({
          name: c.name,
          folder: c.folder,
          action: await m.tls.ensureServerCert(c.folder, ca, c.dnsNames, {
            force: opts.force ?? false,
            clientAuth: c.clientAuth ?? false,
          }),
        });
      }
      if (s.json) {
        printJson({ ca: { file: config.pki.caCertFile, created: ca.created }, certificates: done });
        return;
      }
      console.log(`stack CA: ${config.pki.caCertFile}${ca.created ? " (created)" : ""}`);
      for (const d of done)
        console.log(`${d.action === "issued" ? "issued" : "kept  "}  ${d.name}  ${d.folder}`);
    });
}
