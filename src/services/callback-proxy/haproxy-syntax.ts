// Writing HAProxy's configuration language safely: log-format strings held in single quotes,
// sample fetches escaped for a JSON string, durations, and the RFC 7807 body HAProxy answers with
// when it refuses a request itself (the same body, with callplane's stable error code, that
// callplane's own services write).
import { CallplaneError, type ErrorCode } from "../../lib/errors.js";

/** A duration in whole seconds, at least one (HAProxy's timeouts and hard-stop-after). */
export function seconds(ms: number): string {
  return `${Math.max(1, Math.ceil(ms / 1000))}s`;
}

/**
 * A log-format string for HAProxy: `%` doubled, and nothing that would end the single-quoted word
 * the configuration holds it in.
 */
export function lf(text: string): string {
  if (text.includes("'")) throw new Error(`no single quote may appear in an HAProxy string: ${text}`);
  return text;
}

/**
 * The RFC 7807 body of a refusal, as callplane's own services write it. `detail` may hold HAProxy
 * log-format expressions (`%[...]`), which are evaluated per request; the expressions used here
 * end in `json(utf8s)`, so what they insert is escaped for a JSON string.
 */
export function problem(code: ErrorCode, detail: string): string {
  const p = new CallplaneError(code, "\u0000").toProblem();
  return lf(JSON.stringify(p).replace('"\\u0000"', JSON.stringify(detail).replace(/\\\\/g, "\\")));
}

/** A sample fetch escaped for a JSON string inside a log-format body (at most 100 characters). */
export function quoted(fetch: string): string {
  return `%[${fetch},bytes(0,100),json(utf8s)]`;
}
