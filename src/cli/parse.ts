// Option value parsers: a bad value is a usage error that names the option and says what it takes.
import { InvalidArgumentError } from "commander";

export function integer(min: number, max: number): (value: string) => number {
  return (value) => {
    if (!/^-?\d+$/.test(value.trim()))
      throw new InvalidArgumentError(`Use a whole number from ${min} to ${max}.`);
    const n = Number(value);
    if (n < min || n > max) throw new InvalidArgumentError(`Use a whole number from ${min} to ${max}.`);
    return n;
  };
}

export function collect(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value];
}

/** "24h", "30d", "90m", "3600s" or a bare number of seconds, in seconds. */
export function duration(value: string): number {
  const m = /^(\d+)\s*([smhdw]?)$/i.exec(value.trim());
  if (!m)
    throw new InvalidArgumentError("Use a number with a unit: s, m, h, d or w (for example 24h or 30d).");
  const unit = { "": 1, s: 1, m: 60, h: 3600, d: 86_400, w: 604_800 }[m[2].toLowerCase() as "s"];
  const seconds = Number(m[1]) * unit;
  if (seconds <= 0) throw new InvalidArgumentError("It must be longer than zero.");
  if (seconds > 3650 * 86_400) throw new InvalidArgumentError("It must be at most 3650d (ten years).");
  return seconds;
}

export function path(prefix: string): (value: string) => string {
  return (value) => {
    if (!value.startsWith("/"))
      throw new InvalidArgumentError(`Use a path beginning with / (for example ${prefix}).`);
    return value;
  };
}
