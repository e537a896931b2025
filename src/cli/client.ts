// HTTP to callplane's services, with every failure turned into one CliError: a connection that
// cannot be made says which service at which URL and whether the stack is running; an answer with
// a problem+json body shows its title, detail and code; a refused admin token says where the token
// came from and how to get a fresh one.
import { CliError } from "./errors.js";
import type { Settings, Sourced, TokenInfo } from "./settings.js";

export interface Service {
  /** "the API", "the admin token issuer", "the invocation service" */
  label: string;
  /** Code prefix for connection failures: API_UNREACHABLE, ISSUER_UNREACHABLE, ... */
  code: string;
  url: Sourced;
}

const START_HINT = "is the stack running? start it with `npm start`";

function errnoCode(err: unknown): string | undefined {
  let e: unknown = err;
  for (let depth = 0; depth < 4 && e && typeof e === "object"; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") return code;
    const errors = (e as { errors?: unknown }).errors;
    if (Array.isArray(errors) && errors.length) e = errors[0];
    else e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

export function networkError(err: unknown, service: Service, timeoutMs?: number): CliError {
  const at = `${service.label} at ${service.url.value}`;
  const name = err instanceof Error ? err.name : "";
  const code = errnoCode(err);
  const fail = (why: string, hint?: string) =>
    new CliError(`cannot reach ${at} (${why})`, `${service.code}_UNREACHABLE`, {
      cause: err,
      extra: { reason: why },
      hint: hint ?? `check the URL (it comes from ${service.url.from})`,
    });
  // (the service took the connection but said nothing: the default hint, check the URL, fits)
  if (name === "TimeoutError") return fail(`no answer within ${Math.round((timeoutMs ?? 0) / 1000)} s`);
  switch (code) {
    case "ECONNREFUSED":
      return fail("connection refused", START_HINT);
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return fail(`host ${new URL(service.url.value).hostname} not found`);
    case "ECONNRESET":
    case "UND_ERR_SOCKET":
      return fail("the connection was closed", START_HINT);
    case "EHOSTUNREACH":
    case "ENETUNREACH":
      return fail("no route to the host");
    case "UND_ERR_CONNECT_TIMEOUT":
    case "ETIMEDOUT":
      return fail("the connection timed out");
    default: {
      if (err instanceof Error && (err.cause as Error | undefined)?.message === "bad port") {
        return fail(
          `fetch refuses to connect to port ${new URL(service.url.value).port}, a blocked port; use another one`,
        );
      }
      const detail =
        err instanceof Error ? ((err.cause as Error | undefined)?.message ?? err.message) : String(err);
      return fail(code ? `${code}: ${detail}` : detail);
    }
  }
}

/**
 * fetch() that turns a failed connection into a CliError naming the service. `timeoutMs` bounds the
 * whole exchange; `headersTimeoutMs` only the wait for the answer's head, so that a long stream
 * (server-sent events) may run on once it has begun.
 */
export async function send(
  service: Service,
  path: string,
  init: RequestInit & { timeoutMs?: number; headersTimeoutMs?: number },
): Promise<Response> {
  const { timeoutMs, headersTimeoutMs, ...rest } = init;
  const head = headersTimeoutMs ? new AbortController() : undefined;
  const timer = head
    ? setTimeout(() => head.abort(new DOMException("no answer in time", "TimeoutError")), headersTimeoutMs)
    : undefined;
  try {
    return await fetch(`${service.url.value}${path}`, {
      redirect: "manual",
      ...rest,
      ...(timeoutMs ? { signal: AbortSignal.timeout(timeoutMs) } : head ? { signal: head.signal } : {}),
    });
  } catch (err) {
    throw networkError(err, service, timeoutMs ?? headersTimeoutMs);
  } finally {
    clearTimeout(timer);
  }
}

interface ProblemBody {
  title?: unknown;
  detail?: unknown;
  code?: unknown;
  errors?: unknown;
}

/** Turns a non-2xx answer into a CliError; reads (and so releases) the body. */
export async function problemError(res: Response, service: Service): Promise<CliError> {
  const text = await res.text().catch(() => "");
  let p: ProblemBody | undefined;
  try {
    const parsed = text ? (JSON.parse(text) as unknown) : undefined;
    if (parsed && typeof parsed === "object" && !Array.isArray(parsed)) p = parsed;
  } catch {
    p = undefined;
  }
  const title = typeof p?.title === "string" ? p.title : undefined;
  const detail = typeof p?.detail === "string" ? p.detail : undefined;
  const code = typeof p?.code === "string" ? p.code : `HTTP_${res.status}`;
  let message: string;
  if (title && detail) message = `${title}: ${detail}`;
  else if (title ?? detail) message = (title ?? detail)!;
  else {
    const snippet = text.trim().replace(/\s+/g, " ").slice(0, 200);
    message = `${service.label} at ${service.url.value} answered HTTP ${res.status}${res.statusText ? ` ${res.statusText}` : ""}${snippet ? `: ${snippet}` : " with no body"}`;
  }
  return new CliError(message, code, {
    status: res.status,
    ...(Array.isArray(p?.errors) ? { extra: { errors: p.errors } } : {}),
  });
}

/** How to replace the admin token, which depends on where it came from. */
export function freshTokenAdvice(token: TokenInfo): string {
  return token.kind === "env"
    ? "set CALLPLANE_TOKEN to a fresh token (`callplane admin token` mints one offline) or unset it to use the one `callplane init` saves"
    : token.kind === "config"
      ? `replace \`token:\` in the CLI config file, or remove it and run \`callplane init\``
      : "run `callplane init` to get a new admin token";
}

function tokenHint(err: CliError, token: TokenInfo, api: string): string | undefined {
  if (err.status !== 401) return undefined;
  const fresh = freshTokenAdvice(token);
  if (err.code === "TOKEN_EXPIRED") return `the admin token from ${token.from} has expired; ${fresh}`;
  if (err.code === "TOKEN_ISSUER_DISABLED")
    return `the admin token from ${token.from} came from the admin token issuer, which is turned off; set CALLPLANE_TOKEN to a token from your identity provider, or mint one with \`callplane admin token --save\``;
  return `the API at ${api} refused the admin token from ${token.from}; ${fresh}`;
}

/** The control-plane API, called with the admin token. */
export class Api {
  readonly service: Service;
  private readonly token: TokenInfo;
  private readonly account: string | undefined;

  constructor(settings: Settings) {
    this.service = { label: "the API", code: "API", url: settings.apiUrl() };
    this.token = settings.requireToken();
    this.account = settings.account();
  }

  async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.token.value}` };
    // the header the API reads (ACCOUNT_HEADER in src/services/api/routes/access.ts)
    if (this.account !== undefined) headers["callplane-account"] = this.account;
    if (body !== undefined) headers["content-type"] = "application/json";
    const res = await send(this.service, path, {
      method,
      headers,
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
      timeoutMs: 30_000,
    });
    if (!res.ok) {
      const err = await problemError(res, this.service);
      throw err.withHint(tokenHint(err, this.token, this.service.url.value));
    }
    const text = await res.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }
}
