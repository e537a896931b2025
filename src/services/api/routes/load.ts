// Finding the records a request's path names: ids are checked to be UUIDs first, and a missing
// record is told apart from a missing function (FUNCTION_NOT_FOUND vs VERSION_NOT_FOUND).
import { CallplaneError } from "../../../lib/errors.js";
import type { FunctionVersionRecord, Store } from "../store/types.js";

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function checkUuid(
  value: string,
  what: "FUNCTION_NOT_FOUND" | "VERSION_NOT_FOUND" | "DEPLOYMENT_NOT_FOUND" | "KEY_NOT_FOUND",
  label: string,
): void {
  if (!UUID.test(value)) throw new CallplaneError(what, `${label} "${value}" is not a UUID`);
}

export async function loadVersion(
  deps: { store: Store },
  fid: string,
  vid: string,
): Promise<FunctionVersionRecord> {
  checkUuid(fid, "FUNCTION_NOT_FOUND", "function id");
  checkUuid(vid, "VERSION_NOT_FOUND", "version id");
  const v = await deps.store.getVersion(fid, vid);
  if (v) return v;
  if (!(await deps.store.functionExists(fid)))
    throw new CallplaneError("FUNCTION_NOT_FOUND", `no function with id ${fid}`);
  throw new CallplaneError("VERSION_NOT_FOUND", `function ${fid} has no version ${vid}`);
}
