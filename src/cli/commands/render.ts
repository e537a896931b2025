// `callplane render -f <env.yaml> -o <dir>`: the Kubernetes manifests of a whole control plane, from
// the environment file `npm start` uses (docs/kubernetes.md). It needs no stack and no cluster.
import type { Command } from "commander";
import { CliError, usageError } from "../errors.js";
import { note, printJson, printTable } from "../output.js";
import { settingsFor } from "../settings.js";

export function registerRender(program: Command): void {
  program
    .command("render")
    .description("write the Kubernetes manifests of a whole control plane from an environment file")
    .requiredOption("-f, --file <env.yaml>", "the environment file (the one `npm start --config` takes)")
    .requiredOption("-o, --out <dir>", "the folder to write the manifests into (created if missing)")
    .addHelpText(
      "after",
      `
Writes one YAML file per component (namespaces, configuration, certificates, NATS, the auth
callout, the API, the admin issuer, invocation, grpc-proxy, the worker callback proxy, compute,
the Gateway and the network policies), each object checked against the Kubernetes, Gateway API and
cert-manager schemas. Secrets are referenced by name and never rendered; \`callplane credentials generate\`
makes their contents. CALLPLANE__ environment overrides do not apply: the manifests follow from the
file alone. A configuration that cannot work on a cluster is refused with the keys to change.

Then: kubectl apply -f <dir>   (the walk-through: docs/kubernetes.md)`,
    )
    .action(async (opts: { file: string; out: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      // the renderer loads every Kubernetes model (most of a second): only this command pays for it
      const { RenderError, renderFile, writeRendered } = await import("../../deploy/index.js");
      const { describeObject } = await import("../../deploy/validate.js");
      const { ConfigError } = await import("../../lib/config/index.js");
      if (!opts.file) throw usageError("--file needs an environment file");
      let result;
      try {
        result = renderFile(opts.file);
      } catch (err) {
        if (err instanceof ConfigError) throw new CliError(err.message, "CONFIG");
        if (err instanceof RenderError)
          throw new CliError(err.message, "RENDER_REFUSED", {
            hint: "change the keys named above in the environment file and render again",
          });
        throw err;
      }
      let outcome;
      try {
        outcome = writeRendered(result, opts.out, opts.file);
      } catch (err) {
        if (err instanceof RenderError) throw new CliError(err.message, "RENDER_REFUSED");
        throw new CliError(`cannot write into ${opts.out}: ${(err as Error).message}`, "WRITE_FAILED");
      }
      if (s.json) {
        printJson({
          out: opts.out,
          namespace: result.namespace,
          workerNamespace: result.workerNamespace,
          files: result.files.map((f) => ({ name: f.name, objects: f.objects.map(describeObject) })),
          removed: outcome.removed,
          secrets: result.secrets,
          notes: result.notes,
        });
        return;
      }
      const count = result.files.reduce((n, f) => n + f.objects.length, 0);
      console.log(
        `rendered ${count} objects into ${opts.out} (control plane in namespace ${result.namespace}, workers in ${result.workerNamespace})`,
      );
      printTable(
        ["file", "objects"],
        result.files.map((f) => [
          f.name,
          f.objects.map((o) => `${o.kind}/${o.metadata?.name ?? ""}`).join(" "),
        ]),
      );
      for (const r of outcome.removed)
        console.log(`removed ${r} (a previous render's; nothing renders it now)`);
      console.log("");
      console.log(
        "Secrets to create first (never rendered; `callplane credentials generate` makes the callplane-* ones):",
      );
      printTable(
        ["secret", "keys", "used by"],
        result.secrets.map((x) => [x.name, x.keys.join(","), x.usedBy.join(",")]),
      );
      for (const n of result.notes) note(`note: ${n}`);
      console.log("");
      console.log(`next: kubectl apply -f ${opts.out}   (docs/kubernetes.md)`);
    });
}
