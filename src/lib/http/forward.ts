// Forwarding one HTTP request to an upstream and its answer back, streamed both ways with
// backpressure: the callback proxy (worker → pod) and the replica relay (wrong replica → holder)
// both use it. There is no whole-request timeout, so long streams survive; instead the exchange ends
// when no bytes move in either direction for `idleMs`. An upstream that answers 101 is refused.
//
// Backpressure toward the upstream goes through undici's pause() and resume(), which is costly to
// use naively: each resume reads the socket's whole buffer (concatenating it) to feed the parser,
// and a chunked answer pauses the parser again after its next chunk and unshifts the rest, while the
// socket goes on reading from the kernel. Pausing at every write that returns false (the client
// socket's 16 KiB mark, nearly every write) thus let the backlog grow to tens of MB, with every
// resume copying all of it: a 256 MiB chunked echo through the proxy ran at 3 MB/s with the proxy
// at +300 MiB. So the upstream is paused only once the client side holds PAUSE_BUDGET bytes unsent,
// and resumed when it has drained: each resume then meets at most one socket buffer, which it
// passes on whole, and the bytes held per stream stay bounded by the budget and the two sockets'
// buffers, whatever the backlog upstream.
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from "node:http";
import type { Dispatcher } from "undici";
import type { CallplaneError } from "../errors.js";
import { endToEndHeaders, endToEndPairs, foldPairs, rawPairs } from "./headers.js";
import { writeProblem } from "./problem.js";

export type ForwardOutcome =
  "forwarded" | "client_gone" | "upstream_error" | "upstream_timeout" | "refused_framing";

export interface ForwardResult {
  outcome: ForwardOutcome;
  status: number;
  bytesIn: number;
  bytesOut: number;
  /** Why it did not end normally. */
  reason: string | undefined;
  /** The upstream error, when there was one. */
  error: Error | undefined;
}

/** Bytes the client side may hold unsent before the upstream is paused (see above). */
export const PAUSE_BUDGET = 256 * 1024;

export interface ForwardOptions {
  dispatcher: Dispatcher;
  origin: string;
  path: string;
  headers: Record<string, string | string[]>;
  idleMs: number;
  /** TLS server name to present when it differs from the origin's host. */
  servername?: string;
  /**
   * What to answer the client when the upstream failed before any response head (the caller knows
   * what to say; forward() writes it); after the head, the client connection is destroyed instead.
   */
  onFailure: (result: ForwardResult) => CallplaneError;
}

/** Resolves with the first body chunk once it parsed cleanly (or null at the end of an empty body). */
function firstChunk(req: IncomingMessage): Promise<{ chunk: Buffer | null; ended: boolean }> {
  return new Promise((resolve, reject) => {
    const cleanup = () => {
      req.off("readable", onReadable);
      req.off("end", onEnd);
      req.off("error", onError);
      req.off("close", onClose);
    };
    const onReadable = () => {
      const c = req.read() as Buffer | null;
      if (c === null) return;
      cleanup();
      resolve({ chunk: c, ended: req.readableEnded });
    };
    const onEnd = () => {
      cleanup();
      resolve({ chunk: null, ended: true });
    };
    const onError = (err: Error) => {
      cleanup();
      reject(err);
    };
    const onClose = () => {
      cleanup();
      reject(new Error("the request closed before its body began"));
    };
    req.on("readable", onReadable);
    req.once("end", onEnd);
    req.once("error", onError);
    req.once("close", onClose);
  });
}

