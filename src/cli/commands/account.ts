// `callplane account create|list|get`: accounts (NVCF's ncaId). Every function and key belongs to
// one; a plane-wide admin token (`callplane init`) creates them and acts for any of them with
// `--account <id>`.
import type { Command } from "commander";
import { Api } from "../client.js";
import { printFields, printJson, printTable } from "../output.js";
import { settingsFor } from "../settings.js";

interface AccountDto {
  id: string;
  name: string;
  createdAt: string;
  default: boolean;
}

const fields = (a: AccountDto): Array<[string, string | undefined]> => [
  ["account id", a.id],
  ["name", a.name],
  ["created", a.createdAt],
  ["default", a.default ? "yes (keys and tokens that name no account act in it)" : undefined],
];

export function registerAccount(program: Command): void {
  const account = program
    .command("account")
    .description("create and list accounts (every function and key belongs to one)");

  account
    .command("create")
    .description("create an account and print its id (needs a plane-wide admin token)")
    .argument("<name>", "a name for it: letters, digits, '.', '_' and '-'")
    .addHelpText(
      "after",
      `
Then make a key in it:  callplane --account <id> key create --description ...`,
    )
    .action(async (name: string, _opts: unknown, cmd: Command) => {
      const s = settingsFor(cmd);
      const { account: a } = await new Api(s).call<{ account: AccountDto }>("POST", "/v1/accounts", { name });
      if (s.json) return printJson(a);
      printFields(fields(a));
    });

  account
    .command("list")
    .description("list the accounts this admin token may see (all of them, for a plane-wide token)")
    .action(async (_opts: unknown, cmd: Command) => {
      const s = settingsFor(cmd);
      const res = await new Api(s).call<{ accounts: AccountDto[] }>("GET", "/v1/accounts");
      if (s.json) return printJson(res);
      printTable(
        ["ACCOUNT ID", "NAME", "CREATED", "DEFAULT"],
        res.accounts.map((a) => [a.id, a.name, a.createdAt, a.default ? "yes" : ""]),
      );
    });

  account
    .command("get")
    .description("show one account")
    .argument("<id>", "the account's id")
    .action(async (id: string, _opts: unknown, cmd: Command) => {
      const s = settingsFor(cmd);
      const { account: a } = await new Api(s).call<{ account: AccountDto }>(
        "GET",
        `/v1/accounts/${encodeURIComponent(id)}`,
      );
      if (s.json) return printJson(a);
      printFields(fields(a));
    });
}
