// One error base for every service. Each code is stable (clients and docs depend on it), has one
// HTTP status and one gRPC status and says whether the caller (user) or callplane (system) is at
// fault. The tables are typed so that a code without a status does not compile; docs/errors.md lists
// the same codes and a test keeps the two in step.
// the one file, not the folder: grpc/index.js would load @grpc/grpc-js into every process that
// only needs the status numbers (the CLI among them)
import { GRPC, type GrpcStatus } from "./grpc/protocol.js";

export const ERROR_CODES = {
  // request shape
  BAD_REQUEST: { status: 400, kind: "user", title: "Bad request" },
  MALFORMED_JSON: { status: 400, kind: "user", title: "Malformed JSON body" },
  VALIDATION_FAILED: { status: 400, kind: "user", title: "Invalid request fields" },
  BAD_POLL_SECONDS: { status: 400, kind: "user", title: "Invalid NVCF-POLL-SECONDS header" },
  UNSUPPORTED_MEDIA_TYPE: { status: 415, kind: "user", title: "Unsupported content type" },
  BODY_TOO_LARGE: { status: 413, kind: "user", title: "Request body too large" },
  HEADERS_TOO_LARGE: { status: 431, kind: "user", title: "Request headers too large" },
  REQUEST_TIMEOUT: { status: 408, kind: "user", title: "Request not received in time" },
  EXPECTATION_FAILED: { status: 417, kind: "user", title: "Unsupported expectation" },
  NOT_FOUND: { status: 404, kind: "user", title: "No such route" },
  METHOD_NOT_ALLOWED: { status: 405, kind: "user", title: "Method not allowed" },
  // authentication and authorisation
  UNAUTHENTICATED: { status: 401, kind: "user", title: "Authentication required" },
  TOKEN_INVALID: { status: 401, kind: "user", title: "Invalid token" },
  TOKEN_EXPIRED: { status: 401, kind: "user", title: "Token expired" },
  FORBIDDEN_SCOPE: { status: 403, kind: "user", title: "Missing scope" },
  // control-plane resources
  FUNCTION_NOT_FOUND: { status: 404, kind: "user", title: "Function not found" },
  VERSION_NOT_FOUND: { status: 404, kind: "user", title: "Function version not found" },
  DEPLOYMENT_NOT_FOUND: { status: 404, kind: "user", title: "Deployment not found" },
  KEY_NOT_FOUND: { status: 404, kind: "user", title: "API key not found" },
  FUNCTION_NAME_TAKEN: { status: 409, kind: "user", title: "Function name already in use" },
  DEPLOYMENT_EXISTS: { status: 409, kind: "user", title: "Deployment already exists" },
  VERSION_DEPLOYED: { status: 409, kind: "user", title: "Function version is deployed" },
  INSTANCE_TYPE_UNAVAILABLE: { status: 400, kind: "user", title: "Instance type not offered" },
  ISSUER_DISABLED: { status: 404, kind: "user", title: "Admin token issuer disabled" },
  TOKEN_ISSUER_DISABLED: { status: 401, kind: "user", title: "Token from a disabled issuer" },
  TOKEN_REVOKED: { status: 401, kind: "user", title: "Token revoked" },
  HOST_NOT_SERVED: { status: 421, kind: "user", title: "Host name not served here" },
  ORIGIN_REFUSED: { status: 403, kind: "user", title: "Browser request refused" },
  OPERATOR_CREDENTIAL_REQUIRED: { status: 401, kind: "user", title: "Operator credential required" },
  JSON_TOO_DEEP: { status: 400, kind: "user", title: "JSON nested too deeply" },
  INVALID_UTF8: { status: 400, kind: "user", title: "Body is not valid UTF-8" },
  // accounts and what a key reaches
  ACCOUNT_NOT_FOUND: { status: 404, kind: "user", title: "Account not found" },
  ACCOUNT_NAME_TAKEN: { status: 409, kind: "user", title: "Account name already in use" },
  ACCOUNT_FORBIDDEN: { status: 403, kind: "user", title: "Token not valid for this account" },
  POLICY_NOT_ENFORCEABLE: { status: 400, kind: "user", title: "Key policy cannot be enforced" },
  IMAGE_DISABLED: { status: 400, kind: "user", title: "Container image not allowed on this plane" },
  // secrets and their keys
  SECRET_NOT_FOUND: { status: 404, kind: "user", title: "Secret not found" },
  SECRET_UNREADABLE: { status: 500, kind: "system", title: "Secret cannot be decrypted" },
  SECRET_KEY_UNAVAILABLE: { status: 503, kind: "system", title: "Encryption key unavailable" },
  ROTATION_IN_PROGRESS: { status: 409, kind: "user", title: "A key rotation is in progress" },
  NO_ROTATION: { status: 409, kind: "user", title: "No key rotation to act on" },
  MEK_UNKNOWN: { status: 400, kind: "user", title: "Key not known to the MEK provider" },
  // invocation
  FUNCTION_NOT_DEPLOYED: { status: 404, kind: "user", title: "Function has no deployed version" },
  REQUEST_NOT_FOUND: { status: 404, kind: "user", title: "Request not found" },
  QUEUE_FULL: { status: 429, kind: "user", title: "Function queue full" },
  INVOCATION_TIMEOUT: { status: 504, kind: "system", title: "No worker answered in time" },
  WORKER_NOT_ACKNOWLEDGED: {
    status: 504,
    kind: "system",
    title: "Worker did not acknowledge the status request",
  },
  ATTACH_TOKEN_INVALID: { status: 401, kind: "user", title: "Invalid attach token" },
  ATTACH_FRAMING_INVALID: { status: 400, kind: "user", title: "Invalid framed response" },
  CLIENT_GONE: { status: 410, kind: "user", title: "Client went away" },
  WORKER_RESPONSE_INVALID: { status: 502, kind: "system", title: "Worker sent an invalid response" },
  SHUTTING_DOWN: { status: 503, kind: "system", title: "Shutting down" },
  // worker callback proxy
  PROXY_TARGET_INVALID: { status: 400, kind: "user", title: "Not a pod-addressed callback target" },
  PROXY_TARGET_FORBIDDEN: { status: 403, kind: "user", title: "Pod address outside the pod networks" },
  PROXY_HOST_MISMATCH: { status: 400, kind: "user", title: "Host header disagrees with the target" },
  PROXY_FRAMING_INVALID: { status: 400, kind: "user", title: "Ambiguous request framing" },
  CONNECT_DISABLED: { status: 405, kind: "user", title: "CONNECT tunnels are disabled" },
  UPSTREAM_UNAVAILABLE: { status: 502, kind: "system", title: "The pod could not be reached" },
  UPSTREAM_TIMEOUT: { status: 504, kind: "system", title: "The pod did not answer in time" },
  HOLDER_GONE: { status: 502, kind: "system", title: "The replica holding the request is gone" },
  // worker trust: NATS worker auth and per-worker identity
  WORKER_TOKEN_INVALID: { status: 401, kind: "user", title: "Invalid worker identity token" },
  WORKER_TOKEN_EXPIRED: { status: 401, kind: "user", title: "Worker identity token expired" },
  WORKER_TOKEN_REVOKED: { status: 401, kind: "user", title: "Worker identity revoked" },
  NATS_ACCOUNT_REFUSED: { status: 403, kind: "user", title: "NATS account or plugin not served" },
  WORKER_AUTH_MODE_OFF: { status: 403, kind: "user", title: "Worker token mode is off" },
  IDENTITY_NOT_FOUND: { status: 404, kind: "user", title: "Worker identity not found" },
  CLUSTER_KEYS_INVALID: { status: 400, kind: "user", title: "Cluster keys refused" },
  CLUSTER_NOT_ENROLLED: { status: 403, kind: "user", title: "Cluster not enrolled" },
  CLUSTER_PROOF_REFUSED: { status: 403, kind: "user", title: "Cluster proof refused" },
  // gRPC invocation (grpc-proxy) and its worker tunnel
  FUNCTION_ID_REQUIRED: { status: 400, kind: "user", title: "function-id metadata missing" },
  FUNCTION_NOT_GRPC: { status: 400, kind: "user", title: "Not a gRPC function" },
  GRPC_PATH_INVALID: { status: 400, kind: "user", title: "Not a gRPC method path" },
  TOO_MANY_IN_FLIGHT: { status: 429, kind: "user", title: "Too many requests in flight for this key" },
  WORKER_LINK_TIMEOUT: { status: 504, kind: "system", title: "No worker connected in time" },
  SESSION_NOT_FOUND: { status: 404, kind: "user", title: "No such gRPC session" },
  TUNNEL_LOST: { status: 503, kind: "system", title: "The worker's tunnel closed" },
  CONNECT_UNAUTHENTICATED: { status: 401, kind: "user", title: "CONNECT without a token" },
  CONNECT_REQUEST_ID_INVALID: { status: 400, kind: "user", title: "CONNECT without a valid request id" },
  CONNECT_TOKEN_INVALID: { status: 403, kind: "user", title: "Invalid CONNECT token" },
  // the admission webhook (kubernetes backend)
  ADMISSION_REVIEW_INVALID: { status: 400, kind: "user", title: "Invalid AdmissionReview" },
  // the operator console (the API's /console pages)
  CONSOLE_ADMIN_REQUIRED: { status: 403, kind: "user", title: "Console needs an admin token" },
  CONSOLE_CROSS_ORIGIN: { status: 403, kind: "user", title: "Cross-origin console action refused" },
  // dependencies and internals
  UNAVAILABLE: { status: 503, kind: "system", title: "Dependency unavailable" },
  INTERNAL: { status: 500, kind: "system", title: "Internal error" },
} as const satisfies Record<string, { status: number; kind: "user" | "system"; title: string }>;

