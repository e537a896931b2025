// gRPC over HTTP/2 without a .proto: the status codes, the reset-code mapping of
// grpc/grpc doc/PROTOCOL-HTTP2.md, grpc-message encoding, and the trailers-only answer a proxy
// gives when it refuses a call itself. grpc-proxy and the worker pass calls through as bytes.
import { constants as h2, type IncomingHttpHeaders, type ServerHttp2Stream } from "node:http2";

export const GRPC = {
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
} as const;

export type GrpcStatus = (typeof GRPC)[keyof typeof GRPC];

/** The gRPC status a client reads from an HTTP/2 reset (RST_STREAM code). */
export function statusOfReset(rstCode: number): GrpcStatus {
  switch (rstCode) {
    case h2.NGHTTP2_REFUSED_STREAM:
      return GRPC.UNAVAILABLE;
    case h2.NGHTTP2_CANCEL:
      return GRPC.CANCELLED;
    case h2.NGHTTP2_ENHANCE_YOUR_CALM:
      return GRPC.RESOURCE_EXHAUSTED;
    case h2.NGHTTP2_INADEQUATE_SECURITY:
      return GRPC.PERMISSION_DENIED;
    default:
      return GRPC.INTERNAL;
  }
}

/** grpc-message: percent-encoded UTF-8, everything outside printable ASCII and '%' escaped. */
export function encodeGrpcMessage(text: string): string {
  let out = "";
  for (const byte of Buffer.from(text, "utf8")) {
    out +=
      byte >= 0x20 && byte <= 0x7e && byte !== 0x25
        ? String.fromCharCode(byte)
        : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

export function decodeGrpcMessage(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}

export function isGrpcRequest(headers: IncomingHttpHeaders): boolean {
  const ct = headers["content-type"];
  return typeof ct === "string" && ct.startsWith("application/grpc");
}

/** The longest delay a Node timer holds (2^31-1 ms, about 24.8 days); a longer one fires at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * `grpc-timeout` (e.g. 150m, 10S) in milliseconds, clamped to what a timer holds; undefined when
 * absent, null when malformed. PROTOCOL-HTTP2.md: at most 8 digits and one unit (H, M, S, m, u, n);
 * a repeated header (Node joins the values) is malformed.
 */
export function grpcTimeoutMs(value: string | string[] | undefined): number | undefined | null {
  if (value === undefined) return undefined;
  const m = typeof value === "string" ? /^(\d{1,8})([HMSmun])$/.exec(value) : null;
  if (!m) return null;
  const n = Number(m[1]);
  const unit = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 0.001, n: 0.000_001 }[m[2] as "H"];
  return Math.min(n * unit, MAX_TIMER_MS);
}

/**
 * A deadline as grpc-timeout, for the next hop: milliseconds while they fit in 8 digits, else whole
 * seconds (at most MAX_TIMER_MS, so a server that reads it into a 32-bit timer does not overflow).
 */
export function formatGrpcTimeout(ms: number): string {
  const clamped = Math.max(1, Math.min(Math.ceil(ms), MAX_TIMER_MS));
  return clamped <= 99_999_999 ? `${clamped}m` : `${Math.floor(clamped / 1000)}S`;
}

/**
 * Whether `path` names a gRPC method: `/<service>/<method>` as PROTOCOL-HTTP2.md builds it from a
 * protobuf service, the service's full name (`package.Service`, dot-separated identifiers; the
 * package may be absent) and the method's name, identifiers being `[A-Za-z_][A-Za-z0-9_]*`. No
 * other character (no `%`, `?`, `..`, empty segment) and nothing else passes, so only methods reach
 * a function's server.
 */
export function isGrpcMethodPath(path: string | undefined): boolean {
  return (
    path !== undefined &&
    path.length <= MAX_GRPC_PATH &&
    /^\/[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*\/[A-Za-z_][A-Za-z0-9_]*$/.test(path)
  );
}

const MAX_GRPC_PATH = 1024;

/**
 * The proxy's own answer to a call it refuses: for gRPC a trailers-only response (one HEADERS
 * frame with END_STREAM) with the status and a message that says what was wrong; for anything
 * else the HTTP status with the message as plain text.
 */
export function refuseStream(
  stream: ServerHttp2Stream,
  request: IncomingHttpHeaders,
  refusal: { grpcStatus: GrpcStatus; httpStatus: number; message: string },
  extra: Record<string, string | string[]> = {},
): void {
  if (stream.destroyed || stream.closed || stream.headersSent) {
    if (!stream.destroyed) stream.close(h2.NGHTTP2_INTERNAL_ERROR);
    return;
  }
  if (isGrpcRequest(request)) {
    stream.respond(
      {
        ":status": 200,
        "content-type": "application/grpc",
        "grpc-status": String(refusal.grpcStatus),
        "grpc-message": encodeGrpcMessage(refusal.message),
        ...extra,
      },
      { endStream: true },
    );
  } else {
    const body = Buffer.from(`${refusal.message}\n`);
    stream.respond({
      ":status": refusal.httpStatus,
      "content-type": "text/plain; charset=utf-8",
      "content-length": body.length,
      ...extra,
    });
    stream.end(body);
  }
  // a client still sending its messages is not read any further
  stream.resume();
}

/** One length-prefixed gRPC message (uncompressed). */
export function frameGrpcMessage(message: Uint8Array): Buffer {
  const out = Buffer.allocUnsafe(5 + message.length);
  out[0] = 0;
  out.writeUInt32BE(message.length, 1);
  out.set(message, 5);
  return out;
}
