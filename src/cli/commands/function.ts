// `callplane function create|list|get|delete`: functions and their versions (contract §5.1).
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { Api } from "../client.js";
import { CliError, usageError } from "../errors.js";
import { pickVersion, resolveFunction, type FunctionDto } from "../functions.js";
import { note, printFields, printJson, printTable, say } from "../output.js";
import { collect, integer, path } from "../parse.js";
import { settingsFor } from "../settings.js";

interface CreateOptions {
  name?: string;
  inferenceUrl?: string;
  inferencePort?: number;
  image?: string;
  healthUri?: string;
  healthPort?: number;
  args?: string;
  env?: string[];
  tag?: string[];
  description?: string;
  file?: string;
}

function readBodyFile(file: string): Record<string, unknown> {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw usageError(`cannot read --file ${file}: ${(err as Error).message}`);
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    // the parser quotes the text, which may hold secret values: keep only where it stopped
    const where = /position \d+/.exec((err as Error).message)?.[0];
    throw usageError(`--file ${file} is not valid JSON${where ? ` (at ${where})` : ""}`);
  }
  if (!doc || typeof doc !== "object" || Array.isArray(doc)) {
    throw usageError(`--file ${file} must hold one JSON object (a CreateFunctionRequest)`);
  }
  return doc as Record<string, unknown>;
}

/** The create request: the --file body if any, with the flags given on the line on top. */
export function createBody(o: CreateOptions): Record<string, unknown> {
  const body = o.file ? readBodyFile(o.file) : {};
  const set = (key: string, value: unknown) => {
    if (value !== undefined) body[key] = value;
  };
  set("name", o.name);
  set("inferenceUrl", o.inferenceUrl);
  set("inferencePort", o.inferencePort);
  set("containerImage", o.image);
  set("containerArgs", o.args);
  set("description", o.description);
  set("tags", o.tag);
  if (o.env) {
    body.containerEnvironment = o.env.map((kv) => {
      const i = kv.indexOf("=");
      if (i <= 0) throw usageError(`--env "${kv}" is not KEY=VALUE`, "for example --env LOG_LEVEL=debug");
      return { key: kv.slice(0, i), value: kv.slice(i + 1) };
    });
  }
  if (o.healthUri !== undefined || o.healthPort !== undefined) {
    const health = body.health && typeof body.health === "object" ? { ...body.health } : {};
    body.health = {
      ...health,
      ...(o.healthUri !== undefined ? { uri: o.healthUri } : {}),
      ...(o.healthPort !== undefined ? { port: o.healthPort } : {}),
    };
  }
  const missing = [
    body.name === undefined && "--name",
    body.inferenceUrl === undefined && "--inference-url",
    body.containerImage === undefined && !("models" in body) && !("helmChart" in body) && "--image",
  ].filter((x): x is string => typeof x === "string");
  if (missing.length) {
    throw usageError(
      `function create needs ${missing.join(", ")}${o.file ? ` (or the same fields in ${o.file})` : ""}`,
      "for example: callplane function create --name echo --inference-url /echo --image local/echo",
    );
  }
  return body;
}

export function functionFields(f: FunctionDto): Array<[string, string | number | undefined]> {
  const h = f.health;
  const instances = f.activeInstances ?? [];
  return [
    ["name", f.name],
    ["function id", f.id],
    ["version id", f.versionId],
    ["status", f.status],
    ["inference url", f.inferenceUrl],
    ["inference port", f.inferencePort],
    ["image", f.containerImage],
    ["args", f.containerArgs],
    [
      "environment",
      f.containerEnvironment?.length
        ? f.containerEnvironment.map((e) => `${e.key}=${e.value}`).join(" ")
        : undefined,
    ],
    [
      "health",
      h
        ? `${h.protocol} ${h.uri} on port ${h.port ?? f.inferencePort}, expects ${h.expectedStatusCode} within ${h.timeout}`
        : undefined,
    ],
    ["type", f.functionType],
    ["tags", f.tags?.length ? f.tags.join(", ") : undefined],
    ["description", f.description],
    ["secrets", f.secrets?.length ? `${f.secrets.join(", ")} (names only)` : undefined],
    ["created", f.createdAt],
    [
      "instances",
      instances.length ? instances.map((i) => `${i.instanceId} ${i.instanceStatus}`).join(", ") : "none",
    ],
  ];
}