export function forward(
  req: IncomingMessage,
  res: ServerResponse,
  opts: ForwardOptions,
): Promise<ForwardResult> {
  return new Promise((resolve) => {
    const result: ForwardResult = {
      outcome: "forwarded",
      status: 0,
      bytesIn: 0,
      bytesOut: 0,
      reason: undefined,
      error: undefined,
    };
    let controller: Dispatcher.DispatchController | undefined;
    let paused = false;
    let chunkedAnswer = false;
    let done = false;
    const hasBody = req.method !== "GET" && req.method !== "HEAD";
    const declared =
      req.headers["content-length"] === undefined ? undefined : Number(req.headers["content-length"]);
    const socket = req.socket;
    const readAtStart = socket.bytesRead;
    // Idleness is judged from the client socket's byte counters (both directions) and the bytes
    // passed back, checked when the timer fires, rather than by work on every chunk.
    let lastActivity = -1;
    const activity = () => socket.bytesRead + socket.bytesWritten + result.bytesOut;
    const idle = setInterval(() => {
      const now = activity();
      if (now !== lastActivity) {
        lastActivity = now;
        return;
      }
      result.outcome = "upstream_timeout";
      result.reason = `no bytes moved in either direction for ${opts.idleMs / 1000} s`;
      controller?.abort(new Error(result.reason));
    }, opts.idleMs);
    lastActivity = activity();
    const finish = () => {
      if (done) return;
      done = true;
      clearInterval(idle);
      result.bytesIn = declared ?? Math.max(0, socket.bytesRead - readAtStart);
      resolve(result);
    };
    res.once("close", () => {
      if (!res.writableFinished && result.outcome === "forwarded") {
        result.outcome = "client_gone";
        result.reason = "the client closed its connection";
      }
      if (!res.writableFinished) controller?.abort(new Error("the client went away"));
      finish();
    });
    const fail = (err: Error) => {
      result.error = err;
      if (result.outcome === "forwarded") result.outcome = "upstream_error";
      if (res.headersSent) {
        res.destroy();
        return;
      }
      const e = opts.onFailure(result);
      result.status = e.status;
      writeProblem(res, e);
      req.resume();
    };
    // The head and the first bytes, which usually arrive in the same tick, leave in one write:
    // corked at the head, uncorked once the tick's work is done.
    let corked = false;
    const uncork = () => {
      corked = false;
      res.uncork();
    };
    const cork = () => {
      if (corked) return;
      corked = true;
      res.cork();
      queueMicrotask(uncork);
    };
    const dispatch = (body: Buffer | IncomingMessage | null) =>
      opts.dispatcher.dispatch(
        {
          origin: opts.origin,
          path: opts.path,
          method: req.method as Dispatcher.HttpMethod,
          headers: opts.headers,
          body,
          headersTimeout: 0,
          bodyTimeout: 0,
          // undici takes the TLS server name from the Host header unless told otherwise
          ...(opts.servername ? ({ servername: opts.servername } as object) : {}),
        },
        {
          onRequestStart(c) {
            controller = c;
          },
          onResponseStart(c, statusCode, headers) {
            if (statusCode === 101) {
              result.outcome = "upstream_error";
              result.reason =
                "the upstream answered 101 Switching Protocols; protocol upgrades are not passed on";
              c.abort(new Error(result.reason));
              return;
            }
            result.status = statusCode;
            chunkedAnswer = headers["content-length"] === undefined;
            const out: OutgoingHttpHeaders = endToEndHeaders(headers);
            cork();
            res.writeHead(statusCode, out);
          },
          onResponseData(c, chunk) {
            result.bytesOut += chunk.length;
            // The chunks of a chunked answer that one socket read brought leave in one write: one
            // TLS record per 16 KiB, not one per chunk. (A body with a Content-Length already comes
            // one socket read at a time.)
            if (chunkedAnswer) cork();
            if (!res.write(chunk) && !paused && res.writableLength >= PAUSE_BUDGET) {
              paused = true;
              c.pause();
              res.once("drain", () => {
                paused = false;
                c.resume();
              });
            }
          },
          onResponseEnd() {
            res.end();
          },
          onResponseError(_c, err) {
            fail(err);
          },
        },
      );
    if (!hasBody) {
      dispatch(null);
      return;
    }
    // Dial upstream only once the first body bytes parsed cleanly: a request whose framing breaks
    // at its first chunk (a bad chunk size) then never opens a connection upstream.
    firstChunk(req).then(
      ({ chunk, ended }) => {
        if (ended || (chunk && declared === chunk.length)) {
          // the whole body is here: one buffer, which goes out with the head in one write
          dispatch(chunk ?? Buffer.alloc(0));
          return;
        }
        // the rest streams from the request itself, with backpressure, no copies
        if (chunk) req.unshift(chunk);
        dispatch(req);
      },
      () => {
        result.outcome = "refused_framing";
        result.reason = "the request body could not be parsed";
        finish();
      },
    );
  });
}

/**
 * Copies end-to-end request headers, dropping hop-by-hop ones and what a Connection header lists
 * (except `protect`). `Expect` is dropped too: Node's server has already answered
 * `100-continue` to the client, and the upstream must not wait to send another.
 */
export function forwardHeaders(
  req: IncomingMessage,
  protect: ReadonlySet<string>,
  drop: ReadonlySet<string> = new Set(),
): Record<string, string | string[]> {
  let withExpect = dropWithExpect.get(drop);
  if (!withExpect) {
    withExpect = new Set([...drop, "expect"]);
    dropWithExpect.set(drop, withExpect);
  }
  return foldPairs(endToEndPairs(rawPairs(req.rawHeaders), { drop: withExpect, protect }));
}

// callers pass constant sets: each gets its "plus Expect" set once
const dropWithExpect = new WeakMap<ReadonlySet<string>, ReadonlySet<string>>();
