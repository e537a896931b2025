// callplane's version, as a service reports it (the operator console shows it per replica): the
// package.json of the checkout or image the code runs from, read once.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

let version: string | undefined;

export function callplaneVersion(): string {
  if (version !== undefined) return version;
  try {
    // dist/src/lib/version.js, three folders below the package root
    const file = fileURLToPath(new URL("../../../package.json", import.meta.url));
    version = (JSON.parse(readFileSync(file, "utf8")) as { version?: string }).version ?? "unknown";
  } catch {
    version = "unknown";
  }
  return version;
}