export type ErrorCode = keyof typeof ERROR_CODES;

/** The gRPC status of each code, for calls that grpc-proxy refuses itself (contract §4.1). */
export const GRPC_STATUS: Record<ErrorCode, GrpcStatus> = {
  BAD_REQUEST: GRPC.INVALID_ARGUMENT,
  MALFORMED_JSON: GRPC.INVALID_ARGUMENT,
  VALIDATION_FAILED: GRPC.INVALID_ARGUMENT,
  BAD_POLL_SECONDS: GRPC.INVALID_ARGUMENT,
  UNSUPPORTED_MEDIA_TYPE: GRPC.INVALID_ARGUMENT,
  BODY_TOO_LARGE: GRPC.RESOURCE_EXHAUSTED,
  HEADERS_TOO_LARGE: GRPC.RESOURCE_EXHAUSTED,
  REQUEST_TIMEOUT: GRPC.DEADLINE_EXCEEDED,
  EXPECTATION_FAILED: GRPC.INVALID_ARGUMENT,
  NOT_FOUND: GRPC.UNIMPLEMENTED,
  METHOD_NOT_ALLOWED: GRPC.UNIMPLEMENTED,
  UNAUTHENTICATED: GRPC.UNAUTHENTICATED,
  TOKEN_INVALID: GRPC.UNAUTHENTICATED,
  TOKEN_EXPIRED: GRPC.UNAUTHENTICATED,
  FORBIDDEN_SCOPE: GRPC.PERMISSION_DENIED,
  FUNCTION_NOT_FOUND: GRPC.NOT_FOUND,
  VERSION_NOT_FOUND: GRPC.NOT_FOUND,
  DEPLOYMENT_NOT_FOUND: GRPC.NOT_FOUND,
  KEY_NOT_FOUND: GRPC.NOT_FOUND,
  FUNCTION_NAME_TAKEN: GRPC.ALREADY_EXISTS,
  DEPLOYMENT_EXISTS: GRPC.ALREADY_EXISTS,
  VERSION_DEPLOYED: GRPC.FAILED_PRECONDITION,
  ISSUER_DISABLED: GRPC.NOT_FOUND,
  FUNCTION_NOT_DEPLOYED: GRPC.NOT_FOUND,
  REQUEST_NOT_FOUND: GRPC.NOT_FOUND,
  QUEUE_FULL: GRPC.RESOURCE_EXHAUSTED,
  INVOCATION_TIMEOUT: GRPC.DEADLINE_EXCEEDED,
  WORKER_NOT_ACKNOWLEDGED: GRPC.DEADLINE_EXCEEDED,
  ATTACH_TOKEN_INVALID: GRPC.UNAUTHENTICATED,
  ATTACH_FRAMING_INVALID: GRPC.INVALID_ARGUMENT,
  CLIENT_GONE: GRPC.CANCELLED,
  WORKER_RESPONSE_INVALID: GRPC.INTERNAL,
  SHUTTING_DOWN: GRPC.UNAVAILABLE,
  PROXY_TARGET_INVALID: GRPC.INVALID_ARGUMENT,
  PROXY_TARGET_FORBIDDEN: GRPC.PERMISSION_DENIED,
  PROXY_HOST_MISMATCH: GRPC.INVALID_ARGUMENT,
  PROXY_FRAMING_INVALID: GRPC.INVALID_ARGUMENT,
  CONNECT_DISABLED: GRPC.UNIMPLEMENTED,
  UPSTREAM_UNAVAILABLE: GRPC.UNAVAILABLE,
  UPSTREAM_TIMEOUT: GRPC.DEADLINE_EXCEEDED,
  HOLDER_GONE: GRPC.UNAVAILABLE,
  FUNCTION_ID_REQUIRED: GRPC.INVALID_ARGUMENT,
  FUNCTION_NOT_GRPC: GRPC.FAILED_PRECONDITION,
  GRPC_PATH_INVALID: GRPC.UNIMPLEMENTED,
  TOO_MANY_IN_FLIGHT: GRPC.RESOURCE_EXHAUSTED,
  WORKER_LINK_TIMEOUT: GRPC.DEADLINE_EXCEEDED,
  SESSION_NOT_FOUND: GRPC.NOT_FOUND,
  TUNNEL_LOST: GRPC.UNAVAILABLE,
  CONNECT_UNAUTHENTICATED: GRPC.UNAUTHENTICATED,
  CONNECT_REQUEST_ID_INVALID: GRPC.INVALID_ARGUMENT,
  CONNECT_TOKEN_INVALID: GRPC.PERMISSION_DENIED,
  UNAVAILABLE: GRPC.UNAVAILABLE,
  INTERNAL: GRPC.INTERNAL,
  // the control plane's (secrets, worker trust): never answered on the gRPC port, mapped as NVCF maps
  // HTTP statuses to gRPC ones
  TOKEN_ISSUER_DISABLED: GRPC.UNAUTHENTICATED,
  TOKEN_REVOKED: GRPC.UNAUTHENTICATED,
  HOST_NOT_SERVED: GRPC.INVALID_ARGUMENT,
  ORIGIN_REFUSED: GRPC.PERMISSION_DENIED,
  OPERATOR_CREDENTIAL_REQUIRED: GRPC.UNAUTHENTICATED,
  JSON_TOO_DEEP: GRPC.INVALID_ARGUMENT,
  INVALID_UTF8: GRPC.INVALID_ARGUMENT,
  ACCOUNT_NOT_FOUND: GRPC.NOT_FOUND,
  ACCOUNT_NAME_TAKEN: GRPC.ALREADY_EXISTS,
  ACCOUNT_FORBIDDEN: GRPC.PERMISSION_DENIED,
  POLICY_NOT_ENFORCEABLE: GRPC.INVALID_ARGUMENT,
  IMAGE_DISABLED: GRPC.FAILED_PRECONDITION,
  INSTANCE_TYPE_UNAVAILABLE: GRPC.INVALID_ARGUMENT,
  SECRET_NOT_FOUND: GRPC.NOT_FOUND,
  SECRET_UNREADABLE: GRPC.INTERNAL,
  SECRET_KEY_UNAVAILABLE: GRPC.UNAVAILABLE,
  ROTATION_IN_PROGRESS: GRPC.ABORTED,
  NO_ROTATION: GRPC.FAILED_PRECONDITION,
  MEK_UNKNOWN: GRPC.INVALID_ARGUMENT,
  WORKER_TOKEN_INVALID: GRPC.UNAUTHENTICATED,
  WORKER_TOKEN_EXPIRED: GRPC.UNAUTHENTICATED,
  WORKER_TOKEN_REVOKED: GRPC.UNAUTHENTICATED,
  NATS_ACCOUNT_REFUSED: GRPC.PERMISSION_DENIED,
  WORKER_AUTH_MODE_OFF: GRPC.PERMISSION_DENIED,
  IDENTITY_NOT_FOUND: GRPC.NOT_FOUND,
  CLUSTER_KEYS_INVALID: GRPC.INVALID_ARGUMENT,
  CLUSTER_NOT_ENROLLED: GRPC.PERMISSION_DENIED,
  CLUSTER_PROOF_REFUSED: GRPC.PERMISSION_DENIED,
  ADMISSION_REVIEW_INVALID: GRPC.INVALID_ARGUMENT,
  CONSOLE_ADMIN_REQUIRED: GRPC.PERMISSION_DENIED,
  CONSOLE_CROSS_ORIGIN: GRPC.PERMISSION_DENIED,
};

export interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: ErrorCode;
  instance?: string;
  [extra: string]: unknown;
}

export function problemType(code: ErrorCode): string {
  return `urn:callplane:problem:${code.toLowerCase().replaceAll("_", "-")}`;
}

export class CallplaneError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly extra: Record<string, unknown> | undefined;

  constructor(
    code: ErrorCode,
    detail: string,
    opts: { cause?: unknown; extra?: Record<string, unknown> } = {},
  ) {
    super(detail, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "CallplaneError";
    this.code = code;
    this.status = ERROR_CODES[code].status;
    this.extra = opts.extra;
  }

  toProblem(instance?: string): Problem {
    const p: Problem = {
      type: problemType(this.code),
      title: ERROR_CODES[this.code].title,
      status: this.status,
      detail: this.message,
      code: this.code,
      ...this.extra,
    };
    if (instance !== undefined) p.instance = instance;
    return p;
  }
}

/** Anything thrown that is not a CallplaneError becomes INTERNAL; its cause is logged, never sent. */
export function toCallplaneError(err: unknown): CallplaneError {
  if (err instanceof CallplaneError) return err;
  return new CallplaneError("INTERNAL", "an internal error occurred; the service log has the cause", {
    cause: err,
  });
}

export function isUserError(err: CallplaneError): boolean {
  return ERROR_CODES[err.code].kind === "user";
}
