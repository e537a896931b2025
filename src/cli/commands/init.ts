// `callplane init`: fetch an admin token from the admin token issuer (contract §5.4) and keep it
// in the state file for the commands that follow.
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { send, problemError, type Service } from "../client.js";
import { CliError } from "../errors.js";
import { note, printFields, printJson, relative } from "../output.js";
import { DEFAULT_CONFIG_FILE, settingsFor, tildify, type Settings, type Sourced } from "../settings.js";

export interface ApiInfo {
  adminIssuer?: { enabled: boolean; gatewayEnabled: boolean; tokensAccepted: boolean };
}

/** What the API says about itself before any token (GET /v1/info); undefined when it does not answer. */
export async function apiInfo(s: Settings): Promise<ApiInfo | undefined> {
  try {
    const res = await fetch(`${s.apiUrl().value}/v1/info`, { signal: AbortSignal.timeout(3000) });
    if (!res.ok) {
      await res.body?.cancel();
      return undefined;
    }
    return (await res.json()) as ApiInfo;
  } catch {
    return undefined;
  }
}

/** How to get an admin token without the issuer. */
export function supplyTokenHint(s: Settings): string {
  return (
    `supply an admin token instead: set CALLPLANE_TOKEN, or put \`token:\` in the CLI config file (${tildify(s.configFile ?? DEFAULT_CONFIG_FILE)}), ` +
    "or mint one offline with `callplane admin token --signing-key <file> --save`"
  );
}

/** Saves a token and says so (never printing the token itself). */
export function reportSaved(
  s: Settings,
  t: { id?: string; expiresAt: string; obtainedFrom: string },
  json: boolean,
): void {
  if (json) {
    printJson({
      stateFile: s.stateFile,
      tokenId: t.id,
      expiresAt: t.expiresAt,
      obtainedFrom: t.obtainedFrom,
    });
  } else {
    console.log(`saved an admin token in ${tildify(s.stateFile)}`);
    printFields([
      ["token id", t.id],
      ["expires", `${t.expiresAt} (${relative(new Date(t.expiresAt))})`],
      ["from", t.obtainedFrom],
    ]);
  }
  const shadow = s.token();
  if (shadow && shadow.kind !== "state") {
    note(`note: ${shadow.from} is set and takes precedence over the saved token; remove it to use this one`);
  }
}

function issuerTurnedOff(s: Settings): CliError {
  return new CliError(
    `the admin token issuer is turned off (the API at ${s.apiUrl().value} says adminIssuerProxy.enabled is false), so there is no token to fetch`,
    "ISSUER_DISABLED",
    { hint: supplyTokenHint(s) },
  );
}

