// What NATS users log in with: the key files in the credentials folder (services' nkeys, the
// shared worker nkey, the callout's issuer key, the route password) and a token-mode worker's token.
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { createAccount, createUser, fromSeed } from "@nats-io/nkeys";
import { writeFileAtomic } from "../fs.js";
import { SERVICE_ROLES, type NatsServiceRole } from "./permissions.js";

// ---- keys

/** The nkey files a stack keeps in nats.credentialsDir: one per service role, the worker's, the callout's issuer. */
export const KEY_FILES = {
  role: (dir: string, role: NatsServiceRole) => join(dir, `${role}.nk`),
  worker: (dir: string) => join(dir, "worker.nk"),
  calloutIssuer: (dir: string) => join(dir, "auth-callout-issuer.nk"),
  /** The password a NATS cluster's routes authenticate with (a cluster only). */
  routePassword: (dir: string) => join(dir, "cluster-route.pass"),
} as const;

/** The user a NATS cluster's routes authenticate as (with the password in KEY_FILES.routePassword). */
export const ROUTE_USER = "callplane-route";

function readSeed(file: string): string {
  return readFileSync(file, "utf8").trim();
}

export function publicKeyOf(seed: string): string {
  return fromSeed(new TextEncoder().encode(seed)).getPublicKey();
}

function ensureKey(file: string, create: () => { getSeed(): Uint8Array }): boolean {
  if (existsSync(file)) return false;
  writeFileAtomic(file, `${new TextDecoder().decode(create().getSeed())}\n`, 0o600);
  return true;
}

/** Creates whatever key is missing; returns the files it created. */
export function ensureNatsKeys(dir: string): string[] {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const created: string[] = [];
  for (const role of Object.keys(SERVICE_ROLES) as NatsServiceRole[]) {
    const f = KEY_FILES.role(dir, role);
    if (ensureKey(f, createUser)) created.push(f);
  }
  if (ensureKey(KEY_FILES.worker(dir), createUser)) created.push(KEY_FILES.worker(dir));
  if (ensureKey(KEY_FILES.calloutIssuer(dir), createAccount)) created.push(KEY_FILES.calloutIssuer(dir));
  return created;
}

/** The NATS user of workers that log in with the shared worker nkey: named after the key. */
export const nkeyWorkerUser = (publicKey: string) => `worker-nkey.${publicKey.slice(0, 12)}`;

/** Replaces the shared worker nkey (after a switch to token mode, or when it may have leaked). */
export function rotateWorkerKey(dir: string): { publicKey: string } {
  const seed = new TextDecoder().decode(createUser().getSeed());
  writeFileAtomic(KEY_FILES.worker(dir), `${seed}\n`, 0o600);
  return { publicKey: publicKeyOf(seed) };
}

/**
 * The route credentials of a NATS cluster, created (0600, in the 0700 credentials folder) when
 * missing. Every node's configuration holds them: the node checks the routes that come in, and
 * presents them on the routes it opens.
 */
export function ensureRouteCredentials(dir: string): { user: string; password: string; created: boolean } {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const file = KEY_FILES.routePassword(dir);
  let created = false;
  if (!existsSync(file)) {
    writeFileAtomic(file, `${randomBytes(32).toString("base64url")}\n`, 0o600);
    created = true;
  }
  const password = readSeed(file);
  if (!/^[A-Za-z0-9_-]{16,}$/.test(password))
    throw new Error(
      `the NATS route password in ${file} must be at least 16 letters, digits, dashes or underscores; delete the file to have a new one generated (then restart every node)`,
    );
  return { user: ROUTE_USER, password, created };
}

export function readRoleSeed(dir: string, role: NatsServiceRole): string {
  const file = KEY_FILES.role(dir, role);
  try {
    return readSeed(file);
  } catch (err) {
    throw new Error(
      `cannot read the NATS key of ${role} at ${file}: ${(err as Error).message}; the stack creates it on start, or copy it from nats.credentialsDir`,
      { cause: err },
    );
  }
}

export function readWorkerSeed(dir: string): string {
  return readSeed(KEY_FILES.worker(dir));
}

export function readCalloutIssuerSeed(dir: string): string {
  return readSeed(KEY_FILES.calloutIssuer(dir));
}

/** The token a worker presents in token mode: base64url JSON {account, pluginName, payload} (contract §3.4). */
export function workerAuthToken(account: string, payload: string, pluginName = "webhook"): string {
  return Buffer.from(JSON.stringify({ account, pluginName, payload })).toString("base64url");
}

export function parseWorkerAuthToken(
  token: string,
): { account: string; pluginName: string; payload: string } | undefined {
  try {
    const j = JSON.parse(Buffer.from(token, "base64url").toString("utf8")) as Record<string, unknown>;
    if (typeof j.account === "string" && typeof j.pluginName === "string" && typeof j.payload === "string")
      return { account: j.account, pluginName: j.pluginName, payload: j.payload };
  } catch {
    // not ours
  }
  return undefined;
}
