// Sharing a function with other accounts (NVCF's function authorization API, scope
// authorize_clients): the keys of an authorized account may list, read and invoke it, never change
// it. Only the owning account shares. Version-level authorizations are not supported (their
// routes answer NOT_FOUND): a function is shared whole.
import { z } from "zod";
import { CallplaneError } from "../../../lib/errors.js";
import { sendJson, type RequestContext, type Router } from "../../../lib/http/index.js";
import { parseBody } from "../schemas.js";
import type { Reach } from "./access.js";
import { readJsonBody, type ApiDeps } from "./deps.js";

const BASE = "/v2/nvcf/authorizations/functions/:fid";
const party = z.strictObject({ ncaId: z.string().min(1).max(64) });
const setSchema = z.strictObject({ authorizedParties: z.array(party).max(1000) });
const oneSchema = z.strictObject({ authorizedParty: party });

export function addAuthorizationRoutes(router: Router, deps: ApiDeps): void {
  router.add("GET", BASE, (ctx) => getAuthorizations(deps, ctx));
  router.add("POST", BASE, (ctx) => setAuthorizations(deps, ctx));
  router.add("DELETE", BASE, (ctx) => clearAuthorizations(deps, ctx));
  router.add("PATCH", `${BASE}/add`, (ctx) => addAuthorization(deps, ctx));
  router.add("PATCH", `${BASE}/remove`, (ctx) => removeAuthorization(deps, ctx));
}

/** The function, owned by the caller's account (sharing what was shared with you is not allowed). */
async function ownedFunction(reach: Reach, fid: string): Promise<{ functionId: string; ncaId: string }> {
  const versions = await reach.functionVersions("authorize_clients", fid);
  return versions[0];
}

async function answer(deps: ApiDeps, res: RequestContext["res"], fn: { functionId: string; ncaId: string }) {
  const parties = await deps.store.listAuthorizedAccounts(fn.functionId);
  sendJson(res, 200, {
    function: { id: fn.functionId, ncaId: fn.ncaId, authorizedParties: parties.map((ncaId) => ({ ncaId })) },
  });
}

/** An account that may be given a function: it exists and is not the owner. */
async function checkParty(deps: ApiDeps, fn: { ncaId: string }, ncaId: string): Promise<void> {
  if (!(await deps.store.getAccount(ncaId)))
    throw new CallplaneError("ACCOUNT_NOT_FOUND", `no account with id ${ncaId}`);
  if (ncaId === fn.ncaId)
    throw new CallplaneError(
      "VALIDATION_FAILED",
      `authorizedParty.ncaId: ${ncaId} owns the function; share it with other accounts`,
      { extra: { errors: [{ field: "authorizedParty.ncaId", message: "is the owner" }] } },
    );
}

async function getAuthorizations(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const fn = await ownedFunction(await deps.auth.caller(req, "authorize_clients"), params.fid);
  await answer(deps, res, fn);
}

async function setAuthorizations(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const fn = await ownedFunction(await deps.auth.caller(req, "authorize_clients"), params.fid);
  const body = parseBody(setSchema, await readJsonBody(deps, req));
  const wanted = new Set(body.authorizedParties.map((p) => p.ncaId));
  for (const ncaId of wanted) await checkParty(deps, fn, ncaId);
  const at = new Date().toISOString();
  for (const ncaId of await deps.store.listAuthorizedAccounts(fn.functionId))
    if (!wanted.has(ncaId)) await deps.store.unauthorize(fn.functionId, ncaId);
  for (const ncaId of wanted) await deps.store.authorize(fn.functionId, ncaId, at);
  deps.logger.info({ functionId: fn.functionId, parties: [...wanted] }, "function authorizations set");
  await answer(deps, res, fn);
}

async function clearAuthorizations(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const fn = await ownedFunction(await deps.auth.caller(req, "authorize_clients"), params.fid);
  for (const ncaId of await deps.store.listAuthorizedAccounts(fn.functionId))
    await deps.store.unauthorize(fn.functionId, ncaId);
  deps.logger.info({ functionId: fn.functionId }, "function authorizations cleared");
  await answer(deps, res, fn);
}

async function addAuthorization(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const fn = await ownedFunction(await deps.auth.caller(req, "authorize_clients"), params.fid);
  const { authorizedParty } = parseBody(oneSchema, await readJsonBody(deps, req));
  await checkParty(deps, fn, authorizedParty.ncaId);
  await deps.store.authorize(fn.functionId, authorizedParty.ncaId, new Date().toISOString());
  deps.logger.info({ functionId: fn.functionId, ncaId: authorizedParty.ncaId }, "function shared");
  await answer(deps, res, fn);
}

async function removeAuthorization(deps: ApiDeps, { req, res, params }: RequestContext): Promise<void> {
  const fn = await ownedFunction(await deps.auth.caller(req, "authorize_clients"), params.fid);
  const { authorizedParty } = parseBody(oneSchema, await readJsonBody(deps, req));
  if (!(await deps.store.unauthorize(fn.functionId, authorizedParty.ncaId)))
    throw new CallplaneError(
      "ACCOUNT_NOT_FOUND",
      `function ${fn.functionId} is not shared with account ${authorizedParty.ncaId}`,
    );
  deps.logger.info({ functionId: fn.functionId, ncaId: authorizedParty.ncaId }, "function unshared");
  await answer(deps, res, fn);
}
