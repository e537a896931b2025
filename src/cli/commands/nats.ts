// `callplane nats rotate-worker-key`: the last step of the switch to token mode (docs/operations.md),
// and the answer to a leaked worker key. It runs on the stack's machine: it writes a new seed to
// nats.credentialsDir (the auth callout checks nkey logins against that file at every login) and
// closes, through the system account, every connection that logged in with the old key, on every
// server of a cluster.
// `callplane nats status`: the health of every NATS server (a cluster's nodes, their routes, the
// JetStream leader, each work queue's replicas), read through the system account as nats-monitor.
import type { Command } from "commander";
import { writeFileAtomic } from "../../lib/fs.js";
import { CliError } from "../errors.js";
import { printFields, printJson, printTable, say } from "../output.js";
import { settingsFor } from "../settings.js";
import { stackConfig } from "./pki.js";

// lib/nats (the NATS client) and lib/log load only in the actions that use them
export function registerNats(program: Command): void {
  const nats = program.command("nats").description("the stack's NATS: its health and credentials");
  nats
    .command("status")
    .description(
      "show every NATS server (each node of a cluster): up and healthy, its routes, the JetStream leader, each work queue's replicas",
    )
    .option(
      "--stack-config <file>",
      "the stack's environment file (default: ./callplane.yaml when present, else the defaults)",
    )
    .addHelpText("after", "\nExits 1 when a server is missing or unhealthy, so scripts can wait on it.")
    .action(async (opts: { stackConfig?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const config = await stackConfig(opts.stackConfig);
      const { connectNats, drainOrClose, natsAccess, natsClusterHealth } =
        await import("../../lib/nats/index.js");
      const { silentLogger } = await import("../../lib/log.js");
      const expected = config.nats.cluster.size;
      let nc;
      try {
        nc = await connectNats(natsAccess(config, "nats-monitor"), "callplane-cli", silentLogger());
      } catch (err) {
        throw new CliError(
          `cannot connect to NATS at ${config.nats.url}: ${(err as Error).message}`,
          "NATS_UNREACHABLE",
          {
            hint: "run it on the stack's machine, with the stack's configuration (--stack-config), while nats-server runs",
          },
        );
      }
      let h;
      try {
        h = await natsClusterHealth(nc, expected);
      } finally {
        await drainOrClose(nc);
      }
      process.exitCode = h.ok ? 0 : 1;
      if (s.json) {
        printJson(h);
        return;
      }
      printFields([
        ["servers", `${h.servers.length} of ${expected} answered`],
        ...(expected > 1
          ? ([
              ["cluster", config.nats.cluster.name],
              ["meta leader", h.metaLeader ?? "none agreed"],
            ] as Array<[string, string]>)
          : []),
        ["health", h.ok ? "ok" : "NOT OK"],
      ]);
      console.log("");
      printTable(
        ["server", "address", "health", "routes to", "leader it sees"],
        h.servers.map((x) => [
          x.name,
          x.host ?? "-",
          x.healthy ? "ok" : `${x.status}${x.error ? `: ${x.error}` : ""}`,
          x.routesTo.join(",") || "-",
          x.metaLeader ?? "-",
        ]),
      );
      if (h.streams.length) {
        console.log("");
        printTable(
          ["stream", "leader", "followers", "messages"],
          h.streams.map((x) => [
            x.name,
            x.leader ?? "none",
            x.replicas.length
              ? x.replicas
                  .map((r) => `${r.name}:${r.offline ? "offline" : r.current ? "current" : `lag ${r.lag}`}`)
                  .join(" ")
              : "-",
            x.messages === undefined ? "-" : String(x.messages),
          ]),
        );
      }
      if (h.problems.length) {
        console.log("");
        for (const p of h.problems) say(`problem: ${p}`);
      }
    });
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
      const config = await stackConfig(opts.stackConfig);
      const { natsAccess, rotateWorkerKeyAndClose } = await import("../../lib/nats/index.js");
      let r;
      try {
        r = await rotateWorkerKeyAndClose(
          config.nats.credentialsDir,
          natsAccess(config, "api-revoker"),
          config.nats.cluster.size,
        );
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
      say(`new worker key: ${r.newPublicKey}`);
      say(
        `closed ${r.closed} NATS connection(s) that logged in as ${r.oldUser}` +
          (r.expected > 1 ? ` (${r.servers.map((x) => `${x.name}: ${x.closed}`).join(", ")})` : ""),
      );
      if (r.servers.length < r.expected)
        console.log(
          `only ${r.servers.length} of ${r.expected} NATS servers (nats.cluster.size) answered: run it again once every node is up to close connections on the others`,
        );
      if (config.nats.workerAuth === "nkey")
        console.log(
          "nats.workerAuth is nkey: workers started from now on get the new key; running ones must be replaced (redeploy)",
        );
    });

  nats
    .command("auth-config")
    .description(
      "write nats-server's accounts and auth callout block from the services' nkey seeds (the NATS pods' init container runs it)",
    )
    .requiredOption("--credentials-dir <dir>", "the folder of nkey seeds (<role>.nk, auth-callout-issuer.nk)")
    .requiredOption("--region <region>", "global.region: the region the grants name")
    .requiredOption("--out <file>", "where to write it (nats-server includes it)")
    .addHelpText(
      "after",
      `
The block names only public keys, derived from the seeds: every service role of the permission
table (docs/architecture.md) and the auth callout's issuer. The local stack writes the same block
into its own nats-server configuration.`,
    )
    .action(async (opts: { credentialsDir: string; region: string; out: string }) => {
      const { natsServerAuthConfig } = await import("../../lib/nats/index.js");
      let text: string;
      try {
        text = natsServerAuthConfig(opts.credentialsDir, opts.region);
      } catch (err) {
        throw new CliError(
          `cannot build the NATS auth configuration: ${(err as Error).message}`,
          "NATS_KEYS",
        );
      }
      try {
        writeFileAtomic(opts.out, `${text}\n`, 0o600);
      } catch (err) {
        throw new CliError(`cannot write ${opts.out}: ${(err as Error).message}`, "WRITE_FAILED");
      }
      console.log(`wrote ${opts.out}`);
    });
}
