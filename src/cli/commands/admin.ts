// `callplane admin token`: mint an admin token offline from the admin signing key, for installs
// where the issuer is turned off or not reachable from here; `callplane admin revoke`: withdraw one
// admin token by its id.
import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { Api } from "../client.js";
import { CliError } from "../errors.js";
import { note, printJson, relative, say } from "../output.js";
import { integer } from "../parse.js";
import { settingsFor, tildify } from "../settings.js";
import { reportSaved } from "./init.js";

interface TokenOptions {
  signingKey?: string;
  forAccount?: string;
  ttl: number;
  save?: boolean;
}

export function registerAdmin(program: Command): void {
  const admin = program
    .command("admin")
    .description("administrator tasks that work offline, from the stack's own keys");
  admin
    .command("token")
    .description("mint an admin token from the admin signing key (no issuer needed) and print or save it")
    .option(
      "--signing-key <file>",
      "the admin signing key (PKCS#8 PEM); default: <dataDir>/keys/admin-signing.key.pem of the stack in this folder",
    )
    .option("--ttl <seconds>", "how long the token lasts, in seconds", integer(60, 7 * 86_400), 43_200)
    .option("--save", "save the token in the state file (as `callplane init` does) instead of printing it")
    .option(
      "--for-account <id>",
      "a token for this one account only (default: a plane-wide token, which may act for any account)",
    )
    .addHelpText(
      "after",
      `
Without --save the token alone is printed on stdout, so it can be captured:
  export CALLPLANE_TOKEN=$(callplane admin token)
The data folder is ./.callplane, or CALLPLANE__GLOBAL__DATA_DIR when set.`,
    )
    .action(async (opts: TokenOptions, cmd: Command) => {
      const s = settingsFor(cmd);
      const file = opts.signingKey ?? s.defaultSigningKey();
      let pem: string;
      try {
        pem = readFileSync(file, "utf8");
      } catch (err) {
        const missing = (err as NodeJS.ErrnoException).code === "ENOENT";
        throw new CliError(
          `cannot read the admin signing key ${file}: ${missing ? "no such file" : (err as Error).message}`,
          "SIGNING_KEY_MISSING",
          {
            hint: opts.signingKey
              ? "check the path given to --signing-key"
              : "pass --signing-key <file>; a local stack creates its key in <dataDir>/keys/admin-signing.key.pem when it first starts (`npm start`)",
          },
        );
      }
      const { createAdminTokenSigner } = await import("../../lib/identity/index.js");
      let signed;
      try {
        signed = await (
          await createAdminTokenSigner(pem, opts.ttl)
        ).sign(opts.forAccount !== undefined ? { account: opts.forAccount } : {});
      } catch (err) {
        throw new CliError(
          `${file} is not an admin signing key (an EC P-256 private key in PKCS#8 PEM): ${(err as Error).message}`,
          "SIGNING_KEY_INVALID",
        );
      }
      const token = {
        value: signed.token,
        expiresAt: signed.expiresAt.toISOString(),
        id: signed.id,
        obtainedFrom: `the signing key ${tildify(file)}`,
      };
      if (opts.save) {
        s.saveToken(token);
        reportSaved(s, token, s.json);
      } else if (s.json) {
        printJson({
          token: token.value,
          tokenId: token.id,
          expiresAt: token.expiresAt,
          account: signed.account,
        });
      } else {
        console.log(token.value);
        note(`callplane: this admin token expires at ${token.expiresAt} (${relative(signed.expiresAt)})`);
      }
    });

  admin
    .command("revoke")
    .description(
      "revoke one admin token by its id before it expires (needs a plane-wide admin token, or the token itself)",
    )
    .argument(
      "<tokenId>",
      "the token's id (its jti), as `callplane init` or `callplane admin token --json` show it",
    )
    .action(async (tokenId: string, _opts: unknown, cmd: Command) => {
      const s = settingsFor(cmd);
      const r = await new Api(s).call<{ id: string; status: string; revoked: string }>(
        "DELETE",
        `/v1/admin/tokens/${encodeURIComponent(tokenId)}`,
      );
      if (s.json) return printJson(r);
      say(`revoked admin token ${r.id}${r.revoked === "earlier" ? " (it was revoked earlier)" : ""}`);
    });
}
