// Accounts (NVCF's ncaId): every function, version, deployment, key and request belongs to one. A
// plane-wide admin token creates and lists them; an account's admin token sees its own.
import { randomBytes } from "node:crypto";
import { z } from "zod";
import { CallplaneError } from "../../../lib/errors.js";
import { PLANE_WIDE } from "../../../lib/identity/index.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { parseBody } from "../schemas.js";
import type { AccountRecord } from "../store/types.js";
import { readJsonBody, type ApiDeps } from "./deps.js";

const createAccountSchema = z.strictObject({
  name: z
    .string({ message: "must be a string" })
    .regex(
      /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/,
      "must be 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit",
    ),
});

export function addAccountRoutes(router: Router, deps: ApiDeps): void {
  router.add("POST", "/v1/accounts", (ctx) => createAccount(deps, ctx));
  router.add("GET", "/v1/accounts", (ctx) => listAccounts(deps, ctx));
  router.add("GET", "/v1/accounts/:id", (ctx) => getAccount(deps, ctx));
}

export function accountDto(a: AccountRecord, defaultAccount: string) {
  return { id: a.ncaId, name: a.name, createdAt: a.createdAt, default: a.ncaId === defaultAccount };
}

/** An account id: 22 characters of lower-case letters and digits, as NVCF's ncaIds look. */
function newAccountId(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  return [...randomBytes(22)].map((b) => alphabet[b % alphabet.length]).join("");
}

async function createAccount(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  await deps.auth.requirePlaneAdmin(req, "creating an account");
  const body = parseBody(createAccountSchema, await readJsonBody(deps, req));
  const a: AccountRecord = { ncaId: newAccountId(), name: body.name, createdAt: new Date().toISOString() };
  if ((await deps.store.createAccount(a)) === "name-taken")
    throw new CallplaneError(
      "ACCOUNT_NAME_TAKEN",
      `an account named "${body.name}" exists; pick another name, or list accounts with \`callplane account list\``,
    );
  deps.logger.info({ ncaId: a.ncaId, name: a.name }, "account created");
  sendJson(res, 200, { account: accountDto(a, deps.ncaId) });
}

async function listAccounts(deps: ApiDeps, { req, res }: RequestContext): Promise<void> {
  const admin = await deps.auth.requireAdmin(req, "listing accounts");
  const all = await deps.store.listAccounts();
  const seen = admin.account === PLANE_WIDE ? all : all.filter((a) => a.ncaId === admin.account);
  sendJson(res, 200, { accounts: seen.map((a) => accountDto(a, deps.ncaId)) });
}

async function getAccount(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const admin = await deps.auth.requireAdmin(req, "reading an account");
  const a = await deps.store.getAccount(params.id);
  if (!a || (admin.account !== PLANE_WIDE && admin.account !== a.ncaId))
    throw new CallplaneError("ACCOUNT_NOT_FOUND", `no account with id ${params.id.slice(0, 64)}`);
  sendJson(res, 200, { account: accountDto(a, deps.ncaId) });
}
