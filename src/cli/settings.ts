// Where the CLI's settings come from, in one place so that `callplane status` and the help text can
// say it exactly:
//   URLs:     flag, then env (CALLPLANE_API_URL, ...), then the CLI config file, then the local
//             stack's stack.json, then the defaults of a local stack.
//   token:    CALLPLANE_TOKEN, then `token:` in the CLI config file, then the state file (`init`).
//   API key:  --api-key, then CALLPLANE_API_KEY, then `apiKey:` in the config file, then the stack's
//             demo key in stack.json.
//   operator credential (init): --operator-credential, then CALLPLANE_OPERATOR_CREDENTIAL_FILE, then
//             (for an issuer on loopback only) issuerCredentialFile in stack.json, then
//             <the folder of stack.json>/keys/issuer-operator.secret.
import { existsSync, readFileSync } from "node:fs";
import { homedir } from "node:os";
import { dirname, isAbsolute, join, resolve } from "node:path";
import type { Command } from "commander";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { writeFileAtomic } from "../lib/fs.js";
import { CliError, usageError } from "./errors.js";

export type GlobalOptions = {
  json?: boolean;
  api?: string;
  issuer?: string;
  config?: string;
  account?: string;
};

export const DEFAULT_API_URL = "http://127.0.0.1:8080";
export const DEFAULT_ISSUER_URL = "http://127.0.0.1:8081";
export const DEFAULT_CONFIG_FILE = "~/.config/callplane/config.yaml";
/** A value and a phrase that says where it came from ("CALLPLANE_API_URL", "the --api flag", ...). */
export interface Sourced<T = string> {
  value: T;
  from: string;
}

const httpUrl = z
  .string()
  .refine((s) => /^https?:$/.test(safeUrl(s)?.protocol ?? ""), "must be an http:// or https:// URL");

const cliConfigSchema = z.strictObject({
  token: z.string().min(1, "must not be empty").optional(),
  apiUrl: httpUrl.optional(),
  issuerUrl: httpUrl.optional(),
  invocationUrl: httpUrl.optional(),
  grpcUrl: httpUrl.optional(),
  apiKey: z.string().min(1, "must not be empty").optional(),
});
export type CliConfig = z.infer<typeof cliConfigSchema>;

const stackFileSchema = z.looseObject({
  api: z.string(),
  issuer: z.string().optional(),
  issuerCredentialFile: z.string().optional(),
  nats: z.string().optional(),
  invocation: z.array(z.string()).default([]),
  grpc: z.array(z.string()).default([]),
  dataDir: z.string(),
  startedAt: z.string().optional(),
  compute: z.string().optional(),
  /** Where the stack's spans are (observability.tracing): a span file, a trace query API. */
  tracing: z.looseObject({ file: z.string().optional(), queryUrl: z.string().optional() }).optional(),
  demo: z
    .looseObject({
      apiKey: z.string().optional(),
      httpFunctionId: z.string().optional(),
      httpFunctionName: z.string().optional(),
      sseFunctionId: z.string().optional(),
      sseFunctionName: z.string().optional(),
      slowFunctionId: z.string().optional(),
      slowFunctionName: z.string().optional(),
      grpcFunctionId: z.string().optional(),
      grpcFunctionName: z.string().optional(),
    })
    .optional(),
});
export type StackFile = z.infer<typeof stackFileSchema>;

const stateSchema = z.looseObject({
  token: z
    .looseObject({
      value: z.string().min(1),
      expiresAt: z.string().optional(),
      id: z.string().optional(),
      obtainedFrom: z.string().optional(),
      savedAt: z.string().optional(),
    })
    .optional(),
});
export type StateFile = z.infer<typeof stateSchema>;

function safeUrl(s: string): URL | undefined {
  try {
    return new URL(s);
  } catch {
    return undefined;
  }
}

function isLoopbackUrl(url: string): boolean {
  const h = safeUrl(url)
    ?.hostname.replace(/^\[|\]$/g, "")
    .toLowerCase();
  if (h === undefined) return false;
  return h === "localhost" || h.endsWith(".localhost") || /^127\./.test(h) || h === "::1";
}

