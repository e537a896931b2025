// The one layout of every console page: the head (the console's own stylesheet, nothing from
// elsewhere), the nav (Health, Functions, Live, Logs, Audit) with the current page marked for screen
// readers, and a log-out button; and how a page is sent (the headers that keep it out of frames,
// caches and other origins' reach).
import type { ServerResponse } from "node:http";
import { html, type Html } from "./html.js";
import { ASSET_PATHS } from "./assets.js";

export type NavPage = "health" | "functions" | "live" | "logs" | "audit";

const NAV: ReadonlyArray<[NavPage, string]> = [
  ["health", "Health"],
  ["functions", "Functions"],
  ["live", "Live"],
  ["logs", "Logs"],
  ["audit", "Audit"],
];

export interface PageOptions {
  title: string;
  /** Which nav entry is current; none on the login page (which has no nav). */
  nav?: NavPage;
  /** Whether the nav and log-out button show (not on the login page). */
  signedIn: boolean;
  body: Html;
  /** Scripts of the console's own (/console/assets/...), run in this order. */
  scripts?: string[];
  /** Stylesheets besides the console's (/console/assets/...). */
  styles?: string[];
}

export function layout(o: PageOptions): string {
  const nav = o.signedIn
    ? html`<nav aria-label="Console">
        <ul>
          ${NAV.map(
            ([id, label]) =>
              html`<li>
                <a href="/console/${id}" ${o.nav === id ? html` aria-current="page"` : ""}>${label}</a>
              </li>`,
          )}
        </ul>
        <form method="post" action="/console/logout" class="logout">
          <button type="submit">Log out</button>
        </form>
      </nav>`
    : "";
  return html`<!doctype html>
    <html lang="en">
      <head>
        <meta charset="utf-8" />
        <meta name="viewport" content="width=device-width, initial-scale=1" />
        <title>${o.title} · callplane console</title>
        ${(o.styles ?? []).map((s) => html`<link rel="stylesheet" href="${s}" />`)}
        <link rel="stylesheet" href="${ASSET_PATHS.css}" />
        ${(o.scripts ?? []).map((s) => html`<script src="${s}" defer></script>`)}
      </head>
      <body>
        <header><a class="brand" href="/console/health">callplane console</a>${nav}</header>
        <main id="main">
          <h1>${o.title}</h1>
          ${o.body}
        </main>
      </body>
    </html> `.text;
}

/** Headers of every console page: no framing, no caching, nothing loaded from elsewhere. */
export const PAGE_HEADERS = {
  "content-type": "text/html; charset=utf-8",
  "cache-control": "no-store",
  "content-security-policy":
    "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  "x-frame-options": "DENY",
  "x-content-type-options": "nosniff",
  // same-origin, not no-referrer: under no-referrer Chromium sends `Origin: null` on the console's
  // own form posts, which the same-origin check must refuse (a sandboxed page sends null too)
  "referrer-policy": "same-origin",
} as const;

export function sendPage(
  res: ServerResponse,
  status: number,
  page: string,
  headers: Record<string, string | string[]> = {},
): void {
  res.writeHead(status, { ...PAGE_HEADERS, "content-length": Buffer.byteLength(page), ...headers });
  res.end(page);
}

export function redirect(
  res: ServerResponse,
  location: string,
  headers: Record<string, string | string[]> = {},
): void {
  res.writeHead(303, { location, "cache-control": "no-store", "content-length": 0, ...headers });
  res.end();
}
