// What a handler reads from a request: the bearer token and a JSON body within its size limit.
import { type IncomingMessage } from "node:http";
import { CallplaneError } from "../errors.js";
import { countHeader } from "./headers.js";

export function bearerToken(req: IncomingMessage): string {
  const h = req.headers.authorization;
  if (!h) throw new CallplaneError("UNAUTHENTICATED", "send an Authorization: Bearer <token> header");
  // Node keeps only the first of several; which one counts must not depend on their order
  if (countHeader(req.rawHeaders, "authorization") > 1)
    throw new CallplaneError("BAD_REQUEST", "the request has more than one Authorization header; send one");
  const m = /^Bearer\s+(\S+)\s*$/i.exec(h);
  if (!m)
    throw new CallplaneError(
      "UNAUTHENTICATED",
      "the Authorization header must use the Bearer scheme: Authorization: Bearer <token>",
    );
  return m[1];
}

/** How deep a JSON body may nest (objects and arrays): deeper is refused with JSON_TOO_DEEP. */
export const JSON_MAX_DEPTH = 64;

/**
 * The one media type a JSON body may carry: `application/json`, optionally with `charset=utf-8`.
 * Not `application/*+json` nor `application/json-patch+json`: those mean something else, and a
 * handler that parsed them as plain JSON would apply a patch as if it were the resource.
 */
export function isJsonContentType(type: string): boolean {
  return /^\s*application\/json\s*(;\s*charset\s*=\s*"?utf-8"?\s*)?$/i.test(type);
}

/** Refuses a content type other than exactly JSON (see isJsonContentType). */
export function requireJsonContentType(type: string | undefined): void {
  if (type === undefined)
    throw new CallplaneError(
      "UNSUPPORTED_MEDIA_TYPE",
      "the body has no Content-Type; send it as Content-Type: application/json",
    );
  if (!isJsonContentType(type))
    throw new CallplaneError(
      "UNSUPPORTED_MEDIA_TYPE",
      `send the body as Content-Type: application/json (optionally ; charset=utf-8), not ${JSON.stringify(type.slice(0, 100))}`,
    );
}

/** Where the first byte that is not well-formed UTF-8 is (Unicode's Table 3-7), or -1. */
export function invalidUtf8Offset(b: Uint8Array): number {
  let i = 0;
  while (i < b.length) {
    const c = b[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    let n: number;
    let lo = 0x80;
    let hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) n = 1;
    else if (c >= 0xe0 && c <= 0xef) {
      n = 2;
      if (c === 0xe0) lo = 0xa0;
      else if (c === 0xed) hi = 0x9f; // no UTF-16 surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      n = 3;
      if (c === 0xf0) lo = 0x90;
      else if (c === 0xf4) hi = 0x8f; // nothing past U+10FFFF
    } else return i;
    for (let k = 1; k <= n; k++) {
      const x = b[i + k];
      if (x === undefined || x < (k === 1 ? lo : 0x80) || x > (k === 1 ? hi : 0xbf)) return i;
    }
    i += n + 1;
  }
  return -1;
}

// fatal: a body that is not UTF-8 is refused, never stored with U+FFFD in place of what was sent
const utf8 = new TextDecoder("utf-8", { fatal: true });

/** The bytes as UTF-8 text, or INVALID_UTF8 naming the offset of the first bad byte. */
export function decodeUtf8(bytes: Uint8Array): string {
  try {
    return utf8.decode(bytes);
  } catch {
    const at = invalidUtf8Offset(bytes);
    throw new CallplaneError(
      "INVALID_UTF8",
      `the body is not valid UTF-8: the byte at offset ${at} (0x${(bytes[at] ?? 0).toString(16).padStart(2, "0")}) does not begin a well-formed character; send the text encoded as UTF-8`,
      { extra: { offset: at } },
    );
  }
}

function formatPath(path: ReadonlyArray<string | number>): string {
  let out = "";
  for (const seg of path) {
    if (typeof seg === "number") out += `[${seg}]`;
    else if (/^[A-Za-z_$][\w$]*$/.test(seg)) out += out ? `.${seg}` : seg;
    else out += `[${JSON.stringify(seg.length > 40 ? `${seg.slice(0, 40)}…` : seg)}]`;
  }
  return out || "(the body)";
}