function env(name: string): string | undefined {
  const v = process.env[name]?.trim();
  return v ? v : undefined;
}

export function tildify(path: string): string {
  const home = homedir();
  return home && path.startsWith(`${home}/`) ? `~${path.slice(home.length)}` : path;
}

function checkUrl(value: string, from: string): string {
  const u = safeUrl(value);
  if (!u || (u.protocol !== "http:" && u.protocol !== "https:")) {
    throw usageError(`${from} is "${value}", which is not an http:// or https:// URL`);
  }
  return value.replace(/\/+$/, "");
}

function loadCliConfig(flag: string | undefined): { file: string | undefined; values: CliConfig } {
  let file: string | undefined;
  let from: string;
  if (flag) {
    file = resolve(flag);
    from = "--config";
  } else if (env("CALLPLANE_CLI_CONFIG")) {
    file = resolve(env("CALLPLANE_CLI_CONFIG")!);
    from = "CALLPLANE_CLI_CONFIG";
  } else {
    const home = join(homedir(), ".config", "callplane", "config.yaml");
    if (!existsSync(home)) return { file: undefined, values: {} };
    file = home;
    from = "the default location";
  }
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    const missing = (err as NodeJS.ErrnoException).code === "ENOENT";
    throw new CliError(
      `cannot read the CLI config file ${file} (named by ${from}): ${missing ? "no such file" : (err as Error).message}`,
      "CONFIG_INVALID",
      { hint: `create it, or point ${from} at an existing file` },
    );
  }
  let doc: unknown;
  try {
    doc = parseYaml(text) ?? {};
  } catch (err) {
    throw new CliError(
      `the CLI config file ${file} is not valid YAML: ${(err as Error).message.split("\n")[0]}`,
      "CONFIG_INVALID",
    );
  }
  const r = cliConfigSchema.safeParse(doc);
  if (!r.success) {
    const problems = r.error.issues.map((i) =>
      i.code === "unrecognized_keys"
        ? `unknown key${i.keys.length > 1 ? "s" : ""} ${i.keys.map((k) => `"${k}"`).join(", ")}`
        : `${i.path.length ? i.path.join(".") : "(document)"}: ${i.message}`,
    );
    throw new CliError(`the CLI config file ${file} is invalid: ${problems.join("; ")}`, "CONFIG_INVALID", {
      hint: `the keys it may hold are ${Object.keys(cliConfigSchema.shape).join(", ")}`,
    });
  }
  return { file, values: r.data };
}

function dataDir(): string {
  return resolve(env("CALLPLANE__GLOBAL__DATA_DIR") ?? ".callplane");
}

function loadStackFile(): { file: string; info: StackFile | undefined } {
  const file = join(dataDir(), "stack.json");
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch {
    return { file, info: undefined };
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new CliError(
      `the stack file ${file} is not valid JSON: ${(err as Error).message}`,
      "STACK_FILE_INVALID",
      {
        hint: "the local stack rewrites it when it starts; restart it with `npm start`",
      },
    );
  }
  const r = stackFileSchema.safeParse(doc);
  if (!r.success) {
    throw new CliError(
      `the stack file ${file} does not look like one written by \`npm start\`: ${r.error.issues
        .map((i) => `${i.path.join(".")}: ${i.message}`)
        .join("; ")}`,
      "STACK_FILE_INVALID",
    );
  }
  return { file, info: r.data };
}

/** Reads the payload of a JWT without verifying it (only to show expiry; the API verifies). */
export function jwtClaims(token: string): { exp?: number; jti?: string; sub?: string } | undefined {
  const parts = token.split(".");
  if (parts.length !== 3) return undefined;
  try {
    const claims = JSON.parse(Buffer.from(parts[1], "base64url").toString("utf8")) as unknown;
    return claims && typeof claims === "object" ? claims : undefined;
  } catch {
    return undefined;
  }
}

export interface TokenInfo extends Sourced {
  /** Which of the three places it came from, for hints. */
  kind: "env" | "config" | "state";
  expiresAt: Date | undefined;
}

/** Everything a command needs to know about where to go and what to present. */
export class Settings {
  readonly json: boolean;
  readonly configFile: string | undefined;
  readonly config: CliConfig;
  readonly stackFile: string;
  readonly stack: StackFile | undefined;
  readonly stateFile: string;

