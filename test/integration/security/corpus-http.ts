// The hostile-request corpus (test/corpus/hostile-requests.json), sent as raw HTTP/1.1 so that
// whatever an entry says is what goes on the wire: repeated headers (a header's value may be a
// list), no Host or a foreign one, any content type, bytes that are not UTF-8.
// In a path, header or body, these are replaced before sending:
//   {operator} {admin} {fid} {vid} ...  the values the test passes (vars)
//   {deep:N}         N nested arrays: [[[...]]]
//   {deepobject:N}   N nested objects: {"a":{"a":...1}}
//   {bytes:HEX}      raw bytes (in rawBody only), for invalid UTF-8
// `body` is sent as its JSON text, `rawBody` as written (after the replacements).
import { connect } from "node:net";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { repoRoot } from "../../testkit/index.js";

export interface CorpusEntry {
  name: string;
  finding: string;
  request: {
    method: string;
    path: string;
    headers: Record<string, string | string[]>;
    body?: unknown;
    rawBody?: string;
  };
  expect: { status: number; code: string };
}

export interface RawAnswer {
  status: number;
  head: string;
  text: string;
  body: { code?: string; detail?: string; status?: number; [k: string]: unknown } | undefined;
}

/** One section of the corpus. */
export function corpusSection(name: string): CorpusEntry[] {
  const doc = JSON.parse(
    readFileSync(join(repoRoot, "test", "corpus", "hostile-requests.json"), "utf8"),
  ) as Record<string, unknown>;
  const section = doc[name];
  if (!Array.isArray(section) || section.length === 0)
    throw new Error(`the corpus has no entries in ${name}`);
  return section as CorpusEntry[];
}

function fill(text: string, vars: Record<string, string>): string {
  return text
    .replace(/\{deep:(\d+)\}/g, (_m, n: string) => "[".repeat(Number(n)) + "]".repeat(Number(n)))
    .replace(
      /\{deepobject:(\d+)\}/g,
      (_m, n: string) => '{"a":'.repeat(Number(n)) + "1" + "}".repeat(Number(n)),
    )
    .replace(/\{([a-z][a-zA-Z]*)\}/g, (m, k: string) => (Object.hasOwn(vars, k) ? vars[k] : m));
}

/** The bytes of a rawBody: the replacements, then each {bytes:HEX} as those bytes. */
function bodyBytes(raw: string, vars: Record<string, string>): Buffer {
  const parts: Buffer[] = [];
  const text = fill(raw, vars);
  let last = 0;
  for (const m of text.matchAll(/\{bytes:([0-9a-f]+)\}/g)) {
    parts.push(Buffer.from(text.slice(last, m.index), "utf8"), Buffer.from(m[1], "hex"));
    last = m.index + m[0].length;
  }
  parts.push(Buffer.from(text.slice(last), "utf8"));
  return Buffer.concat(parts);
}

/** Sends one entry to the service at `base` (http://host:port) and reads the whole answer. */
export function sendEntry(base: string, e: CorpusEntry, vars: Record<string, string>): Promise<RawAnswer> {
  const url = new URL(base);
  const r = e.request;
  const body =
    r.rawBody !== undefined
      ? bodyBytes(r.rawBody, vars)
      : r.body !== undefined
        ? Buffer.from(JSON.stringify(r.body))
        : undefined;
  const lines = [`${r.method} ${fill(r.path, vars)} HTTP/1.1`];
  const names = Object.keys(r.headers).map((k) => k.toLowerCase());
  if (!names.includes("host")) lines.push(`Host: ${url.host}`);
  for (const [k, v] of Object.entries(r.headers))
    for (const one of Array.isArray(v) ? v : [v]) lines.push(`${k}: ${fill(one, vars)}`);
  if (body) lines.push(`Content-Length: ${body.length}`);
  lines.push("Connection: close", "", "");
  const head = Buffer.from(lines.join("\r\n"), "latin1");
  return new Promise((resolve, reject) => {
    const s = connect(Number(url.port), url.hostname);
    const chunks: Buffer[] = [];
    // write, not end: a half-closed connection may be dropped before an async answer is written
    s.on("connect", () => s.write(body ? Buffer.concat([head, body]) : head));
    s.on("data", (d: Buffer) => chunks.push(d));
    s.on("error", reject);
    s.on("close", () => {
      const all = Buffer.concat(chunks);
      const split = all.indexOf("\r\n\r\n");
      const headText = (split === -1 ? all : all.subarray(0, split)).toString("latin1");
      let rest: Buffer = split === -1 ? Buffer.alloc(0) : all.subarray(split + 4);
      if (/^transfer-encoding: chunked/im.test(headText)) rest = dechunk(rest);
      const text = rest.toString("utf8");
      let parsed: RawAnswer["body"];
      try {
        parsed = text ? (JSON.parse(text) as RawAnswer["body"]) : undefined;
      } catch {
        parsed = undefined;
      }
      const m = /^HTTP\/1\.1 (\d{3})/.exec(headText);
      resolve({ status: m ? Number(m[1]) : 0, head: headText, text, body: parsed });
    });
  });
}

function dechunk(b: Buffer): Buffer {
  const out: Buffer[] = [];
  let at = 0;
  for (;;) {
    const nl = b.indexOf("\r\n", at);
    if (nl === -1) break;
    const size = parseInt(b.subarray(at, nl).toString("latin1"), 16);
    if (!size) break;
    out.push(b.subarray(nl + 2, nl + 2 + size));
    at = nl + 2 + size + 2;
  }
  return Buffer.concat(out);
}