/** The operator credential the issuer asks for, read from its file; a clear error when it cannot be. */
export function readOperatorCredential(s: Settings, flag: string | undefined, issuer: Sourced): string {
  const file = s.operatorCredentialFile(flag, issuer);
  const how =
    "pass --operator-credential <file> (or set CALLPLANE_OPERATOR_CREDENTIAL_FILE) naming the file adminIssuerProxy.operatorCredentialFile of the install";
  if ("missing" in file) throw new CliError(file.missing, "OPERATOR_CREDENTIAL_REQUIRED", { hint: how });
  let text: string;
  try {
    text = readFileSync(file.value, "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why =
      code === "ENOENT" ? "no such file" : code === "EACCES" ? "permission denied" : (err as Error).message;
    throw new CliError(
      `cannot read the admin issuer's operator credential ${tildify(file.value)} (from ${file.from}): ${why}`,
      "OPERATOR_CREDENTIAL_REQUIRED",
      {
        hint:
          code === "ENOENT"
            ? `the stack creates it on start (adminIssuerProxy.operatorCredentialFile); run init from the stack's folder, or ${how}`
            : `the file has mode 0600: only the account that runs the stack can read it; run \`callplane init\` as that user, or ${how}`,
      },
    );
  }
  const secret = text.trim();
  if (!secret)
    throw new CliError(
      `the admin issuer's operator credential ${tildify(file.value)} (from ${file.from}) is empty`,
      "OPERATOR_CREDENTIAL_REQUIRED",
      { hint: how },
    );
  return secret;
}

export function registerInit(program: Command): void {
  program
    .command("init")
    .description("get an admin token from the admin token issuer and save it in the state file")
    .option(
      "--operator-credential <file>",
      "the file holding the issuer's operator credential (adminIssuerProxy.operatorCredentialFile)",
    )
    .addHelpText(
      "after",
      `
The issuer URL comes from --issuer, CALLPLANE_ISSUER_URL, \`issuerUrl:\` in the CLI config file,
\`issuer\` in ./.callplane/stack.json, else http://127.0.0.1:8081. The token is saved (mode 0600)
in $CALLPLANE_STATE_DIR/state.json, else ~/.config/callplane/state.json; it lasts 12 hours by
default. The issuer mints only for the operator: init presents the secret in the file named by
--operator-credential, CALLPLANE_OPERATOR_CREDENTIAL_FILE, else (for an issuer on this machine)
\`issuerCredentialFile\` in ./.callplane/stack.json, else ./.callplane/keys/issuer-operator.secret;
the stack writes it with mode 0600, so run init as the account that runs the stack. When the issuer is turned off, supply a token instead: CALLPLANE_TOKEN, \`token:\` in
the CLI config file, or \`callplane admin token --signing-key <file> --save\` (offline).`,
    )
    .action(async (opts: { operatorCredential?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const issuer = s.issuerUrl();
      if ("disabled" in issuer) {
        throw new CliError(`${issuer.disabled}, so there is no token to fetch`, "ISSUER_DISABLED", {
          hint: supplyTokenHint(s),
        });
      }
      const service: Service = { label: "the admin token issuer", code: "ISSUER", url: issuer };
      let credential: string;
      try {
        credential = readOperatorCredential(s, opts.operatorCredential, issuer);
      } catch (err) {
        // no credential here: perhaps because there is no issuer at all, which the API knows
        if (err instanceof CliError && (await apiInfo(s))?.adminIssuer?.enabled === false)
          throw issuerTurnedOff(s);
        throw err;
      }
      let res: Response;
      try {
        res = await send(service, "/v1/admin/keys", {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${credential}` },
          body: "{}",
          timeoutMs: 15_000,
        });
      } catch (err) {
        // nothing answers at the issuer's address: perhaps because it is turned off, which the API knows
        if (err instanceof CliError && (await apiInfo(s))?.adminIssuer?.enabled === false)
          throw issuerTurnedOff(s);
        // the hint already says how to start the stack or check the URL; add the way around the issuer
        throw err instanceof CliError ? err.withHint(`${err.hint}; or ${supplyTokenHint(s)}`) : err;
      }
      if (res.status === 404 || res.status === 405) {
        await res.body?.cancel();
        throw new CliError(
          `the admin token issuer at ${issuer.value} is disabled (it answered HTTP ${res.status} to POST /v1/admin/keys)`,
          "ISSUER_DISABLED",
          { status: res.status, hint: supplyTokenHint(s) },
        );
      }
      if (!res.ok) throw await problemError(res, service);
      const body = (await res.json().catch(() => undefined)) as
        { value?: unknown; expires_at?: unknown; id?: unknown } | undefined;
      if (typeof body?.value !== "string" || typeof body.expires_at !== "string") {
        throw new CliError(
          `the admin token issuer at ${issuer.value} answered without a token (no "value" and "expires_at")`,
          "ISSUER_BAD_ANSWER",
          { hint: `check that ${issuer.from} names a callplane admin token issuer` },
        );
      }
      const saved = {
        value: body.value,
        expiresAt: body.expires_at,
        ...(typeof body.id === "string" ? { id: body.id } : {}),
        obtainedFrom: `the admin token issuer at ${issuer.value}`,
      };
      s.saveToken(saved);
      reportSaved(s, saved, s.json);
    });
}
