// `callplane cluster enroll`: an admin trusts a Kubernetes cluster's service-account keys, so that the
// plane verifies its workers' pod tokens. The first keys of a cluster come from an admin; after that
// the cluster's compute agent pushes changes itself (a key rotation), proving itself with its own
// pod token. Enroll again when the keys changed while the agent could not push.
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { usageError } from "../errors.js";
import { Api } from "../client.js";
import { printFields, say } from "../output.js";
import { settingsFor } from "../settings.js";

interface EnrollOptions {
  serviceAccountIssuer: string;
  jwks: string;
}

interface ClusterKeysDto {
  clusterId: string;
  issuer: string;
  keyIds: string[];
  changed: boolean;
  updatedAt: string;
  updatedBy: string;
}

function readJwks(path: string): unknown {
  let text: string;
  try {
    text = readFileSync(path === "-" ? 0 : path, "utf8");
  } catch (err) {
    throw usageError(`--jwks: cannot read ${path}: ${(err as Error).message}`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw usageError(
      `--jwks: ${path} is not JSON (${(err as Error).message}); save the cluster's key set with \`kubectl get --raw /openid/v1/jwks\``,
    );
  }
}

export function registerCluster(program: Command): void {
  const cluster = program
    .command("cluster")
    .description("trust a Kubernetes cluster's service-account keys (its workers' pod tokens)");

  cluster
    .command("enroll")
    .argument("<clusterId>", "the cluster's id (its compute agent's compute.workerIdentity.clusterId)")
    .description(
      "register (or replace) the keys a cluster signs its pods' tokens with; needs a plane-wide admin token with cluster-management",
    )
    .requiredOption(
      // (--issuer is the CLI's own: the admin token issuer's URL)
      "--service-account-issuer <url>",
      "the cluster's service-account issuer, as its API server's --service-account-issuer (`kubectl get --raw /.well-known/openid-configuration`, field issuer)",
    )
    .requiredOption(
      "--jwks <file>",
      "the cluster's key set, a JSON file or - for stdin (`kubectl get --raw /openid/v1/jwks`)",
    )
    .action(async (clusterId: string, opts: EnrollOptions, cmd: Command) => {
      const s = settingsFor(cmd);
      const jwks = readJwks(opts.jwks);
      const r = await new Api(s).call<ClusterKeysDto>(
        "PUT",
        `/v1/internal/clusters/${encodeURIComponent(clusterId)}/keys`,
        { issuer: opts.serviceAccountIssuer, jwks },
      );
      say(r.changed ? `Cluster ${r.clusterId} enrolled.` : `Cluster ${r.clusterId} already had these keys.`);
      printFields([
        ["issuer", r.issuer],
        ["key ids", r.keyIds.join(", ")],
        ["updated", `${r.updatedAt} by ${r.updatedBy}`],
      ]);
    });
}
