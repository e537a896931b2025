// One HTTP/2 stream passed to another HTTP/2 session and its answer back: grpc-proxy (client call
// → the worker's tunnel) and the worker (tunnel → the inference server) both use it. Bytes flow
// through pipe(), so HTTP/2 flow control holds end to end: a slow reader stops the window updates
// of the hop before it, and what a stream holds is bounded by its window and the stream buffers.
// Trailers are passed on after the body; a trailers-only answer (a gRPC error without a body) stays
// one HEADERS frame with END_STREAM; a reset on either side resets the other with the same code
// (a client's cancel reaches the inference server as a CANCEL).
import {
  constants as h2,
  type ClientHttp2Session,
  type Http2Stream,
  type IncomingHttpHeaders,
  type OutgoingHttpHeaders,
  type ServerHttp2Stream,
} from "node:http2";
import {
  GRPC,
  encodeGrpcMessage,
  isGrpcRequest,
  refuseStream,
  statusOfReset,
  type GrpcStatus,
} from "./protocol.js";
// the file itself, not the folder's index: lib/http imports errors.ts, which imports this folder
import { HOP_BY_HOP } from "../http/headers.js";

/**
 * Window sizes: a stream may have 1 MiB in flight and a connection 16 MiB (the defaults, 64 KiB
 * each, throttle large messages on any link). maxSessionMemory is raised to match, since Node
 * refuses new streams (ENHANCE_YOUR_CALM) once a session holds more than it.
 */
export const H2_STREAM_WINDOW = 1024 * 1024;
export const H2_CONNECTION_WINDOW = 16 * 1024 * 1024;
export const H2_SETTINGS = {
  initialWindowSize: H2_STREAM_WINDOW,
  maxFrameSize: 64 * 1024,
  maxHeaderListSize: 64 * 1024,
  enablePush: false,
} as const;
export const H2_SESSION_OPTIONS = {
  settings: H2_SETTINGS,
  maxSessionMemory: 64,
  maxOutstandingPings: 10,
} as const;

/** Raises a session's connection window (call once it is connected or, server side, at 'session'). */
export function widenWindow(session: { setLocalWindowSize(n: number): void; destroyed: boolean }): void {
  if (session.destroyed) return;
  try {
    session.setLocalWindowSize(H2_CONNECTION_WINDOW);
  } catch {
    // a session that closed meanwhile
  }
}

// HTTP/2 carries no connection-specific header (RFC 9113 §8.2.2) but `te: trailers`, which gRPC
// needs; `host` is the `:authority` pseudo-header there
const REQUEST_DROP = new Set([...HOP_BY_HOP, "host", "http2-settings"]);

/** A request's headers for the next hop: its pseudo-headers, `te: trailers` only, minus `drop`. */
export function nextHopRequestHeaders(
  headers: IncomingHttpHeaders,
  drop: ReadonlySet<string>,
  add: OutgoingHttpHeaders = {},
): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined || drop.has(k)) continue;
    if (k === "te" ? v !== "trailers" : REQUEST_DROP.has(k)) continue;
    out[k] = v;
  }
  return Object.assign(out, add);
}

function responseHeaders(headers: IncomingHttpHeaders, add: OutgoingHttpHeaders): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined || (k.startsWith(":") && k !== ":status") || REQUEST_DROP.has(k)) continue;
    out[k] = v;
  }
  return Object.assign(out, add);
}

function trailerHeaders(headers: IncomingHttpHeaders): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined && !k.startsWith(":")) out[k] = v;
  return out;
}

/**
 * What a relayed stream's writable side takes before write() asks its source to wait. Node gives
 * every HTTP/2 stream 16 KiB, one DATA frame: every frame relayed then paused the source and
 * resumed it on 'drain', a round of native read-stop/read-start and events per 16 KiB that cost
 * each hop about a third of its CPU on a 32 MiB message and stalled the pipeline between frames.
 * A stream holds at most this much beyond its HTTP/2 window.
 */
export const H2_STREAM_BUFFER = 256 * 1024;

/**
 * Gives a stream's writable side H2_STREAM_BUFFER. Node offers no option for it on HTTP/2 streams
 * (session.request() and the server's 'stream' make them); the mark is read on every write, so
 * setting it before the first write takes effect (h2-forward.test.ts checks it holds).
 */
export function widenStreamBuffer(stream: Http2Stream): void {
  const w = (stream as { _writableState?: { highWaterMark: number } })._writableState;
  if (w) w.highWaterMark = H2_STREAM_BUFFER;
}

/**
 * Bytes from one stream to the other with backpressure: the source pauses while the destination's
 * buffer is full (then the HTTP/2 window of the source's hop stops moving), and the end is passed
 * on. Lighter than pipe(), which adds and removes eight listeners on the two streams of every call;
 * errors and resets are handled by forwardStream's close handlers.
 */
function relay(src: Http2Stream, dst: Http2Stream): void {
  widenStreamBuffer(dst);
  const resume = () => src.resume();
  src.on("data", (chunk: Buffer) => {
    if (!dst.write(chunk)) {
      src.pause();
      dst.once("drain", resume);
    }
  });
  src.once("end", () => {
    if (!dst.destroyed) dst.end();
  });
}

export interface StreamResult {
  /** ok: answered in full; reset: one side reset the stream; failed: the next hop failed first. */
  outcome: "ok" | "reset" | "failed";
  grpcStatus: string | undefined;
  /** When the next hop's response head came (performance.now()); undefined if it never did. */
  firstByteAt: number | undefined;
}

