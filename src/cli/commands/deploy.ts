// `callplane deploy create|get|delete`: deployments of one function version (contract §5.2).
import type { Command } from "commander";
import { Api } from "../client.js";
import { usageError } from "../errors.js";
import { pickVersion, resolveFunction, type InstanceDto } from "../functions.js";
import { note, printFields, printJson, printTable, say } from "../output.js";
import { integer } from "../parse.js";
import { settingsFor } from "../settings.js";

interface DeploymentDto {
  deploymentId: string;
  functionId: string;
  functionVersionId: string;
  functionName: string;
  functionStatus: string;
  healthInfo?: Array<{ gpu: string; instanceType?: string; error: string }>;
  deploymentSpecifications: Array<{
    gpu: string;
    instanceType: string;
    minInstances: number;
    maxInstances: number;
    maxRequestConcurrency?: number;
  }>;
  instances?: InstanceDto[];
  createdAt: string;
  lastUpdatedAt: string;
}

interface CreateOptions {
  version?: string;
  min: number;
  max?: number;
  concurrency: number;
  gpu: string;
  instanceType: string;
}

function printDeployment(d: DeploymentDto): void {
  printFields([
    ["function", d.functionName],
    ["function id", d.functionId],
    ["version id", d.functionVersionId],
    ["deployment id", d.deploymentId],
    ["status", d.functionStatus],
    ...d.deploymentSpecifications.map((sp): [string, string] => [
      "spec",
      `gpu ${sp.gpu}, instance type ${sp.instanceType}, ${sp.minInstances} to ${sp.maxInstances} instances, concurrency ${sp.maxRequestConcurrency ?? 1}`,
    ]),
    ["created", d.createdAt],
    ["updated", d.lastUpdatedAt],
    ...(d.healthInfo ?? []).map((h): [string, string] => ["error", `${h.instanceType ?? h.gpu}: ${h.error}`]),
  ]);
  const instances = d.instances ?? [];
  console.log("");
  if (instances.length === 0) {
    console.log("instances: none yet");
    return;
  }
  printTable(
    ["INSTANCE ID", "STATUS", "TYPE", "GPU", "LOCATION", "UPDATED", "MESSAGE"],
    instances.map((i) => [
      i.instanceId,
      i.instanceStatus,
      i.instanceType,
      i.gpu,
      i.location,
      i.instanceUpdatedAt,
      i.message ?? "",
    ]),
  );
}

const path = (fid: string, vid: string) => `/v2/nvcf/deployments/functions/${fid}/versions/${vid}`;

export function registerDeploy(program: Command): void {
  const deploy = program
    .command("deploy")
    .description("deploy a function version, show its instances, undeploy it");
  const versionHelp = "the version to act on; not needed when the function has only one version";

  deploy
    .command("create")
    .description("deploy a function version: the compute backend starts instances for it")
    .argument("<function>", "function id or name")
    .option("--version <versionId>", versionHelp)
    .option("--min <count>", "fewest instances to run", integer(0, 1000), 1)
    .option("--max <count>", "most instances to run (default: --min, and at least 1)", integer(1, 1000))
    .option("--concurrency <n>", "requests one instance works on at once", integer(1, 1024), 1)
    .option(
      "--gpu <name>",
      "GPU type to run on (the local backend offers local; GET /v2/nvcf/clusterGroups lists what the clusters offer)",
      "local",
    )
    .option(
      "--instance-type <name>",
      "instance type of that GPU (the local backend offers local.cpu; a deployment naming one no cluster offers is refused)",
      "local.cpu",
    )
    .action(async (ref: string, opts: CreateOptions, cmd: Command) => {
      const max = opts.max ?? Math.max(1, opts.min);
      if (opts.min > max) {
        throw usageError(
          `--min ${opts.min} is larger than --max ${max}`,
          "give --min no larger than --max (for example --min 1 --max 2)",
        );
      }
      const s = settingsFor(cmd);
      const api = new Api(s);
      const fn = await resolveFunction(api, ref);
      const v = pickVersion(fn, opts.version, "deploy create");
      const res = await api.call<{ deployment: DeploymentDto }>("POST", path(v.id, v.versionId), {
        deploymentSpecifications: [
          {
            gpu: opts.gpu,
            instanceType: opts.instanceType,
            minInstances: opts.min,
            maxInstances: max,
            maxRequestConcurrency: opts.concurrency,
          },
        ],
      });
      if (s.json) return printJson(res);
      printDeployment(res.deployment);
      note(`next: watch the instances start with \`callplane deploy get ${fn.name}\``);
    });

  deploy
    .command("get")
    .description("show a deployment: its status and every instance with its status")
    .argument("<function>", "function id or name")
    .option("--version <versionId>", versionHelp)
    .action(async (ref: string, opts: { version?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const api = new Api(s);
      const v = pickVersion(await resolveFunction(api, ref), opts.version, "deploy get");
      const res = await api.call<{ deployment: DeploymentDto }>("GET", path(v.id, v.versionId));
      if (s.json) return printJson(res);
      printDeployment(res.deployment);
    });

  deploy
    .command("delete")
    .description("undeploy a function version: its instances are stopped")
    .argument("<function>", "function id or name")
    .option("--version <versionId>", versionHelp)
    .action(async (ref: string, opts: { version?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const api = new Api(s);
      const fn = await resolveFunction(api, ref);
      const v = pickVersion(fn, opts.version, "deploy delete");
      const res = await api.call<{ deployment: DeploymentDto }>("DELETE", path(v.id, v.versionId));
      if (s.json) return printJson(res);
      say(`undeployed version ${v.versionId} of function ${fn.name}`);
      printFields([
        ["deployment id", res.deployment.deploymentId],
        ["status", res.deployment.functionStatus],
      ]);
    });
}
