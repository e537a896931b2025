// Reading request metadata (HTTP/2 call headers, HTTP/1 CONNECT headers) the one way both sides of
// grpc-proxy need: the first of repeated values, a cookie by name, a Bearer token.
import type { IncomingHttpHeaders } from "node:http";

export const first = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

export function cookieValue(header: string | string[] | undefined, name: string): string | undefined {
  for (const h of Array.isArray(header) ? header : header ? [header] : []) {
    for (const part of h.split(";")) {
      const i = part.indexOf("=");
      if (i !== -1 && part.slice(0, i).trim() === name) return part.slice(i + 1).trim();
    }
  }
  return undefined;
}

/** The token of an `Authorization: Bearer <token>` header; undefined if there is none or another scheme. */
export function bearerToken(headers: IncomingHttpHeaders): string | undefined {
  const h = first(headers.authorization);
  return h ? /^Bearer\s+(\S+)\s*$/i.exec(h)?.[1] : undefined;
}
