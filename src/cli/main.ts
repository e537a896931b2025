// The `callplane` command: `callplane <noun> <verb>` against a callplane stack. Runtime failures
// print one `callplane: <what> (<CODE>)` line and a hint, never usage text; usage errors (a bad
// flag, a missing argument) exit 2, other errors exit 1.
import { Command, CommanderError } from "commander";
import { registerAdmin } from "./commands/admin.js";
import { registerCredentials } from "./commands/credentials.js";
import { registerDeploy } from "./commands/deploy.js";
import { registerFunction } from "./commands/function.js";
import { registerInit } from "./commands/init.js";
import { registerInvoke } from "./commands/invoke.js";
import { registerAccount } from "./commands/account.js";
import { registerCluster } from "./commands/cluster.js";
import { registerKey } from "./commands/key.js";
import { registerNats } from "./commands/nats.js";
import { registerPki } from "./commands/pki.js";
import { registerRender } from "./commands/render.js";
import { registerSecret } from "./commands/secret.js";
import { registerSecrets } from "./commands/secrets.js";
import { registerStatus } from "./commands/status.js";
import { registerTrace } from "./commands/trace.js";
import { printJson, reportError } from "./output.js";
import { DEFAULT_API_URL, DEFAULT_ISSUER_URL, type GlobalOptions } from "./settings.js";

const WHERE = `
Where settings come from (the first one found wins):
  admin token     CALLPLANE_TOKEN; \`token:\` in the CLI config file; the state file written by
                  \`callplane init\` or \`callplane admin token --save\`
  API URL         --api; CALLPLANE_API_URL; \`apiUrl:\` in the CLI config file; \`api\` in
                  ./.callplane/stack.json; ${DEFAULT_API_URL}
  issuer URL      --issuer; CALLPLANE_ISSUER_URL; \`issuerUrl:\`; \`issuer\` in stack.json; ${DEFAULT_ISSUER_URL}
  invocation URL  --invocation-url; CALLPLANE_INVOCATION_URL; \`invocationUrl:\`; \`invocation[0]\` in stack.json
  API key         --api-key; CALLPLANE_API_KEY; \`apiKey:\`; \`demo.apiKey\` in stack.json (for invoke)

Files:
  CLI config      --config <file>, else CALLPLANE_CLI_CONFIG, else ~/.config/callplane/config.yaml if it
                  exists; YAML with the keys token, apiUrl, issuerUrl, invocationUrl, apiKey
  state file      $CALLPLANE_STATE_DIR/state.json, else ~/.config/callplane/state.json (mode 0600)
  stack file      ./.callplane/stack.json, written by \`npm start\` in this folder
                  (CALLPLANE__GLOBAL__DATA_DIR names another data folder)

Getting started (with \`npm start\` running in another terminal):
  callplane init
  callplane function create --name echo --inference-url /echo --image local/echo --health-uri /health
  callplane deploy create echo
  callplane key create --description demo
  callplane invoke echo --api-key <key> --data '{"message":"hello"}'
  printf '%s' "$TOKEN" | callplane secret set echo API_TOKEN

Exit codes: 0 success, 1 error, 2 usage error.`;

const ADMIN = `
Needs an admin token: CALLPLANE_TOKEN, \`token:\` in the CLI config file, or the state file that
\`callplane init\` writes. The API URL comes from --api, CALLPLANE_API_URL, \`apiUrl:\` in the CLI
config file, \`api\` in ./.callplane/stack.json, else ${DEFAULT_API_URL}.`;

function fullName(cmd: Command): string {
  const names: string[] = [];
  for (let c: Command | null = cmd; c; c = c.parent) names.unshift(c.name());
  return names.join(" ");
}

/** Commander's own errors in the CLI's layout: `callplane: <what> (USAGE)`, then its suggestion. */
function formatCommanderError(text: string): string {
  const [first = "", ...rest] = text.trimEnd().split("\n");
  return `${[`${first.replace(/^error: /, "callplane: ")} (USAGE)`, ...rest].join("\n")}\n`;
}

function configure(cmd: Command, adminHelp: boolean): void {
  cmd.exitOverride();
  cmd.configureHelp({ showGlobalOptions: true });
  cmd.configureOutput({ outputError: (text, write) => write(formatCommanderError(text)) });
  cmd.showHelpAfterError(`hint: see \`${fullName(cmd)} --help\``);
  if (adminHelp && cmd.name() !== "help") cmd.addHelpText("after", ADMIN);
  for (const c of cmd.commands) {
    configure(c, adminHelp || ["function", "deploy", "key", "secret", "secrets"].includes(c.name()));
  }
}

export function buildProgram(): Command {
  const program = new Command("callplane")
    .description("manage and call functions on a callplane stack (an NVCF-compatible invocation plane)")
    .option("--json", 'print machine-readable JSON on stdout (errors too, as {"error": ...})')
    .option(
      "--api <url>",
      `control-plane API URL (default: CALLPLANE_API_URL, the CLI config, stack.json, else ${DEFAULT_API_URL})`,
    )
    .option(
      "--issuer <url>",
      `admin token issuer URL (default: CALLPLANE_ISSUER_URL, the CLI config, stack.json, else ${DEFAULT_ISSUER_URL})`,
    )
    .option(
      "--account <id>",
      "act for this account (an ncaId; a plane-wide admin token may act for any; default: CALLPLANE_ACCOUNT, else the token's own or the default account)",
    )
    .option(
      "--config <file>",
      "CLI config file (YAML; default: CALLPLANE_CLI_CONFIG, else ~/.config/callplane/config.yaml)",
    )
    .helpCommand("help [command]", "show help for a command")
    .addHelpText("after", WHERE);
  registerInit(program);
  registerStatus(program);
  registerFunction(program);
  registerDeploy(program);
  registerKey(program);
  registerCluster(program);
  registerAccount(program);
  registerInvoke(program);
  registerTrace(program);
  registerSecret(program);
  registerSecrets(program);
  registerAdmin(program);
  registerPki(program);
  registerNats(program);
  registerRender(program);
  registerCredentials(program);
  configure(program, false);
  return program;
}

async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  const json = () => program.opts<GlobalOptions>().json === true || argv.includes("--json");
  try {
    await program.parseAsync(argv, { from: "user" });
    return typeof process.exitCode === "number" ? process.exitCode : 0;
  } catch (err) {
    if (err instanceof CommanderError) {
      // help and usage were already written by commander
      if (err.exitCode === 0) return 0;
      if (json() && err.code !== "commander.help") {
        printJson({ error: { code: "USAGE", message: err.message.replace(/^error: /, "") } });
      }
      return 2;
    }
    return reportError(err, json());
  }
}

// a reader that stops early (`callplane function list | head -1`) is not an error
process.stdout.on("error", (err: NodeJS.ErrnoException) => {
  if (err.code === "EPIPE") process.exit(0);
  throw err;
});

main(process.argv.slice(2))
  .then((code) => process.exit(code))
  .catch((err: unknown) => {
    console.error("callplane: unexpected failure:", err);
    process.exit(1);
  });