export function registerFunction(program: Command): void {
  const fn = program
    .command("function")
    .description("create, list, show and delete functions (a function has one or more versions)");

  fn.command("create")
    .description("register a new function (its first version)")
    .option("--name <name>", "unique name: letters, digits, _ and -, starting with a letter or digit")
    .option("--inference-url <path>", "path the inference server answers on, e.g. /echo", path("/echo"))
    .option("--inference-port <port>", "port of the inference server (default 8000)", integer(1, 65535))
    .option(
      "--image <containerImage>",
      "container image to run; with local compute, local/echo is the built-in echo server",
    )
    .option(
      "--health-uri <path>",
      "health check path on the inference server (default /v2/health/ready)",
      path("/health"),
    )
    .option("--health-port <port>", "health check port (default: the inference port)", integer(1, 65535))
    .option("--args <containerArgs>", "arguments for the container's command")
    .option("--env <KEY=VALUE>", "environment variable for the container (repeatable)", collect)
    .option("--tag <tag>", "tag (repeatable)", collect)
    .option("--description <text>", "free-text description")
    .option(
      "--file <json>",
      "read a CreateFunctionRequest from a JSON file; flags given too override its fields",
    )
    .addHelpText(
      "after",
      "\nExample:\n  callplane function create --name echo --inference-url /echo --image local/echo --health-uri /health",
    )
    .action(async (opts: CreateOptions, cmd: Command) => {
      const s = settingsFor(cmd);
      const body = createBody(opts);
      const res = await new Api(s).call<{ function: FunctionDto }>("POST", "/v2/nvcf/functions", body);
      if (s.json) return printJson(res);
      printFields(functionFields(res.function));
      note(`next: deploy it with \`callplane deploy create ${res.function.name}\``);
    });

  fn.command("list")
    .description("list every function version")
    .action(async (_opts: unknown, cmd: Command) => {
      const s = settingsFor(cmd);
      const res = await new Api(s).call<{ functions: FunctionDto[] }>("GET", "/v2/nvcf/functions");
      if (s.json) return printJson(res);
      if (res.functions.length === 0) {
        console.log("no functions yet; create one with `callplane function create`");
        return;
      }
      const rows = [...res.functions]
        .sort((a, b) => a.name.localeCompare(b.name) || a.createdAt.localeCompare(b.createdAt))
        .map((f) => [f.name, f.id, f.versionId, f.status, f.containerImage ?? "", f.createdAt]);
      printTable(["NAME", "FUNCTION ID", "VERSION ID", "STATUS", "IMAGE", "CREATED"], rows);
    });

  fn.command("get")
    .description("show a function's versions in detail")
    .argument("<function>", "function id or name")
    .option("--version <versionId>", "show only this version")
    .action(async (ref: string, opts: { version?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const found = await resolveFunction(new Api(s), ref);
      const versions = opts.version ? [pickVersion(found, opts.version, "function get")] : found.versions;
      if (s.json) return printJson(opts.version ? { function: versions[0] } : { functions: versions });
      versions.forEach((v, i) => {
        if (i > 0) console.log("");
        printFields(functionFields(v));
      });
    });

  fn.command("delete")
    .description("delete a function version, or every version of a function")
    .argument("<function>", "function id or name")
    .option("--version <versionId>", "delete only this version (default: every version)")
    .addHelpText(
      "after",
      "\nA deployed version cannot be deleted: undeploy it first with `callplane deploy delete`.",
    )
    .action(async (ref: string, opts: { version?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const api = new Api(s);
      const found = await resolveFunction(api, ref);
      // deployed versions first: if the API refuses one, nothing has been deleted yet
      const versions = opts.version
        ? [pickVersion(found, opts.version, "function delete")]
        : [...found.versions].sort(
            (a, b) => Number(a.status === "INACTIVE") - Number(b.status === "INACTIVE"),
          );
      const deleted: Array<{ functionId: string; versionId: string }> = [];
      for (const v of versions) {
        try {
          await api.call("DELETE", `/v2/nvcf/functions/${v.id}/versions/${v.versionId}`);
        } catch (err) {
          if (!(err instanceof CliError)) throw err;
          const done = deleted.length
            ? ` (versions deleted before this one: ${deleted.map((d) => d.versionId).join(", ")})`
            : "";
          throw new CliError(`${err.message}${done}`, err.code, {
            ...(err.status !== undefined ? { status: err.status } : {}),
            hint:
              err.code === "VERSION_DEPLOYED"
                ? `undeploy it first with \`callplane deploy delete ${found.name} --version ${v.versionId}\``
                : err.hint,
          });
        }
        deleted.push({ functionId: v.id, versionId: v.versionId });
        if (!s.json) say(`deleted version ${v.versionId} of function ${found.name}`);
      }
      if (s.json) printJson({ deleted });
    });

  fn.command("share")
    .description("let another account list and invoke a function (NVCF's function authorizations)")
    .argument("<function>", "function id or name")
    .argument("<account>", "the id of the account to share it with")
    .action((ref: string, account: string, _opts: unknown, cmd: Command) =>
      changeSharing(cmd, ref, "add", account),
    );

  fn.command("unshare")
    .description("stop sharing a function with an account")
    .argument("<function>", "function id or name")
    .argument("<account>", "the id of the account it is shared with")
    .action((ref: string, account: string, _opts: unknown, cmd: Command) =>
      changeSharing(cmd, ref, "remove", account),
    );
}

/** PATCH .../add or .../remove, then the accounts the function is shared with. */
async function changeSharing(cmd: Command, ref: string, how: "add" | "remove", ncaId: string): Promise<void> {
  const s = settingsFor(cmd);
  const api = new Api(s);
  const found = await resolveFunction(api, ref);
  const r = await api.call<{ function: { id: string; authorizedParties: Array<{ ncaId: string }> } }>(
    "PATCH",
    `/v2/nvcf/authorizations/functions/${found.id}/${how}`,
    { authorizedParty: { ncaId } },
  );
  if (s.json) return printJson(r);
  const parties = r.function.authorizedParties.map((p) => p.ncaId);
  say(
    `${how === "add" ? "shared" : "stopped sharing"} ${found.name} with ${ncaId}; shared with: ${parties.join(", ") || "no account"}`,
  );
}
