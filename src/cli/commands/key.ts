// `callplane key create|list|revoke`: API keys for invoking functions (contract §5.4). Managing
// keys needs an admin token; the key value is shown once, when it is created.
import { InvalidArgumentError, type Command } from "commander";
// the scopes only: the identity folder loads jose and the key files (a parser runs synchronously)
import { API_KEY_DEFAULT_SCOPES, SCOPES } from "../../lib/identity/scopes.js";
import { Api } from "../client.js";
import { resolveFunction } from "../functions.js";
import { note, printFields, printJson, printTable, relative, say } from "../output.js";
import { duration } from "../parse.js";
import { settingsFor } from "../settings.js";

interface KeyDto {
  id: string;
  status: string;
  description: string;
  created_at: string;
  expires_at: string;
  revoked_at?: string;
  ncaId?: string;
  authorizations?: { policies: Array<{ scopes: string[]; resources?: Array<{ id: string; type: string }> }> };
  value?: string;
}

interface KeyCreateOptions {
  description?: string;
  scopes?: string[];
  expiresIn?: number;
  function?: string[];
}

function scopeList(value: string): string[] {
  const scopes = value
    .split(",")
    .map((x) => x.trim())
    .filter(Boolean);
  const unknown = scopes.filter((x) => !(SCOPES as readonly string[]).includes(x));
  if (scopes.length === 0) throw new InvalidArgumentError("Give at least one scope.");
  if (unknown.length) {
    throw new InvalidArgumentError(
      `Unknown scope ${unknown.join(", ")}; the scopes are: ${SCOPES.join(", ")}.`,
    );
  }
  return [...new Set(scopes)];
}

/** "every function" or the function ids its policies name. */
function reachOf(k: KeyDto): string {
  const ids = (k.authorizations?.policies ?? []).flatMap((p) => p.resources ?? []);
  return ids.some((r) => r.id === "*")
    ? "every function of the account (and shared with it)"
    : ids.map((r) => r.id).join(", ");
}

const scopesOf = (k: KeyDto) => [...new Set(k.authorizations?.policies.flatMap((p) => p.scopes) ?? [])];

function keyFields(k: KeyDto): Array<[string, string | undefined]> {
  return [
    ["key id", k.id],
    ["status", k.status],
    ["description", k.description || undefined],
    ["account", k.ncaId],
    ["scopes", scopesOf(k).join(", ")],
    ["reaches", reachOf(k)],
    ["created", k.created_at],
    ["expires", `${k.expires_at} (${relative(new Date(k.expires_at))})`],
    ["revoked", k.revoked_at],
  ];
}

export function registerKey(program: Command): void {
  const key = program
    .command("key")
    .description("create, list and revoke API keys (what `callplane invoke` and other clients present)");

  key
    .command("create")
    .description("create an API key; its value is shown only this once")
    .option("--description <text>", "what the key is for")
    .option(
      "--scopes <a,b>",
      "comma-separated scopes (default: invoke_function, list_functions, queue_details, list_functions_details)",
      scopeList,
    )
    .option("--expires-in <duration>", "lifetime such as 24h, 30d or 3600s (default 30d)", duration)
    .option(
      "--function <name-or-id>",
      "reach only this function of the account (repeat for more); default: every function of the account and shared with it",
      (v: string, prev: string[] = []) => [...prev, v],
    )
    .action(async (opts: KeyCreateOptions, cmd: Command) => {
      const s = settingsFor(cmd);
      const api = new Api(s);
      const only = opts.function
        ? await Promise.all(opts.function.map(async (ref) => (await resolveFunction(api, ref)).id))
        : undefined;
      const scopes = opts.scopes ?? (only ? [...API_KEY_DEFAULT_SCOPES] : undefined);
      const body = {
        ...(opts.description !== undefined ? { description: opts.description } : {}),
        ...(opts.expiresIn !== undefined
          ? { expires_at: new Date(Date.now() + opts.expiresIn * 1000).toISOString() }
          : {}),
        ...(scopes
          ? {
              authorizations: {
                policies: [
                  {
                    scopes,
                    ...(only ? { resources: only.map((id) => ({ id, type: "account-functions" })) } : {}),
                  },
                ],
              },
            }
          : {}),
      };
      const k = await api.call<KeyDto>("POST", "/v1/keys", body);
      if (s.json) printJson(k);
      else printFields([...keyFields(k), ["value", k.value]]);
      note(
        "note: the key value is shown only once, now; store it (pass it to `callplane invoke` with --api-key or CALLPLANE_API_KEY)",
      );
    });

  key
    .command("list")
    .description("list API keys (never their values)")
    .action(async (_opts: unknown, cmd: Command) => {
      const s = settingsFor(cmd);
      const res = await new Api(s).call<{ keys: KeyDto[] }>("GET", "/v1/keys");
      if (s.json) return printJson(res);
      if (res.keys.length === 0) {
        console.log("no API keys yet; create one with `callplane key create`");
        return;
      }
      printTable(
        ["KEY ID", "STATUS", "EXPIRES", "SCOPES", "DESCRIPTION"],
        res.keys.map((k) => [k.id, k.status, k.expires_at, scopesOf(k).join(","), k.description]),
      );
    });

  key
    .command("revoke")
    .description("revoke an API key so that it is no longer accepted")
    .argument("<keyId>", "the key's id, as `callplane key list` shows it")
    .action(async (keyId: string, _opts: unknown, cmd: Command) => {
      const s = settingsFor(cmd);
      const k = await new Api(s).call<KeyDto>("DELETE", `/v1/keys/${encodeURIComponent(keyId)}`);
      if (s.json) return printJson(k);
      say(`revoked API key ${k.id}`);
      printFields(keyFields(k));
    });
}
