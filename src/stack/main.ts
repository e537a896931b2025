// `npm start`: runs a whole callplane stack on this machine and keeps it serving until Ctrl-C.
import { existsSync } from "node:fs";
import { resolve } from "node:path";
import { ConfigError, loadConfig } from "../lib/config.js";
import { parseHostPort, type HostPort } from "../lib/net.js";
import { LocalStack, StackError, type StackInfo } from "./stack.js";

function say(line: string): void {
  console.log(`callplane: ${line}`);
}

function configFile(argv: string[]): string | undefined {
  const i = argv.indexOf("--config");
  if (i !== -1) {
    const f = argv[i + 1];
    if (!f) throw new StackError("--config needs a file name");
    return resolve(f);
  }
  if (process.env.CALLPLANE_CONFIG) return resolve(process.env.CALLPLANE_CONFIG);
  return existsSync("callplane.yaml") ? resolve("callplane.yaml") : undefined;
}

async function main(): Promise<void> {
  const file = configFile(process.argv.slice(2));
  const config = loadConfig({ file });
  const stack = new LocalStack({ config, configFile: file, say });
  let stopping = false;
  const stop = (why: string) => {
    if (stopping) {
      say("stopping now");
      stack.killAll();
      process.exit(130);
    }
    stopping = true;
    say(`${why}: stopping the stack (Ctrl-C again to stop at once)`);
    stack
      .stop(config.invocation.shutdownGraceSeconds * 1000)
      .then(() => {
        say("stopped");
        process.exit(0);
      })
      .catch((err: unknown) => {
        console.error(err);
        process.exit(1);
      });
  };
  process.on("SIGINT", () => stop("interrupted"));
  process.on("SIGTERM", () => stop("terminated"));
  process.on("SIGHUP", () => stop("hung up"));
  process.on("exit", () => stack.killAll());

  stack.claim();
  const addresses: Array<[string, HostPort]> = [];
  if (config.nats.server.enabled) addresses.push(["nats-server", parseHostPort(config.nats.server.listen)]);
  addresses.push(["api", parseHostPort(config.api.listen)]);
  if (config.adminIssuerProxy.enabled)
    addresses.push(["admin-issuer", parseHostPort(config.adminIssuerProxy.listen)]);
  await stack.preflight(addresses);
  say(`starting a local stack in ${stack.dataDir}`);
  stack.prepareSecrets();

  const nats = config.nats.server.enabled ? await stack.startNats() : config.nats.url;
  say(`nats-server   ${nats}`);
  const api = (await stack.startService("api", "api")).api;
  say(`api           ${api}`);
  let issuer: string | undefined;
  if (config.adminIssuerProxy.enabled) {
    issuer = (await stack.startService("admin-issuer", "admin-issuer")).issuer!;
    say(`admin-issuer  ${issuer}   (unauthenticated by design: loopback only, never expose it)`);
  }
  const info: StackInfo = {
    api,
    ...(issuer ? { issuer } : {}),
    nats,
    invocation: [],
    grpc: [],
    dataDir: stack.dataDir,
    logs: stack.logDir,
    startedAt: new Date().toISOString(),
    pid: process.pid,
  };
  stack.writeStackFile(info);
  say(`ready: ${stack.stackFile} lists every address; logs are in ${stack.logDir}`);
  say("try: bin/callplane init && bin/callplane function list");
}

main().catch((err: unknown) => {
  if (err instanceof StackError || err instanceof ConfigError) {
    console.error(`callplane: ${err.message}`);
  } else {
    console.error("callplane: the stack failed to start:", err);
  }
  process.exit(1);
});
