// What the API's route handlers work with: one object, built once by createApiService and handed
// to every handler as its first argument, so each handler's inputs are named in its signature.
// Also the body readers, which apply the API's body limit (api.maxBodyBytes).
import type { IncomingMessage } from "node:http";
import { CallplaneError } from "../../../lib/errors.js";
import { readJson } from "../../../lib/http/index.js";
import type { Logger } from "../../../lib/log.js";
import type { ComputeSettings } from "../instance-types.js";
import type { SecretStore } from "../secrets/store.js";
import type { Store } from "../store/types.js";
import type { WorkerTrust } from "../worker-trust.js";
import type { ApiAuth } from "./auth.js";

export interface ApiDeps {
  store: Store;
  /** The envelope-encrypted secret store; without it, secret endpoints answer 503 (secretStore()). */
  secrets: SecretStore | undefined;
  auth: ApiAuth;
  trust: WorkerTrust;
  logger: Logger;
  /** The largest request body read, in bytes. */
  maxBodyBytes: number;
  /** The default account: keys and tokens that name no account act in it. */
  ncaId: string;
  /** The longest life a new API key may have (apikeys.maxLifetimeDays). */
  maxKeyLifetimeDays: number;
  /** What `GET /v1/info` says about the issuer (adminIssuerProxy.enabled, .gateway.enabled). */
  adminIssuer: { enabled: boolean; gatewayEnabled: boolean } | undefined;
  /** compute.local.allowCommand: whether functions may have the image local/command. */
  allowLocalCommand: boolean;
  /** compute.backend and the cluster the local backend's built-in instance type belongs to. */
  compute: ComputeSettings;
  /** The console's audit log bounds (api.audit). */
  audit: AuditBounds;
}

/** How much of the audit log is kept: the newest maxRows, none older than maxAgeDays. */
export interface AuditBounds {
  maxRows: number;
  maxAgeDays: number;
}

/** The secret store, or UNAVAILABLE (503) when this API runs without one. */
export function secretStore(deps: ApiDeps): SecretStore {
  if (!deps.secrets) throw new CallplaneError("UNAVAILABLE", "this API runs without a secret store");
  return deps.secrets;
}

export function readJsonBody(deps: ApiDeps, req: IncomingMessage): Promise<unknown> {
  return readJson(req, deps.maxBodyBytes);
}

/** Reads a JSON body whose parse errors never quote it (it holds secret values). */
export function readSensitiveJsonBody(deps: ApiDeps, req: IncomingMessage): Promise<unknown> {
  return readJson(req, deps.maxBodyBytes, { sensitive: true });
}

/** Reads a body as bytes, whatever its type (the worker endpoints take forms as well as JSON). */
export async function readRawBody(deps: ApiDeps, req: IncomingMessage): Promise<Buffer> {
  const limit = deps.maxBodyBytes;
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req as AsyncIterable<Buffer>) {
    size += c.length;
    if (size > limit)
      throw new CallplaneError("BODY_TOO_LARGE", `the body is larger than the limit of ${limit} bytes`);
    chunks.push(c);
  }
  return Buffer.concat(chunks);
}
