// Errors the CLI reports. Every failure ends as one line `callplane: <what> (<CODE>)`, plus a hint
// line when there is something the user can do; codes are the API's own (FUNCTION_NOT_FOUND, ...)
// when the API answered, and CLI codes (USAGE, NO_TOKEN, API_UNREACHABLE, ...) otherwise.

export class CliError extends Error {
  readonly code: string;
  readonly hint: string | undefined;
  /** 1 for errors, 2 for usage errors (a bad flag value, a missing choice). */
  readonly exitCode: 1 | 2;
  /** HTTP status when a service answered. */
  readonly status: number | undefined;
  readonly extra: Record<string, unknown> | undefined;

  constructor(
    message: string,
    code: string,
    opts: {
      hint?: string;
      exitCode?: 1 | 2;
      status?: number;
      cause?: unknown;
      extra?: Record<string, unknown>;
    } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "CliError";
    this.code = code;
    this.hint = opts.hint;
    this.exitCode = opts.exitCode ?? 1;
    this.status = opts.status;
    this.extra = opts.extra;
  }

  withHint(hint: string | undefined): CliError {
    if (hint === undefined) return this;
    return new CliError(this.message, this.code, {
      hint,
      exitCode: this.exitCode,
      ...(this.status !== undefined ? { status: this.status } : {}),
      cause: this.cause,
      ...(this.extra ? { extra: this.extra } : {}),
    });
  }
}

export function usageError(message: string, hint?: string): CliError {
  return new CliError(message, "USAGE", { exitCode: 2, ...(hint ? { hint } : {}) });
}
