// What a caller reaches. Every function belongs to an account (its `ncaId`); a caller acts in one
// account (Caller.account: an API key's own, an admin token's, or, for a plane-wide admin token,
// the one the request names) and reaches that account's functions and those shared with it (NVCF's
// function authorizations), the latter only to list, read and invoke them. An API key reaches, in
// addition, only what its policies name. A function a caller does not reach answers as if it did
// not exist (FUNCTION_NOT_FOUND), so ids leak nothing.
import { CallplaneError } from "../../../lib/errors.js";
import type { Principal } from "../../../lib/identity/index.js";
import type { FunctionVersionRecord, KeyPolicy, Store } from "../store/types.js";
import { checkUuid } from "./load.js";

/** The header a request names its account in (`callplane --account`). */
export const ACCOUNT_HEADER = "callplane-account";

export interface Caller {
  principal: Principal;
  /** The account the request acts in. */
  account: string;
  /** The API key's policies (undefined for tokens, which policies do not narrow). */
  policies?: readonly KeyPolicy[] | undefined;
}

/** What a function shared with an account lets that account's keys do. */
export const SHARED_SCOPES: ReadonlySet<string> = new Set([
  "invoke_function",
  "list_functions",
  "list_functions_details",
  "queue_details",
]);

/** The scopes that act on a function that exists (a policy may narrow them to some functions). */
export const FUNCTION_SCOPES: ReadonlySet<string> = new Set([
  ...SHARED_SCOPES,
  "deploy_function",
  "update_function",
  "update_secrets",
  "delete_function",
  "authorize_clients",
]);

/** The functions shared with the caller's account, read once per request. */
export class Reach {
  private shared: Promise<ReadonlySet<string>> | undefined;

  constructor(
    private readonly store: Store,
    readonly caller: Caller,
  ) {}

  private sharedWithCaller(): Promise<ReadonlySet<string>> {
    this.shared ??= this.store.listAuthorizedFunctions(this.caller.account).then((ids) => new Set(ids));
    return this.shared;
  }

  /** Whether the caller may use `scope` on this function. */
  async reaches(scope: string, fn: { functionId: string; ncaId: string }): Promise<boolean> {
    const c = this.caller;
    if (c.principal.kind === "service") return true;
    const own = fn.ncaId === c.account;
    const shared = !own && SHARED_SCOPES.has(scope) && (await this.sharedWithCaller()).has(fn.functionId);
    if (!own && !shared) return false;
    if (!c.policies) return true;
    const type = own ? "account-functions" : "authorized-functions";
    return c.policies.some(
      (p) =>
        p.scopes.includes(scope) &&
        p.resources.some((r) => r.type === type && (r.id === "*" || r.id === fn.functionId)),
    );
  }

  /** The versions the caller may use `scope` on, in order. */
  async filter(scope: string, versions: FunctionVersionRecord[]): Promise<FunctionVersionRecord[]> {
    const out: FunctionVersionRecord[] = [];
    for (const v of versions) if (await this.reaches(scope, v)) out.push(v);
    return out;
  }

  /** A function's versions, or FUNCTION_NOT_FOUND when it does not exist or the caller does not reach it. */
  async functionVersions(scope: string, fid: string): Promise<FunctionVersionRecord[]> {
    checkUuid(fid, "FUNCTION_NOT_FOUND", "function id");
    const versions = await this.store.listVersions(fid);
    if (versions.length === 0 || !(await this.reaches(scope, versions[0])))
      throw new CallplaneError("FUNCTION_NOT_FOUND", `no function with id ${fid}`);
    return versions;
  }

  /** One version, found as `functionVersions` finds its function. */
  async version(scope: string, fid: string, vid: string): Promise<FunctionVersionRecord> {
    const versions = await this.functionVersions(scope, fid);
    checkUuid(vid, "VERSION_NOT_FOUND", "version id");
    const v = versions.find((x) => x.versionId === vid);
    if (!v) throw new CallplaneError("VERSION_NOT_FOUND", `function ${fid} has no version ${vid}`);
    return v;
  }
}
