// What HAProxy answers itself when it cannot take a request apart: its parser refuses the request
// before any rule runs (ambiguous framing, too many or too large headers, a head that is late), so
// the answer cannot be written per request. It is a fixed file, a whole HTTP response with
// callplane's problem body, written beside the configuration (haproxyErrorFiles) and named by an
// `errorfile` line of its `defaults` section.
import { CallplaneError } from "../../lib/errors.js";
import type { HaproxyConfigOptions } from "./haproxy-options.js";
import { seconds } from "./haproxy-syntax.js";

/** The header fields a callback may carry (Node's proxy allowed 100). */
export const MAX_HEADERS = 100;

const PARSER_ERRORS: Record<number, (o: HaproxyConfigOptions) => CallplaneError> = {
  400: (o) =>
    new CallplaneError(
      "BAD_REQUEST",
      `the callback proxy (HAProxy) could not take the request apart: ambiguous framing (Content-Length or Transfer-Encoding), a Host header that disagrees with the absolute-form target, more than ${MAX_HEADERS} header fields, a head over ${o.maxHeaderBytes} bytes, or invalid syntax; send one well-formed request with an absolute-form target`,
    ),
  408: (o) =>
    new CallplaneError(
      "REQUEST_TIMEOUT",
      `the request head did not arrive within ${seconds(o.timeouts.headersMs)}; the connection is closed`,
    ),
};

function errorFile(o: HaproxyConfigOptions, status: number): string {
  return `${o.files.errorDir}/${status}.http`;
}

/** The files HAProxy answers its parser's refusals with, by path: whole HTTP responses. */
export function haproxyErrorFiles(o: HaproxyConfigOptions): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [status, err] of Object.entries(PARSER_ERRORS)) {
    const e = err(o);
    const body = JSON.stringify(e.toProblem());
    out[errorFile(o, Number(status))] =
      `HTTP/1.1 ${e.status} ${e.status === 400 ? "Bad Request" : "Request Timeout"}\r\ncontent-type: application/problem+json\r\ncontent-length: ${Buffer.byteLength(body)}\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n${body}`;
  }
  return out;
}

/** The `defaults` lines that name those files. */
export function parserErrorLines(o: HaproxyConfigOptions): string[] {
  return Object.keys(PARSER_ERRORS).map((status) => `  errorfile ${status} ${errorFile(o, Number(status))}`);
}
