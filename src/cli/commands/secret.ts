// `callplane secret set|list|delete`: a function version's secrets (contract §5.3). A value is read
// from a file or from stdin (typed without echo on a terminal), never from the command line, where
// it would end up in shell history and process listings; no command prints a value.
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { Api } from "../client.js";
import { CliError, usageError } from "../errors.js";
import { pickVersion, resolveFunction } from "../functions.js";
import { note, printJson, printTable, say } from "../output.js";
import { settingsFor } from "../settings.js";

const NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,47}$/;
const MAX_CHARS = 32_768;

interface SetOptions {
  fromFile?: string;
  version?: string;
  object?: boolean;
  keepNewline?: boolean;
}

/** Reads a line from a terminal without echoing it. */
function readHidden(prompt: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const stdin = process.stdin;
    process.stderr.write(prompt);
    stdin.setRawMode(true);
    stdin.resume();
    let value = "";
    const done = (err?: Error) => {
      stdin.setRawMode(false);
      stdin.pause();
      stdin.off("data", onData);
      process.stderr.write("\n");
      if (err) reject(err);
      else resolve(value);
    };
    const onData = (chunk: Buffer) => {
      for (const ch of chunk.toString("utf8")) {
        if (ch === "\r" || ch === "\n") return done();
        if (ch === "\u0003") return done(new CliError("cancelled", "CANCELLED", { exitCode: 1 }));
        if (ch === "\u0004") return done();
        if (ch === "\u007f" || ch === "\b") value = value.slice(0, -1);
        else value += ch;
      }
    };
    stdin.on("data", onData);
  });
}

async function readStdin(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of process.stdin as AsyncIterable<Buffer>) chunks.push(c);
  return Buffer.concat(chunks);
}

function decode(bytes: Buffer, from: string): string {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw usageError(
      `the value from ${from} is not UTF-8 text`,
      "secret values are text; base64-encode binary values (certificates, keys) first, as NVCF asks",
    );
  }
}

