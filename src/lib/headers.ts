// Hop-by-hop headers (RFC 9110 §7.6.1) never cross a hop: every proxying step drops them, and the
// headers a Connection header names.
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http";

export const HOP_BY_HOP = new Set([
  "connection",
  "proxy-connection",
  "keep-alive",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

/** Names listed in Connection headers (lower case), which are hop-by-hop too. */
export function connectionListed(value: string | string[] | undefined): Set<string> {
  const out = new Set<string>();
  if (value === undefined) return out;
  for (const v of Array.isArray(value) ? value : [value]) {
    for (const name of v.split(",")) {
      const n = name.trim().toLowerCase();
      if (n) out.add(n);
    }
  }
  return out;
}

/** Copies raw header pairs ([name, value, name, value, ...]) without hop-by-hop ones and `drop`. */
export function endToEndPairs(raw: string[], drop: ReadonlySet<string> = new Set()): Array<[string, string]> {
  let listed: Set<string> | undefined;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].toLowerCase() === "connection") {
      listed ??= new Set();
      for (const n of connectionListed(raw[i + 1])) listed.add(n);
    }
  }
  const out: Array<[string, string]> = [];
  for (let i = 0; i < raw.length; i += 2) {
    const lower = raw[i].toLowerCase();
    if (HOP_BY_HOP.has(lower) || drop.has(lower) || listed?.has(lower)) continue;
    out.push([raw[i], raw[i + 1]]);
  }
  return out;
}

/** Same for a parsed header object (lower-case keys). */
export function endToEndHeaders(
  headers: IncomingHttpHeaders | Record<string, string | string[] | undefined>,
  drop: ReadonlySet<string> = new Set(),
): OutgoingHttpHeaders {
  const listed = connectionListed(headers.connection);
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined) continue;
    const lower = k.toLowerCase();
    if (HOP_BY_HOP.has(lower) || drop.has(lower) || listed.has(lower)) continue;
    out[k] = v;
  }
  return out;
}

/** How many times a header (lower-case name) occurs in raw header pairs. */
export function countHeader(raw: readonly string[], name: string): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2)
    if (raw[i].length === name.length && raw[i].toLowerCase() === name) n++;
  return n;
}
