// Answers: JSON bodies and RFC 7807 problem+json for every refusal, on a response or a raw socket.
import { STATUS_CODES, type IncomingMessage, type ServerResponse } from "node:http";
import { CallplaneError, isUserError, toCallplaneError } from "../errors.js";
import type { Logger } from "../log.js";

export function sendJson(
  res: ServerResponse,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

/**
 * Answers with an RFC 7807 body. Once headers are out, a problem body would corrupt the stream, so
 * the connection is destroyed instead.
 */
export function sendProblem(
  res: ServerResponse,
  err: unknown,
  log: Logger,
  headers: Record<string, string> = {},
): void {
  if (clientWentAway(err, res.req)) {
    // nothing to answer: the client is gone, which is not the service's fault
    log.debug({ err: (err as Error).message }, "the client went away before its request was read");
    res.destroy();
    return;
  }
  const e = toCallplaneError(err);
  if (isUserError(e)) log.debug({ code: e.code, detail: e.message }, "request refused");
  // an answer the service chose (a holder that is gone, a window that ended) is an event to note;
  // an exception it did not expect is an error, with its stack
  else if (err instanceof CallplaneError && err.cause === undefined)
    log.warn({ code: e.code, detail: e.message }, "request failed");
  else log.error({ code: e.code, err: e.cause ?? e }, e.message);
  if (res.headersSent || res.destroyed) {
    res.destroy();
    return;
  }
  writeProblem(res, e, headers);
}

/** Writes an RFC 7807 answer (no logging: for callers that log in their own way). */
export function writeProblem(
  res: ServerResponse,
  e: CallplaneError,
  headers: Record<string, string> = {},
): void {
  const text = JSON.stringify(e.toProblem());
  res.writeHead(e.status, {
    "content-type": "application/problem+json",
    "content-length": Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

/** A whole HTTP/1.1 answer with an RFC 7807 body, for a raw socket; the connection closes after it. */
export function rawProblem(e: CallplaneError): string {
  const body = JSON.stringify(e.toProblem());
  return `HTTP/1.1 ${e.status} ${STATUS_CODES[e.status] ?? ""}\r\ncontent-type: application/problem+json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`;
}

/**
 * Whether an error is a client that went away mid-request (not a fault of the service): a reset
 * or abort while its request was still arriving, or once its connection is gone. (`req.destroyed`
 * alone would not do: Node sets it once a body has been read to its end.)
 */
export function clientWentAway(err: unknown, req: IncomingMessage | undefined): boolean {
  const e = err as NodeJS.ErrnoException | undefined;
  const reset =
    e?.code === "ECONNRESET" || e?.message === "aborted" || e?.code === "ERR_STREAM_PREMATURE_CLOSE";
  return reset && (req === undefined || !req.complete || req.socket.destroyed);
}