/** The value to store, from --from-file or stdin, checked without ever being printed. */
async function readValue(name: string, o: SetOptions): Promise<string | Record<string, unknown>> {
  let text: string;
  let from: string;
  if (o.fromFile !== undefined && o.fromFile !== "-") {
    from = o.fromFile;
    let bytes: Buffer;
    try {
      bytes = readFileSync(o.fromFile);
    } catch (err) {
      throw usageError(
        `cannot read --from-file ${o.fromFile}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
      );
    }
    text = decode(bytes, from);
  } else if (process.stdin.isTTY) {
    from = "the terminal";
    text = await readHidden(`value of ${name} (not shown; Enter ends it): `);
  } else {
    from = "stdin";
    text = decode(await readStdin(), from);
  }
  // `echo value | callplane secret set ...` adds a newline that is not part of the value
  if (!o.keepNewline) text = text.replace(/\r?\n$/, "");
  if (text.trim() === "") throw usageError(`the value from ${from} is empty`, "a secret needs a value");
  if (o.object) {
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch {
      // (the parser's message would quote the value)
      throw usageError(`--object: the value from ${from} is not valid JSON`);
    }
    if (!v || typeof v !== "object" || Array.isArray(v))
      throw usageError(`--object: the value from ${from} must be a JSON object ({...})`);
    if (JSON.stringify(v).length > MAX_CHARS)
      throw usageError(`the value from ${from} is longer than ${MAX_CHARS} characters`);
    return v as Record<string, unknown>;
  }
  if (text.length > MAX_CHARS)
    throw usageError(`the value from ${from} is longer than ${MAX_CHARS} characters`);
  return text;
}

interface Listing {
  secrets: Array<{
    name: string;
    createdAt: string;
    updatedAt: string;
    readable?: boolean;
    problem?: string;
  }>;
}

export function registerSecret(program: Command): void {
  const secret = program
    .command("secret")
    .description("set, list and delete a function's secrets (values are never shown)");

  secret
    .command("set")
    .description("set one secret of a function version, from a file or stdin")
    .argument("<function>", "function id or name")
    .argument(
      "<name>",
      "secret name: letters, digits, _ . and -, starting with a letter or digit (at most 48)",
    )
    .option("--from-file <path>", "read the value from this file (`-`: stdin, the default)")
    .option("--version <versionId>", "the version (needed when the function has several)")
    .option("--object", "the value is a JSON object (NVCF allows strings and objects)")
    .option("--keep-newline", "keep a newline at the end of the value (one is dropped by default)")
    .addHelpText(
      "after",
      `
The value never goes on the command line. Examples:
  callplane secret set my-fn API_TOKEN --from-file token.txt
  printf '%s' "$TOKEN" | callplane secret set my-fn API_TOKEN
  callplane secret set my-fn API_TOKEN          # on a terminal: typed, not shown
Setting a name that exists replaces its value; other secrets stay. The function's inference server
reads them from the JSON file named by $SECRETS_PATH; running instances get the new file within a
compute sync (compute.syncIntervalSeconds), new instances at start.`,
    )
    .action(async (ref: string, name: string, opts: SetOptions, cmd: Command) => {
      const s = settingsFor(cmd);
      if (!NAME.test(name))
        throw usageError(
          `"${name.slice(0, 64)}" is not a secret name`,
          "use letters, digits, _ . and -, starting with a letter or digit, at most 48 characters",
        );
      const api = new Api(s);
      const fn = await resolveFunction(api, ref);
      const v = pickVersion(fn, opts.version, "secret set");
      const value = await readValue(name, opts);
      await api.call("PUT", `/v2/nvcf/secrets/functions/${v.id}/versions/${v.versionId}`, {
        secrets: [{ name, value }],
      });
      if (s.json) return printJson({ functionId: v.id, versionId: v.versionId, name, set: true });
      say(`set secret ${name} on ${fn.name} (version ${v.versionId})`);
      note("its value is stored encrypted and never shown; `callplane secret list` lists names");
    });

  secret
    .command("list")
    .description("list a function version's secrets by name")
    .argument("<function>", "function id or name")
    .option("--version <versionId>", "the version (needed when the function has several)")
    .option("--check", "also decrypt each one in the API and say whether it can be read (values stay there)")
    .action(async (ref: string, opts: { version?: string; check?: boolean }, cmd: Command) => {
      const s = settingsFor(cmd);
      const api = new Api(s);
      const fn = await resolveFunction(api, ref);
      const v = pickVersion(fn, opts.version, "secret list");
      const res = await api.call<Listing>(
        "GET",
        `/v2/nvcf/secrets/functions/${v.id}/versions/${v.versionId}${opts.check ? "?check=true" : ""}`,
      );
      if (s.json) return printJson(res);
      if (res.secrets.length === 0) {
        say(`${fn.name} (version ${v.versionId}) has no secrets; set one with \`callplane secret set\``);
        return;
      }
      printTable(
        opts.check ? ["NAME", "UPDATED", "READABLE"] : ["NAME", "UPDATED"],
        res.secrets.map((x) =>
          opts.check
            ? [x.name, x.updatedAt, x.readable ? "yes" : `NO: ${x.problem ?? ""}`]
            : [x.name, x.updatedAt],
        ),
      );
      const bad = res.secrets.filter((x) => x.readable === false);
      if (bad.length)
        note(
          `hint: ${bad.length} secret(s) cannot be decrypted; delete them with \`callplane secret delete ${fn.name} <name>\` and set them again`,
        );
    });

  secret
    .command("delete")
    .description("delete one secret of a function version (also one that can no longer be decrypted)")
    .argument("<function>", "function id or name")
    .argument("<name>", "the secret's name")
    .option("--version <versionId>", "the version (needed when the function has several)")
    .action(async (ref: string, name: string, opts: { version?: string }, cmd: Command) => {
      const s = settingsFor(cmd);
      const api = new Api(s);
      const fn = await resolveFunction(api, ref);
      const v = pickVersion(fn, opts.version, "secret delete");
      try {
        await api.call(
          "DELETE",
          `/v2/nvcf/secrets/functions/${v.id}/versions/${v.versionId}/${encodeURIComponent(name)}`,
        );
      } catch (err) {
        if (err instanceof CliError && err.code === "SECRET_NOT_FOUND")
          throw err.withHint(`\`callplane secret list ${fn.name}\` lists its secrets`);
        throw err;
      }
      if (s.json) return printJson({ functionId: v.id, versionId: v.versionId, name, deleted: true });
      say(`deleted secret ${name} of ${fn.name} (version ${v.versionId})`);
    });
}
