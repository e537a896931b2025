// `callplane status`: where the stack is, whether each service answers, and which credentials the
// other commands would use (never printing them).
import { connect } from "node:net";
import type { Command } from "commander";
import { freshTokenAdvice, networkError, type Service } from "../client.js";
import { apiInfo } from "./init.js";
import { printFields, printJson, relative } from "../output.js";
import { DEFAULT_CONFIG_FILE, settingsFor, tildify, type Sourced } from "../settings.js";

interface Check {
  name: string;
  url: string | undefined;
  from: string;
  state: "ok" | "unhealthy" | "unreachable" | "disabled" | "not configured";
  detail?: string;
}

async function httpCheck(name: string, label: string, url: Sourced): Promise<Check> {
  const base = { name, url: url.value, from: url.from };
  try {
    const res = await fetch(`${url.value}/health`, { signal: AbortSignal.timeout(3000), redirect: "manual" });
    const body = (await res.json().catch(() => undefined)) as { status?: unknown } | undefined;
    const said = typeof body?.status === "string" ? body.status : undefined;
    if (res.ok) return { ...base, state: "ok" };
    return { ...base, state: "unhealthy", detail: `HTTP ${res.status}${said ? ` (${said})` : ""}` };
  } catch (err) {
    const service: Service = { label, code: "X", url };
    const reason = networkError(err, service, 3000).extra?.reason;
    return { ...base, state: "unreachable", detail: typeof reason === "string" ? reason : "no answer" };
  }
}

function tcpCheck(name: string, url: Sourced): Promise<Check> {
  const base = { name, url: url.value, from: url.from };
  const u = new URL(url.value);
  return new Promise((resolve) => {
    const sock = connect({ host: u.hostname, port: Number(u.port || 4222), timeout: 3000 });
    const done = (c: Check) => {
      sock.destroy();
      resolve(c);
    };
    sock.once("connect", () => done({ ...base, state: "ok" }));
    sock.once("timeout", () => done({ ...base, state: "unreachable", detail: "no answer within 3 s" }));
    sock.once("error", (err: NodeJS.ErrnoException) =>
      done({
        ...base,
        state: "unreachable",
        detail: err.code === "ECONNREFUSED" ? "connection refused" : err.message,
      }),
    );
  });
}

export function registerStatus(program: Command): void {
  program
    .command("status")
    .description("show where the stack is, whether each service answers, and which token is in use")
    .option("--invocation-url <url>", "check this invocation service URL")
    .addHelpText(
      "after",
      "\nExits 1 when the API does not answer GET /health with 200, so scripts can wait on it.",
    )
    .action(async (opts: { invocationUrl?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const issuer = s.issuerUrl();
      const invocation = s.invocationUrl(opts.invocationUrl);
      const info = await apiInfo(s);
      const issuerOff = info?.adminIssuer?.enabled === false;
      // lib/nats loads the NATS client: only a stack.json that names NATS needs it
      const natsServers = s.stack?.nats ? (await import("../../lib/nats/index.js")).natsServers : undefined;
      const checks = await Promise.all([
        httpCheck("api", "the API", s.apiUrl()),
        "disabled" in issuer || issuerOff
          ? Promise.resolve<Check>({
              name: "issuer",
              url: undefined,
              from: "disabled" in issuer ? tildify(s.stackFile) : `${s.apiUrl().value}/v1/info`,
              state: "disabled",
              detail:
                "disabled" in issuer
                  ? `${issuer.disabled}; the API refuses the tokens it issued`
                  : "adminIssuerProxy.enabled is false (the API says so); it is not running and the API refuses the tokens it issued",
            })
          : httpCheck("issuer", "the admin token issuer", issuer),
        invocation
          ? httpCheck("invocation", "the invocation service", invocation)
          : Promise.resolve<Check>({
              name: "invocation",
              url: undefined,
              from: "nowhere",
              state: "not configured",
              detail:
                "set --invocation-url, CALLPLANE_INVOCATION_URL or `invocationUrl:` in the CLI config file",
            }),
        ...(s.stack?.compute
          ? [
              httpCheck("compute", "the compute agent", {
                value: s.stack.compute,
                from: `compute in ${tildify(s.stackFile)}`,
              }),
            ]
          : []),
        // a cluster's URL names every node: one check each
        ...(s.stack?.nats && natsServers
          ? natsServers(s.stack.nats).map((url, i, all) =>
              tcpCheck(all.length > 1 ? `nats-${i + 1}` : "nats", {
                value: url,
                from: `nats in ${tildify(s.stackFile)}`,
              }),
            )
          : []),
      ]);
      const token = s.token();
      const expired = token?.expiresAt ? token.expiresAt.getTime() <= Date.now() : undefined;
      const apiKey = s.apiKey(undefined);
      const report = {
        stackFile: { path: s.stackFile, found: s.stack !== undefined },
        configFile: s.configFile ? { path: s.configFile, found: true } : null,
        stateFile: { path: s.stateFile },
        services: checks,
        adminIssuer: info?.adminIssuer ?? null,
        token: token
          ? {
              from: token.from,
              ...(token.expiresAt ? { expiresAt: token.expiresAt.toISOString(), expired } : {}),
            }
          : null,
        apiKey: apiKey ? { from: apiKey.from } : null,
      };
      const apiOk = checks[0].state === "ok";
      if (s.json) {
        printJson(report);
      } else {
        printFields([
          [
            "stack",
            s.stack
              ? `${tildify(s.stackFile)} (started ${s.stack.startedAt ?? "at an unknown time"})`
              : `no ${tildify(s.stackFile)}: using configured or default URLs`,
          ],
          ...checks.map((c): [string, string] => [
            c.name,
            `${c.url ?? "-"}  ${c.state}${c.detail ? `: ${c.detail}` : ""}${c.url ? `  (from ${c.from})` : ""}`,
          ]),
          [
            "token",
            token
              ? `admin token from ${token.from}${
                  token.expiresAt
                    ? `, ${expired ? "EXPIRED" : "expires"} ${token.expiresAt.toISOString()} (${relative(token.expiresAt)})`
                    : ", expiry unknown"
                }`
              : "none: run `callplane init`, set CALLPLANE_TOKEN, or run `callplane admin token --save`",
          ],
          [
            "admin issuer",
            info?.adminIssuer
              ? info.adminIssuer.enabled
                ? `enabled (its tokens are accepted; public route ${info.adminIssuer.gatewayEnabled ? "on" : "off: adminIssuerProxy.gateway.enabled is false"})`
                : "disabled (adminIssuerProxy.enabled: false): no issuer, and its earlier tokens are refused; use CALLPLANE_TOKEN or `callplane admin token`"
              : "unknown (the API did not answer GET /v1/info)",
          ],
          ["api key", apiKey ? `from ${apiKey.from}` : "none (create one with `callplane key create`)"],
          [
            "config file",
            s.configFile ? tildify(s.configFile) : `none (${DEFAULT_CONFIG_FILE} does not exist)`,
          ],
          ["state file", tildify(s.stateFile)],
        ]);
        if (token && expired) console.log(`hint: the admin token has expired; ${freshTokenAdvice(token)}`);
      }
      if (!apiOk) process.exitCode = 1;
    });
}
