// Hop-by-hop headers (RFC 9110 §7.6.1) never cross a hop: every proxying step drops them, and the
// headers a Connection header names. endToEnd() is the one filter every hop uses, whatever shape
// its header list has (raw pairs, NATS StringKV entries, a parsed object).
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

export interface EndToEndOptions {
  /** Names (lower case) dropped as well. */
  drop?: ReadonlySet<string>;
  /** Names (lower case) kept even when a Connection header lists them. */
  protect?: ReadonlySet<string>;
}

const NONE: ReadonlySet<string> = new Set();

/**
 * The entries of a header list that cross a hop: no hop-by-hop header, none a Connection header
 * lists (unless protected), none in `drop`. `name` and `value` read an entry of any shape.
 */
export function endToEnd<E>(
  entries: readonly E[],
  name: (e: E) => string,
  value: (e: E) => string,
  opts: EndToEndOptions = {},
): E[] {
  const drop = opts.drop ?? NONE;
  const protect = opts.protect ?? NONE;
  let listed: Set<string> | undefined;
  for (const e of entries) {
    if (name(e).toLowerCase() === "connection") {
      listed ??= new Set();
      for (const n of connectionListed(value(e))) listed.add(n);
    }
  }
  const out: E[] = [];
  for (const e of entries) {
    const lower = name(e).toLowerCase();
    if (HOP_BY_HOP.has(lower) || drop.has(lower)) continue;
    if (listed?.has(lower) && !protect.has(lower)) continue;
    out.push(e);
  }
  return out;
}

/** Node's rawHeaders ([name, value, name, value, ...]) as pairs. */
export function rawPairs(raw: readonly string[]): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  for (let i = 0; i < raw.length; i += 2) out.push([raw[i], raw[i + 1]]);
  return out;
}

/** End-to-end header pairs, for raw pairs or [name, value] tuples. */
export function endToEndPairs(
  pairs: ReadonlyArray<readonly [string, string]>,
  opts: EndToEndOptions = {},
): Array<readonly [string, string]> {
  return endToEnd(
    pairs,
    (p) => p[0],
    (p) => p[1],
    opts,
  );
}

/** Header pairs folded into an object with lower-case names (repeated names become arrays). */
export function foldPairs(
  pairs: ReadonlyArray<readonly [string, string]>,
): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [name, value] of pairs) {
    const lower = name.toLowerCase();
    // own properties only, defined rather than assigned: a header named toString or __proto__ is a
    // header, not Object.prototype's function or the object's prototype
    const cur = Object.hasOwn(out, lower) ? out[lower] : undefined;
    const next = cur === undefined ? value : Array.isArray(cur) ? [...cur, value] : [cur, value];
    Object.defineProperty(out, lower, { value: next, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

/** The end-to-end headers of a parsed header object (lower-case keys). */
export function endToEndHeaders(
  headers: IncomingHttpHeaders | Record<string, string | string[] | undefined>,
  opts: EndToEndOptions = {},
): OutgoingHttpHeaders {
  const entries = Object.entries(headers).filter((e): e is [string, string | string[]] => e[1] !== undefined);
  const kept = endToEnd(
    entries,
    (e) => e[0],
    (e) => (Array.isArray(e[1]) ? e[1].join(",") : e[1]),
    opts,
  );
  return Object.fromEntries(kept);
}

/** How many times a header (lower-case name) occurs in raw header pairs. */
export function countHeader(raw: readonly string[], name: string): number {
  let n = 0;
  for (let i = 0; i < raw.length; i += 2)
    if (raw[i].length === name.length && raw[i].toLowerCase() === name) n++;
  return n;
}
