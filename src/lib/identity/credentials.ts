// Opaque credentials: API keys (`nvapi-`, stored only as SHA-256 hashes, shown once) and service
// tokens (`cps-`, which callplane's own services present to the API and which do not expire with
// the admin token, so a stack keeps working past hour 12).
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { SERVICE_SCOPES, type ServiceName } from "./scopes.js";
import { writeFileAtomic } from "../fs.js";

export function sha256Hex(text: string): string {
  return createHash("sha256").update(text).digest("hex");
}

export function newApiKey(): string {
  return `nvapi-${randomBytes(36).toString("base64url")}`;
}

export function newServiceToken(): string {
  return `cps-${randomBytes(32).toString("base64url")}`;
}

export function constantTimeEqualHex(a: string, b: string): boolean {
  const x = Buffer.from(a, "hex");
  const y = Buffer.from(b, "hex");
  return x.length === y.length && timingSafeEqual(x, y);
}

/** Creates a service token file per internal service if missing; returns their paths. */
export function ensureServiceTokens(dir: string): Record<ServiceName, string> {
  const out = {} as Record<ServiceName, string>;
  for (const name of Object.keys(SERVICE_SCOPES) as ServiceName[]) {
    const file = join(dir, `${name}.token`);
    if (!existsSync(file)) writeFileAtomic(file, `${newServiceToken()}\n`, 0o600);
    out[name] = file;
  }
  return out;
}

export function readServiceToken(dir: string, name: ServiceName): string {
  const file = join(dir, `${name}.token`);
  try {
    return readFileSync(file, "utf8").trim();
  } catch (err) {
    throw new Error(`cannot read the ${name} service token at ${file}: ${(err as Error).message}`, {
      cause: err,
    });
  }
}
