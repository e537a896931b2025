// Ids in a request's path are checked to be UUIDs before anything is looked up (access.ts finds
// the records, telling a missing function from a missing version).
import { CallplaneError } from "../../../lib/errors.js";

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function checkUuid(
  value: string,
  what: "FUNCTION_NOT_FOUND" | "VERSION_NOT_FOUND" | "DEPLOYMENT_NOT_FOUND" | "KEY_NOT_FOUND",
  label: string,
): void {
  if (!UUID.test(value)) throw new CallplaneError(what, `${label} "${value}" is not a UUID`);
}
