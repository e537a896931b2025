// Fixed output layouts: aligned tables for lists, `key: value` lines for one object, JSON with
// --json. Results go to stdout; notes, progress and errors go to stderr so that stdout stays
// something a script can read.
//
// Text from a server (names, descriptions, error details) is printed through `visible`: a control
// or bidirectional-formatting character in it, stored by an older version or sent by a hostile
// server, is shown as an escape (\x1b, \u202e) instead of moving the cursor or reversing text.
import { CliError } from "./errors.js";

// C0 controls, DEL, C1 controls, the bidi marks and controls, the Unicode line and paragraph
// separators, and lone surrogates
const INVISIBLE =
  // eslint-disable-next-line no-control-regex -- matching control characters is the point
  /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;
const SHORT: Record<string, string> = { "\0": "\\0", "\t": "\\t", "\n": "\\n", "\r": "\\r" };
const hex = (c: string, digits: number) => c.charCodeAt(0).toString(16).padStart(digits, "0");

/** `text` with every character that could move the cursor or reorder text written as an escape. */
export function visible(text: string): string {
  return text.replace(INVISIBLE, (c) =>
    Object.hasOwn(SHORT, c) ? SHORT[c] : c.charCodeAt(0) < 0x100 ? `\\x${hex(c, 2)}` : `\\u${hex(c, 4)}`,
  );
}

/** One line of text on stdout, escaped. */
export function say(line: string): void {
  process.stdout.write(`${visible(line)}\n`);
}

// JSON.stringify escapes C0 controls and lone surrogates but leaves DEL, C1, the bidi characters
// and U+2028/U+2029 raw; as \uXXXX they are the same JSON value, but inert on a terminal.
const RAW_IN_JSON = /[\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

export function printJson(value: unknown): void {
  const text = JSON.stringify(value, null, 2).replace(RAW_IN_JSON, (c) => `\\u${hex(c, 4)}`);
  process.stdout.write(`${text}\n`);
}

/** Prints `key: value` lines with the values aligned; undefined values are left out. */
export function printFields(fields: Array<[string, string | number | undefined]>): void {
  const shown = fields.filter((f): f is [string, string | number] => f[1] !== undefined);
  const width = Math.max(0, ...shown.map(([k]) => k.length + 1));
  for (const [k, v] of shown) say(`${`${k}:`.padEnd(width)} ${v}`);
}

/** Prints an aligned table with a header row; the last column is not padded. */
export function printTable(headers: string[], rawRows: string[][]): void {
  // escaped before measuring, so that the columns line up as printed
  const rows = rawRows.map((r) => r.map(visible));
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i])))
      .join("  ")
      .trimEnd();
  say(line(headers));
  for (const r of rows) say(line(r));
}

/** One line of text on stderr, escaped. */
export function note(line: string): void {
  process.stderr.write(`${visible(line)}\n`);
}

/** "in 11h 59m", "3m ago": how far a time is from now, for expiry lines. */
export function relative(when: Date, now = Date.now()): string {
  const ms = when.getTime() - now;
  const abs = Math.abs(ms);
  const s = Math.round(abs / 1000);
  let text: string;
  if (s < 60) text = `${s}s`;
  else if (s < 3600) text = `${Math.floor(s / 60)}m`;
  else if (s < 86_400) text = `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  else text = `${Math.floor(s / 86_400)}d ${Math.floor((s % 86_400) / 3600)}h`;
  return ms >= 0 ? `in ${text}` : `${text} ago`;
}

export function elapsed(ms: number): string {
  const s = Math.floor(ms / 1000);
  return s < 60 ? `${s}s` : `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
}

/** Prints an error the way every command does; returns the exit code. */
export function reportError(err: unknown, json: boolean): number {
  const e =
    err instanceof CliError
      ? err
      : new CliError(`unexpected failure: ${err instanceof Error ? err.message : String(err)}`, "INTERNAL", {
          hint: "this is a bug in the callplane CLI; please report it with the command you ran",
        });
  // a configuration file's problems are local text, one per line (each line still escaped); any
  // other message, which may carry a server's words, stays on one line
  const lines = e.code === "CONFIG" ? e.message.split("\n") : [e.message];
  note(`callplane: ${lines[0]}${lines.length === 1 ? ` (${e.code})` : ""}`);
  for (const [i, l] of lines.slice(1).entries()) note(i === lines.length - 2 ? `${l} (${e.code})` : l);
  if (e.hint) note(`hint: ${e.hint}`);
  if (json) {
    printJson({
      error: {
        code: e.code,
        message: e.message,
        ...(e.hint ? { hint: e.hint } : {}),
        ...(e.status !== undefined ? { status: e.status } : {}),
        ...e.extra,
      },
    });
  }
  return e.exitCode;
}
