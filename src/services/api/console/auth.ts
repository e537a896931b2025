// Who may use the console: a plane-wide admin token (the check of the API's admin routes), sent as
// `Authorization: Bearer` (scripts) or in the cookie that POST /console/login sets (browsers). And
// the rule for every console POST: same origin only (the Origin header, when a browser sends one,
// must name the host the request was sent to), on top of the cookie's SameSite=Strict.
import type { IncomingMessage } from "node:http";
import type { TLSSocket } from "node:tls";
import { CallplaneError } from "../../../lib/errors.js";
import { bearerToken } from "../../../lib/http/index.js";
import { PLANE_WIDE, type Principal } from "../../../lib/identity/index.js";
import type { ApiAuth } from "../routes/auth.js";

export const COOKIE = "callplane_console";

export type ConsoleAdmin = Principal & { kind: "admin" };

/** No token at all: a page answers with a redirect to the login page, not an error. */
export class LoginRequired extends Error {
  constructor() {
    super("log in to the console");
    this.name = "LoginRequired";
  }
}

/** The token the request carries, and where: the Authorization header wins over the cookie. */
export function tokenOf(req: IncomingMessage): { token: string; from: "bearer" | "cookie" } | undefined {
  if (req.headers.authorization !== undefined) return { token: bearerToken(req), from: "bearer" };
  const cookie = readCookie(req, COOKIE);
  return cookie ? { token: cookie, from: "cookie" } : undefined;
}

export function readCookie(req: IncomingMessage, name: string): string | undefined {
  const header = req.headers.cookie;
  if (!header) return undefined;
  for (const pair of header.split(";")) {
    const eq = pair.indexOf("=");
    if (eq !== -1 && pair.slice(0, eq).trim() === name) return pair.slice(eq + 1).trim() || undefined;
  }
  return undefined;
}

/** The admin a token belongs to, or CONSOLE_ADMIN_REQUIRED (an API key, a service, an account's token). */
export async function adminOfToken(auth: ApiAuth, token: string): Promise<ConsoleAdmin> {
  const p = await auth.authenticateToken(token);
  const how =
    "the console shows the whole plane, so it needs a plane-wide admin token: `bin/callplane admin token` prints one (from the stack's admin signing key), `bin/callplane init` saves one from the admin token issuer, or ask the admin token issuer (POST <issuer>/v1/admin/keys) or your identity provider";
  if (p.kind !== "admin")
    throw new CallplaneError(
      "CONSOLE_ADMIN_REQUIRED",
      `this is ${p.kind === "apikey" ? "an API key" : "a token of callplane's own service " + p.subject}, not an admin token; ${how}`,
    );
  if (p.account !== PLANE_WIDE)
    throw new CallplaneError(
      "CONSOLE_ADMIN_REQUIRED",
      `this admin token is for account ${p.account} only; ${how}`,
    );
  return p;
}

/** The admin making this request; LoginRequired when it carries no token. */
export async function consoleAdmin(auth: ApiAuth, req: IncomingMessage): Promise<ConsoleAdmin> {
  const t = tokenOf(req);
  if (!t) throw new LoginRequired();
  return adminOfToken(auth, t.token);
}

/** Who did it, in words (a revoke's reason): the token's subject, else its id. */
export const actorOf = (p: ConsoleAdmin): string => p.subject || `token ${p.tokenId}`;

/** Whether the request arrived over TLS (the cookie is then Secure). */
export const overTls = (req: IncomingMessage): boolean => (req.socket as TLSSocket).encrypted === true;

/** Refuses a POST whose Origin is another site's (or `null`, as sandboxed pages send). */
export function requireSameOrigin(req: IncomingMessage): void {
  const origin = req.headers.origin;
  if (origin === undefined) return;
  const host = req.headers.host?.toLowerCase();
  let originHost: string | undefined;
  try {
    originHost = new URL(origin).host.toLowerCase();
  } catch {
    originHost = undefined;
  }
  // URL drops a scheme's default port; so must the Host header for the two to compare
  const bare = host?.replace(/:(80|443)$/, "");
  if (originHost === undefined || (originHost !== host && originHost !== bare))
    throw new CallplaneError(
      "CONSOLE_CROSS_ORIGIN",
      `this form was sent from ${JSON.stringify(origin.slice(0, 100))}, not from the console at ${host ?? "(no host)"}; nothing was changed. Use the console's own pages`,
    );
}

export function sessionCookie(token: string, secure: boolean, maxAgeSeconds: number): string {
  return `${COOKIE}=${token}; Path=/console; HttpOnly; SameSite=Strict; Max-Age=${Math.max(0, Math.floor(maxAgeSeconds))}${secure ? "; Secure" : ""}`;
}

export function clearedCookie(secure: boolean): string {
  return `${COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0${secure ? "; Secure" : ""}`;
}