  constructor(readonly globals: GlobalOptions) {
    this.json = globals.json === true;
    const c = loadCliConfig(globals.config);
    this.configFile = c.file;
    this.config = c.values;
    const s = loadStackFile();
    this.stackFile = s.file;
    this.stack = s.info;
    this.stateFile = join(
      env("CALLPLANE_STATE_DIR")
        ? resolve(env("CALLPLANE_STATE_DIR")!)
        : join(homedir(), ".config", "callplane"),
      "state.json",
    );
  }

  private fromConfig(key: string): string {
    return `\`${key}:\` in ${tildify(this.configFile ?? "")}`;
  }

  private fromStack(key: string): string {
    return `${key} in ${tildify(this.stackFile)}`;
  }

  /** The account to act for (--account, else CALLPLANE_ACCOUNT), sent to the API; undefined: the token's own. */
  account(): string | undefined {
    return this.globals.account ?? (env("CALLPLANE_ACCOUNT") || undefined);
  }

  apiUrl(): Sourced {
    const pick = (value: string, from: string): Sourced => ({ value: checkUrl(value, from), from });
    if (this.globals.api) return pick(this.globals.api, "--api");
    if (env("CALLPLANE_API_URL")) return pick(env("CALLPLANE_API_URL")!, "CALLPLANE_API_URL");
    if (this.config.apiUrl) return pick(this.config.apiUrl, this.fromConfig("apiUrl"));
    if (this.stack) return pick(this.stack.api, this.fromStack("api"));
    return { value: DEFAULT_API_URL, from: "the default" };
  }

  /** The issuer URL, or why there is none (a local stack started with the issuer turned off). */
  issuerUrl(): Sourced | { disabled: string } {
    const pick = (value: string, from: string): Sourced => ({ value: checkUrl(value, from), from });
    if (this.globals.issuer) return pick(this.globals.issuer, "--issuer");
    if (env("CALLPLANE_ISSUER_URL")) return pick(env("CALLPLANE_ISSUER_URL")!, "CALLPLANE_ISSUER_URL");
    if (this.config.issuerUrl) return pick(this.config.issuerUrl, this.fromConfig("issuerUrl"));
    if (this.stack) {
      if (this.stack.issuer) return pick(this.stack.issuer, this.fromStack("issuer"));
      return {
        disabled: `the local stack in ${tildify(this.stack.dataDir)} runs without the admin token issuer (adminIssuerProxy.enabled: false)`,
      };
    }
    return { value: DEFAULT_ISSUER_URL, from: "the default" };
  }

  /**
   * The file holding the admin issuer's operator credential. The local stack's file is offered only
   * to an issuer on this machine (a loopback URL): never sent to an issuer elsewhere unasked.
   */
  operatorCredentialFile(flag: string | undefined, issuer: Sourced): Sourced | { missing: string } {
    if (flag) return { value: resolve(flag), from: "--operator-credential" };
    const e = env("CALLPLANE_OPERATOR_CREDENTIAL_FILE");
    if (e) return { value: resolve(e), from: "CALLPLANE_OPERATOR_CREDENTIAL_FILE" };
    if (!isLoopbackUrl(issuer.value))
      return {
        missing: `the admin token issuer at ${issuer.value} is not on this machine, so the local stack's operator credential is not offered to it`,
      };
    if (this.stack?.issuerCredentialFile)
      return {
        value: resolve(this.stack.issuerCredentialFile),
        from: this.fromStack("issuerCredentialFile"),
      };
    return {
      value: join(dirname(this.stackFile), "keys", "issuer-operator.secret"),
      from: `the local stack's folder (${tildify(dirname(this.stackFile))})`,
    };
  }

  invocationUrl(flag: string | undefined): Sourced | undefined {
    const pick = (value: string, from: string): Sourced => ({ value: checkUrl(value, from), from });
    if (flag) return pick(flag, "--invocation-url");
    if (env("CALLPLANE_INVOCATION_URL"))
      return pick(env("CALLPLANE_INVOCATION_URL")!, "CALLPLANE_INVOCATION_URL");
    if (this.config.invocationUrl) return pick(this.config.invocationUrl, this.fromConfig("invocationUrl"));
    const first = this.stack?.invocation[0];
    if (first) return pick(first, this.fromStack("invocation[0]"));
    return undefined;
  }

