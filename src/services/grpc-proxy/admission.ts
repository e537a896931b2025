// What a client's call must be before it costs anything (issue 19): checked in this order, before
// the API key is looked up and before any session, work message or worker slot exists. A host this
// port serves (`:authority`, and `host` if sent: a DNS-rebinding page sends its own name); a gRPC
// method path, `/<package.Service>/<Method>` and nothing else (no traversal, no percent-encoding,
// no query, so only methods reach a function's server); one authorization value (which of two
// would count must not depend on their order, as HTTP/1 already refuses); a well-formed
// grpc-timeout. Then, once the key is authorized: a function with a gRPC version (inferenceUrl
// `/grpc`, the contract's marker), of which only the gRPC versions are candidates.
import type { IncomingHttpHeaders } from "node:http2";
import { CallplaneError } from "../../lib/errors.js";
import { grpcTimeoutMs, isGrpcMethodPath } from "../../lib/grpc/index.js";
import { requireHostServed, type HostNames } from "../../lib/http/index.js";
import type { Grant } from "../../plane/auth-cache.js";

/** The inferenceUrl that makes a function version a gRPC one (contract §4.1). */
export const GRPC_INFERENCE_URL = "/grpc";

export interface Admitted {
  /** The call's deadline (grpc-timeout), clamped to what a timer holds; undefined for none. */
  deadlineMs: number | undefined;
}

/** Refuses a call whose shape is wrong (HOST_NOT_SERVED, GRPC_PATH_INVALID, UNAUTHENTICATED, BAD_REQUEST). */
export function admitCall(
  headers: IncomingHttpHeaders,
  rawHeaders: readonly string[],
  hosts: HostNames,
): Admitted {
  const authority = headers[":authority"];
  requireHostServed(authority ?? headers.host, hosts, "grpc-proxy");
  if (authority !== undefined && headers.host !== undefined)
    requireHostServed(headers.host, hosts, "grpc-proxy");
  const path = headers[":path"];
  if (!isGrpcMethodPath(path))
    throw new CallplaneError(
      "GRPC_PATH_INVALID",
      `the gRPC port serves gRPC methods only: ${JSON.stringify((path ?? "").slice(0, 100))} is not /<package.Service>/<Method> (dot-separated identifiers of letters, digits and _, then one identifier)`,
    );
  if (count(rawHeaders, "authorization") > 1)
    throw new CallplaneError(
      "UNAUTHENTICATED",
      "the call has more than one authorization value; send exactly one: authorization: Bearer <API key>",
    );
  const deadlineMs = grpcTimeoutMs(headers["grpc-timeout"]);
  if (deadlineMs === null)
    throw new CallplaneError(
      "BAD_REQUEST",
      `grpc-timeout ${JSON.stringify(String(headers["grpc-timeout"]).slice(0, 40))} is not a gRPC timeout: send it once, 1 to 8 digits and a unit (H, M, S, m, u or n), for example 500m or 30S`,
    );
  return { deadlineMs };
}

/**
 * The grant narrowed to its gRPC versions; FUNCTION_NOT_GRPC when it has none (the key's function,
 * or the version it pinned, is an HTTP one), so no session, work message or worker slot is spent.
 */
export function grpcGrant(grant: Grant, pinned: string | undefined): Grant {
  const versions = grant.functionVersions.filter((v) => v.defaultInvocationPath === GRPC_INFERENCE_URL);
  if (versions.length === 0)
    throw new CallplaneError(
      "FUNCTION_NOT_GRPC",
      `${pinned ? `version ${pinned} of function` : "function"} ${grant.functionId} is not a gRPC function (its inferenceUrl is not ${GRPC_INFERENCE_URL}): invoke it over HTTP (POST /v2/nvcf/pexec/functions/${grant.functionId}), or call a function created with --inference-url ${GRPC_INFERENCE_URL}`,
    );
  return versions.length === grant.functionVersions.length ? grant : { ...grant, functionVersions: versions };
}

function count(raw: readonly string[], name: string): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2) if (raw[i].toLowerCase() === name) n++;
  return n;
}
