// Fixed output layouts: aligned tables for lists, `key: value` lines for one object, JSON with
// --json. Results go to stdout; notes, progress and errors go to stderr so that stdout stays
// something a script can read.
import { CliError } from "./errors.js";

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/** Prints `key: value` lines with the values aligned; undefined values are left out. */
export function printFields(fields: Array<[string, string | number | undefined]>): void {
  const shown = fields.filter((f): f is [string, string | number] => f[1] !== undefined);
  const width = Math.max(0, ...shown.map(([k]) => k.length + 1));
  for (const [k, v] of shown) console.log(`${`${k}:`.padEnd(width)} ${v}`);
}

/** Prints an aligned table with a header row; the last column is not padded. */
export function printTable(headers: string[], rows: string[][]): void {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i])))
      .join("  ")
      .trimEnd();
  console.log(line(headers));
  for (const r of rows) console.log(line(r));
}

export function note(line: string): void {
  process.stderr.write(`${line}\n`);
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
  process.stderr.write(`callplane: ${e.message} (${e.code})\n`);
  if (e.hint) process.stderr.write(`hint: ${e.hint}\n`);
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
