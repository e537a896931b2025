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

/**
 * Reads a JSON body, counting bytes while they arrive so an oversized body never sits in memory.
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
  if (type !== undefined && !/^application\/(.+\+)?json\b/i.test(type)) {
    throw new CallplaneError("UNSUPPORTED_MEDIA_TYPE", `send the body as application/json, not ${type}`);
  }
  const text = Buffer.concat(chunks, size).toString("utf8");
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