/**
 * Refuses JSON nested deeper than `max`, naming where. A scan of the text, without recursion and
 * before JSON.parse, so that no later step (a schema, a walk over the value, JSON.stringify) meets
 * a value deep enough to overflow the stack. Only valid JSON needs a right answer: anything else
 * fails JSON.parse next.
 */
export function checkJsonDepth(text: string, max = JSON_MAX_DEPTH, opts: { sensitive?: boolean } = {}): void {
  // one frame per open container: its path segment so far, and (for objects) whether the next
  // string is a key
  const path: Array<string | number> = [];
  const kinds: Array<"{" | "["> = [];
  let expectKey = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (ch === 0x22 /* " */) {
      const start = i;
      for (i++; i < text.length; i++) {
        const c = text.charCodeAt(i);
        if (c === 0x5c /* \ */) i++;
        else if (c === 0x22) break;
      }
      if (expectKey && kinds.length) {
        let key: string;
        try {
          key = JSON.parse(text.slice(start, i + 1)) as string;
        } catch {
          key = text.slice(start + 1, i);
        }
        path[path.length - 1] = key;
        expectKey = false;
      }
    } else if (ch === 0x7b /* { */ || ch === 0x5b /* [ */) {
      if (kinds.length >= max) {
        const shown = opts.sensitive && path.length > 3 ? [...path.slice(0, 3)] : path;
        const where = formatPath(shown) + (shown === path ? "" : "…");
        throw new CallplaneError(
          "JSON_TOO_DEEP",
          `the body nests deeper than ${max} levels of objects and arrays, at ${where}; send flatter JSON`,
          { extra: { errors: [{ field: where, message: `nested deeper than ${max} levels` }] } },
        );
      }
      kinds.push(ch === 0x7b ? "{" : "[");
      path.push(ch === 0x7b ? "" : 0);
      expectKey = ch === 0x7b;
    } else if (ch === 0x7d /* } */ || ch === 0x5d /* ] */) {
      kinds.pop();
      path.pop();
      expectKey = false;
    } else if (ch === 0x2c /* , */) {
      const top = kinds.length - 1;
      if (top < 0) continue;
      if (kinds[top] === "[") path[top] = (path[top] as number) + 1;
      else expectKey = true;
    }
  }
}

/**
 * A JSON request body's bytes as a value: UTF-8 (fatal), nested at most JSON_MAX_DEPTH deep, then
 * parsed. Every JSON body a service reads goes through here. `sensitive`: the body holds secret
 * values, so no error quotes it (V8's parse message does).
 */
export function parseJsonBody(bytes: Uint8Array, opts: { sensitive?: boolean } = {}): unknown {
  const text = decodeUtf8(bytes);
  checkJsonDepth(text, JSON_MAX_DEPTH, opts);
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    if (opts.sensitive)
      throw new CallplaneError(
        "MALFORMED_JSON",
        "the body is not valid JSON (the parser's message is not repeated here, since the body holds secret values)",
      );
    throw new CallplaneError("MALFORMED_JSON", `the body is not valid JSON: ${(err as Error).message}`);
  }
}

/**
 * Reads a JSON body, counting bytes while they arrive so an oversized body never sits in memory.
 * An empty body is undefined; any other must be `Content-Type: application/json`.
 * `sensitive`: the body holds secret values, so a parse error does not quote it (V8's message does).
 */
export async function readJson(
  req: IncomingMessage,
  limit: number,
  opts: { sensitive?: boolean } = {},
): Promise<unknown> {
  const type = req.headers["content-type"];
  const declared =
    req.headers["content-length"] === undefined ? undefined : Number(req.headers["content-length"]);
  if (declared !== undefined && declared > limit) {
    req.resume();
    throw new CallplaneError("BODY_TOO_LARGE", `the body is ${declared} bytes; the limit is ${limit} bytes`);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  let tooLarge = false;
  // destroyOnReturn: false, because leaving the loop early must not destroy the request: the client
  // would still be sending, and the reset that follows makes it lose the 413 answer.
  for await (const chunk of req.iterator({ destroyOnReturn: false }) as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > limit) {
      tooLarge = true;
      break;
    }
    chunks.push(chunk);
  }
  if (tooLarge) {
    req.resume(); // discard the rest, without keeping it
    throw new CallplaneError("BODY_TOO_LARGE", `the body is larger than the limit of ${limit} bytes`);
  }
  if (size === 0) return undefined;
  requireJsonContentType(type);
  return parseJsonBody(Buffer.concat(chunks, size), opts);
}