export interface ForwardStreamOptions {
  /** Headers added to the response head (nvcf-reqid, a cookie). */
  responseHeaders?: OutgoingHttpHeaders;
  /**
   * What the client is told when the next hop fails: before it answered (a trailers-only answer),
   * or, for gRPC, after (as trailers). `sessionGone`: the whole session to the next hop closed.
   */
  failure: (
    rstCode: number,
    sessionGone: boolean,
  ) => { grpcStatus: GrpcStatus; httpStatus: number; message: string };
}

/** Passes `down` (a stream a client opened) to `session`; resolves when both sides are done. */
export function forwardStream(
  down: ServerHttp2Stream,
  downHeaders: IncomingHttpHeaders,
  downEnded: boolean,
  session: ClientHttp2Session,
  upHeaders: OutgoingHttpHeaders,
  opts: ForwardStreamOptions,
): Promise<StreamResult> {
  return new Promise((resolve) => {
    const result: StreamResult = { outcome: "ok", grpcStatus: undefined, firstByteAt: undefined };
    let up;
    try {
      up = session.request(upHeaders, { endStream: downEnded });
    } catch {
      const f = opts.failure(h2.NGHTTP2_REFUSED_STREAM, session.destroyed || session.closed);
      refuseStream(down, downHeaders, f, opts.responseHeaders as Record<string, string>);
      resolve({ ...result, outcome: "failed", grpcStatus: String(f.grpcStatus) });
      return;
    }
    let responded = false;
    let trailers: OutgoingHttpHeaders | undefined;
    let downClosed = false;
    let upClosed = false;
    const settle = () => {
      if (downClosed && upClosed) resolve(result);
    };
    down.on("error", () => undefined);
    up.on("error", () => undefined);
    if (!downEnded) relay(down, up);
    up.on("response", (headers, flags) => {
      responded = true;
      result.firstByteAt = performance.now();
      const out = responseHeaders(headers, opts.responseHeaders ?? {});
      if (flags & h2.NGHTTP2_FLAG_END_STREAM) {
        // trailers-only (a gRPC error without a body): one HEADERS frame, as it came
        result.grpcStatus = headers["grpc-status"] as string | undefined;
        if (!down.destroyed && !down.headersSent) down.respond(out, { endStream: true });
        up.resume();
        return;
      }
      if (down.destroyed) return;
      down.respond(out, { waitForTrailers: true });
      relay(up, down);
    });
    up.on("trailers", (headers: IncomingHttpHeaders) => {
      trailers = trailerHeaders(headers);
      result.grpcStatus = headers["grpc-status"] as string | undefined;
    });
    down.on("wantTrailers", () => {
      if (down.destroyed) return;
      // a gRPC answer whose body ended without trailers has no status: the client is told so
      if (!trailers && isGrpcRequest(downHeaders))
        trailers = {
          "grpc-status": String(GRPC.INTERNAL),
          "grpc-message": encodeGrpcMessage("the next hop ended its answer without a gRPC status"),
        };
      down.sendTrailers(trailers ?? {});
    });
    down.once("close", () => {
      downClosed = true;
      if (!upClosed && !up.destroyed && !(up.readableEnded && up.writableEnded)) {
        // the client left (or reset): the next hop hears the same (a client cancel is CANCEL)
        result.outcome = "reset";
        const code = down.rstCode;
        up.close(code && code !== h2.NGHTTP2_NO_ERROR ? code : h2.NGHTTP2_CANCEL);
      }
      settle();
    });
    up.once("close", () => {
      upClosed = true;
      const code = up.rstCode ?? h2.NGHTTP2_NO_ERROR;
      if (!downClosed && !down.destroyed) {
        const gone = session.destroyed || session.closed;
        if (!responded) {
          result.outcome = "failed";
          const f = opts.failure(code, gone);
          result.grpcStatus = String(f.grpcStatus);
          refuseStream(down, downHeaders, f, opts.responseHeaders as Record<string, string>);
        } else if (isGrpcRequest(downHeaders)) {
          // A gRPC answer is whole once its trailers came; those go out as they are (Node ends the
          // client's stream after them, even while the client still sends). Without them the next
          // hop reset the stream or its session went: Node ends the readable side of a stream
          // whose session closes as if the answer were over, so an ended body proves nothing. The
          // client is told with a status, as trailers, never with a reset (which it reads as
          // INTERNAL); the body relayed so far stands.
          if (!trailers) {
            result.outcome = "reset";
            const f = opts.failure(code, gone);
            result.grpcStatus = String(f.grpcStatus);
            trailers = { "grpc-status": String(f.grpcStatus), "grpc-message": encodeGrpcMessage(f.message) };
            up.removeAllListeners("data");
            if (!down.writableEnded) down.end();
          }
        } else if (code !== h2.NGHTTP2_NO_ERROR) {
          result.outcome = "reset";
          down.close(code);
        }
      }
      settle();
    });
  });
}

/** What a client hears when the next hop reset a call before answering it. */
export function resetFailure(where: string): ForwardStreamOptions["failure"] {
  return (rstCode, sessionGone) => {
    const status = sessionGone || rstCode === h2.NGHTTP2_NO_ERROR ? GRPC.UNAVAILABLE : statusOfReset(rstCode);
    return {
      grpcStatus: status,
      httpStatus: status === GRPC.CANCELLED ? 499 : 502,
      message: `${where} ended the call before answering (HTTP/2 reset code ${rstCode})`,
    };
  };
}