  /** Where gRPC calls go: a grpc-proxy replica's client listener. */
  grpcUrl(flag: string | undefined): Sourced | undefined {
    const pick = (value: string, from: string): Sourced => ({ value: checkUrl(value, from), from });
    if (flag) return pick(flag, "--grpc-url");
    if (env("CALLPLANE_GRPC_URL")) return pick(env("CALLPLANE_GRPC_URL")!, "CALLPLANE_GRPC_URL");
    if (this.config.grpcUrl) return pick(this.config.grpcUrl, this.fromConfig("grpcUrl"));
    const first = this.stack?.grpc[0];
    if (first) return pick(first, this.fromStack("grpc[0]"));
    return undefined;
  }

  apiKey(flag: string | undefined): Sourced | undefined {
    if (flag) return { value: flag, from: "--api-key" };
    if (env("CALLPLANE_API_KEY")) return { value: env("CALLPLANE_API_KEY")!, from: "CALLPLANE_API_KEY" };
    if (this.config.apiKey) return { value: this.config.apiKey, from: this.fromConfig("apiKey") };
    if (this.stack?.demo?.apiKey)
      return { value: this.stack.demo.apiKey, from: this.fromStack("demo.apiKey") };
    return undefined;
  }

  token(): TokenInfo | undefined {
    const exp = (value: string, fallback?: string): Date | undefined => {
      const c = jwtClaims(value);
      if (typeof c?.exp === "number") return new Date(c.exp * 1000);
      return fallback ? new Date(fallback) : undefined;
    };
    const t = env("CALLPLANE_TOKEN");
    if (t) return { value: t, from: "CALLPLANE_TOKEN", kind: "env", expiresAt: exp(t) };
    if (this.config.token)
      return {
        value: this.config.token,
        from: this.fromConfig("token"),
        kind: "config",
        expiresAt: exp(this.config.token),
      };
    const saved = this.readState().token;
    if (saved)
      return {
        value: saved.value,
        from: `the state file ${tildify(this.stateFile)}`,
        kind: "state",
        expiresAt: exp(saved.value, saved.expiresAt),
      };
    return undefined;
  }

  /** The admin token, or an error that lists every way to get one. */
  requireToken(): TokenInfo {
    const t = this.token();
    if (t) return t;
    throw new CliError("no admin token", "NO_TOKEN", {
      hint:
        "run `callplane init` to get one from the admin token issuer, or set CALLPLANE_TOKEN, or put `token:` in the CLI config file, " +
        "or mint one offline with `callplane admin token --signing-key <file> --save`",
    });
  }

  readState(): StateFile {
    let text: string;
    try {
      text = readFileSync(this.stateFile, "utf8");
    } catch {
      return {};
    }
    try {
      return stateSchema.parse(JSON.parse(text));
    } catch {
      throw new CliError(`the state file ${this.stateFile} is damaged`, "STATE_FILE_INVALID", {
        hint: "delete it and run `callplane init` again",
      });
    }
  }

  saveToken(token: { value: string; expiresAt: string; id?: string; obtainedFrom: string }): void {
    let state: StateFile;
    try {
      state = this.readState();
    } catch {
      state = {}; // a damaged state file is replaced, not a reason to refuse a new token
    }
    state.token = { ...token, savedAt: new Date().toISOString() };
    writeFileAtomic(this.stateFile, `${JSON.stringify(state, null, 2)}\n`, 0o600);
  }

  /** Where the local stack keeps the admin signing key. */
  defaultSigningKey(): string {
    const dir = this.stack ? this.stack.dataDir : dataDir();
    return join(isAbsolute(dir) ? dir : resolve(dir), "keys", "admin-signing.key.pem");
  }
}

/** The settings for a command, from the global options wherever they were given on the line. */
export function settingsFor(cmd: Command): Settings {
  return new Settings(cmd.optsWithGlobals<GlobalOptions>());
}
