// The worker's answer travels to the invocation service framed as an HTTP/1.1 message inside the
// body of POST /v2/nvcf/worker/request-attach (content type application/octet-stream+h1): the
// status line, the headers, an empty line, then the body bytes as they come. This module writes
// that head and parses it back, strictly: a head that is malformed, too large, or carries a
// Transfer-Encoding (the outer request already frames the body) is refused.
import { STATUS_CODES } from "node:http";

export const H1_CONTENT_TYPE = "application/octet-stream+h1";
export const MAX_HEAD_BYTES = 64 * 1024;
export const MAX_HEADERS = 100;

const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
// field-value: visible characters, spaces and tabs; no CR, LF or NUL (RFC 9110 §5.5)
const FIELD_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;

export function serializeResponseHead(
  status: number,
  headers: Iterable<[string, string]>,
  reason?: string,
): Buffer {
  let head = `HTTP/1.1 ${status} ${reason ?? STATUS_CODES[status] ?? "Unknown"}\r\n`;
  for (const [name, value] of headers) {
    if (!TOKEN.test(name) || !FIELD_VALUE.test(value)) continue;
    head += `${name}: ${value}\r\n`;
  }
  return Buffer.from(`${head}\r\n`, "latin1");
}

export interface ParsedHead {
  status: number;
  reason: string;
  /** Header pairs in order, names as sent. */
  headers: Array<[string, string]>;
  contentLength: number | undefined;
}

export class FramingError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "FramingError";
  }
}

/** Parses a complete head (without the final CRLFCRLF). */
function parseResponseHead(head: string): ParsedHead {
  const lines = head.split("\r\n");
  const m = /^HTTP\/1\.[01] (\d{3})(?: (.*))?$/.exec(lines[0] ?? "");
  if (!m)
    throw new FramingError(
      `the first line must be a status line such as "HTTP/1.1 200 OK", not ${JSON.stringify((lines[0] ?? "").slice(0, 80))}`,
    );
  const status = Number(m[1]);
  if (status < 100 || status > 599) throw new FramingError(`status ${status} is outside 100-599`);
  if (status < 200) throw new FramingError(`an informational status (${status}) cannot be the response`);
  const headers: Array<[string, string]> = [];
  let contentLength: number | undefined;
  for (const line of lines.slice(1)) {
    if (line.startsWith(" ") || line.startsWith("\t"))
      throw new FramingError("obsolete line folding in a header is not allowed");
    const colon = line.indexOf(":");
    if (colon <= 0) throw new FramingError(`malformed header line ${JSON.stringify(line.slice(0, 80))}`);
    const name = line.slice(0, colon);
    const value = line.slice(colon + 1).trim();
    if (!TOKEN.test(name)) throw new FramingError(`invalid header name ${JSON.stringify(name.slice(0, 80))}`);
    if (!FIELD_VALUE.test(value)) throw new FramingError(`invalid characters in the value of header ${name}`);
    const lower = name.toLowerCase();
    if (lower === "transfer-encoding")
      throw new FramingError(
        "Transfer-Encoding in the inner response is not supported; the outer request frames the body",
      );
    if (lower === "content-length") {
      if (!/^\d{1,15}$/.test(value))
        throw new FramingError(`invalid Content-Length ${JSON.stringify(value)}`);
      const n = Number(value);
      if (contentLength !== undefined && contentLength !== n)
        throw new FramingError("conflicting Content-Length headers");
      contentLength = n;
    }
    headers.push([name, value]);
    if (headers.length > MAX_HEADERS) throw new FramingError(`more than ${MAX_HEADERS} headers`);
  }
  return { status, reason: m[2] ?? "", headers, contentLength };
}

/**
 * Reads a framed head from the start of a stream of chunks. Feed chunks until it returns a result;
 * `rest` holds the body bytes that arrived with the head.
 */
export class HeadReader {
  private buf: Buffer = Buffer.alloc(0);

  push(chunk: Buffer): { head: ParsedHead; rest: Buffer } | undefined {
    const searchFrom = Math.max(0, this.buf.length - 3);
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const end = this.buf.indexOf("\r\n\r\n", searchFrom, "latin1");
    if (end === -1) {
      // a CRLF head holds no LF LF before its end; finding one means lines end in bare LF
      if (this.buf.indexOf("\n\n", Math.max(0, searchFrom - 1), "latin1") !== -1)
        throw new FramingError(
          "the response head has lines ending in a bare LF; every line of the framed head must end in CRLF",
        );
      if (this.buf.length > MAX_HEAD_BYTES)
        throw new FramingError(`the response head is larger than ${MAX_HEAD_BYTES} bytes`);
      return undefined;
    }
    if (end > MAX_HEAD_BYTES)
      throw new FramingError(`the response head is larger than ${MAX_HEAD_BYTES} bytes`);
    const head = parseResponseHead(this.buf.toString("latin1", 0, end));
    const rest = this.buf.subarray(end + 4);
    this.buf = Buffer.alloc(0);
    return { head, rest };
  }
}
