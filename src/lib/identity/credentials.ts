// Opaque credentials: API keys (`nvapi-`, stored only as SHA-256 hashes, shown once), service
// tokens (`cps-`, which callplane's own services present to the API and which do not expire with
// the admin token, so a stack keeps working past hour 12), and the operator credential (`cpo-`,
// which the admin issuer asks for before it mints a token).
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { chmodSync, existsSync, readFileSync, statSync } from "node:fs";
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

export function newOperatorCredential(): string {
  return `cpo-${randomBytes(32).toString("base64url")}`;
}

/**
 * Creates the operator credential file (mode 0600) if it is missing, and takes away any access
 * others were given to an existing one: only the account that runs the stack may read it.
 */
export function ensureOperatorCredential(file: string): { created: boolean; tightened: boolean } {
  if (!existsSync(file)) {
    writeFileAtomic(file, `${newOperatorCredential()}\n`, 0o600);
    return { created: true, tightened: false };
  }
  if ((statSync(file).mode & 0o077) === 0) return { created: false, tightened: false };
  chmodSync(file, 0o600);
  return { created: false, tightened: true };
}

/** The operator credential in a file, or an error naming the file and who can read it. */
export function readOperatorCredential(file: string): string {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw new Error(
      `cannot read the operator credential at ${file} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}); ` +
        "the stack creates it on first start (mode 0600, readable only by the account that runs the stack), or set adminIssuerProxy.operatorCredentialFile",
      { cause: err },
    );
  }
  const secret = text.trim();
  if (secret.length < 16)
    throw new Error(
      `the operator credential at ${file} is empty or shorter than 16 characters; delete it and the stack makes a new one`,
    );
  return secret;
}
