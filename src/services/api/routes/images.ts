// Which container images a function may have on this plane: `local/command` (any command line on
// the compute agent's machine) only when the environment file turns it on. The rule itself is
// lib/local-images.ts, which the compute agent applies again.
import { CallplaneError } from "../../../lib/errors.js";
import { localImageRefusal } from "../../../lib/local-images.js";
import type { ApiDeps } from "./deps.js";

/** Refuses (IMAGE_DISABLED) a function spec the local backend must not run on this plane. */
export function checkImageAllowed(
  deps: ApiDeps,
  spec: { containerImage: string; containerEnvironment?: ReadonlyArray<{ key: string }> | undefined },
): void {
  const refusal = localImageRefusal(spec, deps.allowLocalCommand);
  if (refusal)
    throw new CallplaneError("IMAGE_DISABLED", refusal.message, {
      extra: { errors: [{ field: refusal.field, message: refusal.message }] },
    });
}
