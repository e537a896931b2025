// HTTP clients for tests: call (fetch returning status, headers and the parsed JSON body), what an
// invocation client sends and how it reads what comes back (problem bodies, polling for a condition
// with a deadline instead of sleeping).
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";

/** A callplane request id: a UUID, version 8 (RFC 9562), RFC variant. */
export const REQUEST_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

export interface ProblemBody {
  type: string;
  title: string;
  status: number;
  detail: string;
  code?: string;
  [extra: string]: unknown;
}

/** Reads a response that must be RFC 7807 problem+json with the given status. */
export async function problemOf(res: Response, status: number): Promise<ProblemBody> {
  const text = await res.text();
  assert.equal(res.status, status, text);
  assert.match(res.headers.get("content-type") ?? "", /^application\/problem\+json/, text);
  const body = JSON.parse(text) as ProblemBody;
  assert.equal(body.status, status, text);
  assert.equal(typeof body.type, "string");
  assert.equal(typeof body.detail, "string");
  return body;
}

/** Polls `check` until it returns something other than undefined or false, or fails after `timeoutMs`. */
export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined | false> | T | undefined | false,
  opts:
    | number
    | {
        timeoutMs?: number;
        intervalMs?: number;
        /** What else to say when it times out (the processes' output, say). */
        onTimeout?: () => string | Promise<string>;
      } = {},
): Promise<T> {
  const { timeoutMs = 5000, intervalMs = 50 } = typeof opts === "number" ? { timeoutMs: opts } : opts;
  const onTimeout = typeof opts === "number" ? undefined : opts.onTimeout;
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined && v !== false) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      const more = onTimeout ? `\n${await onTimeout()}` : "";
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${more}`, { cause: last });
    }
    await sleep(intervalMs);
  }
}

export function bearer(key: string, extra: Record<string, string> = {}): Record<string, string> {
  return { authorization: `Bearer ${key}`, ...extra };
}

export interface JsonResponse<T = unknown> {
  status: number;
  headers: Headers;
  body: T;
  text: string;
}

/** fetch() that returns status, headers and the parsed JSON body (or undefined). */
export async function call<T = Record<string, unknown>>(
  url: string,
  init: {
    method?: string;
    token?: string;
    body?: unknown;
    rawBody?: string | Buffer;
    headers?: Record<string, string>;
  } = {},
): Promise<JsonResponse<T>> {
  const headers: Record<string, string> = { ...init.headers };
  if (init.token) headers.authorization = `Bearer ${init.token}`;
  let body: string | Buffer | undefined;
  if (init.body !== undefined) {
    body = JSON.stringify(init.body);
    headers["content-type"] ??= "application/json";
  } else if (init.rawBody !== undefined) {
    body = init.rawBody;
  }
  const res = await fetch(url, {
    method: init.method ?? (body !== undefined ? "POST" : "GET"),
    headers,
    body,
  });
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  return { status: res.status, headers: res.headers, body: parsed as T, text };
}
