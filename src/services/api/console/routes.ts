// The operator console: server-rendered pages under /console on the API (which already verifies
// admin tokens, owns the database and holds a NATS connection). One call wires it:
// addConsoleRoutes(router, deps). Every page and action needs a plane-wide admin token (auth.ts);
// every POST is same-origin only. A page that fails answers an HTML page with the error's code,
// never problem+json: a browser is reading.
import type { IncomingMessage, ServerResponse } from "node:http";
import { CallplaneError, toCallplaneError } from "../../../lib/errors.js";
import type { RequestContext, Router } from "../../../lib/http/index.js";
import type { ApiDeps } from "../routes/deps.js";
import { applyAction, confirmBody, isAction, plan, readForm } from "./actions.js";
import { ASSETS, ASSET_PATHS } from "./assets.js";
import { auditBody, pruneAudit } from "./audit.js";
import {
  adminOfToken,
  clearedCookie,
  consoleAdmin,
  LoginRequired,
  overTls,
  requireSameOrigin,
  sessionCookie,
  tokenOf,
  type ConsoleAdmin,
} from "./auth.js";
import { pageNumber, type ConsoleDeps, type TraceSource } from "./context.js";
import { functionBody, functionsBody } from "./functions.js";
import { certificateRows, certificatesBody } from "./certificates.js";
import { healthBody, healthRows } from "./health.js";
import { html, type Html } from "./html.js";
import { layout, redirect, sendPage, type NavPage } from "./layout.js";
import { LiveHub } from "./live-hub.js";
import { checkRequestId, inflightRows, liveBody, requestBody } from "./live.js";
import { logFilter, logsBody, LogStreams } from "./logs.js";
import { ProbeCache } from "./probe-cache.js";
import type { ReportsSource } from "./reports.js";

export interface ConsoleOptions {
  /** Where the replicas' reports come from; deps.trust.replicaReports() unless given (tests). */
  reports?: ReportsSource;
  /** The live page's poll interval (1 s). */
  liveIntervalMs?: number;
  /** How long a page waits for replicas to answer (300 ms). */
  replicaWaitMs?: number;
  /** Certificate files whose expiry the health page shows (a missing file is left out). */
  certificateFiles?: ReadonlyArray<{ name: string; file: string }>;
  /** The callback proxy's /health, or why it cannot be asked; undefined: the proxy is off (no row). */
  callbackProxy?: { url: string } | { why: string } | undefined;
  /** How long the health page keeps what it asked other parts (5 s; tests 0). */
  probeCacheMs?: number;
  /** Where the request page reads a request's spans (tracing's span file or query API); undefined: off. */
  traces?: TraceSource;
  /** How long one probe of another part may take (250 ms). */
  probeTimeoutMs?: number;
}

export interface ConsoleRoutes {
  /** The live stream's hub (tests read how often it polled). */
  readonly live: LiveHub;
  /** Prunes the audit log to its bounds once (the API's listen(); each action prunes after it too). */
  start(): Promise<void>;
  /** The logs page's live streams, one hub per filter watched. */
  readonly logs: LogStreams;
  /** Ends every live stream: call before the HTTP service drains, or they would hold it open. */
  close(): void;
}

/** Codes that mean "the token is no good": the login page answers them. */
const LOGIN_CODES = new Set([
  "UNAUTHENTICATED",
  "TOKEN_INVALID",
  "TOKEN_EXPIRED",
  "TOKEN_REVOKED",
  "TOKEN_ISSUER_DISABLED",
]);

function loginBody(error?: CallplaneError): Html {
  return html`${error ? html`<p class="error" id="error" role="alert" data-code="${error.code}"><strong>${error.code}</strong>: ${error.message}</p>` : ""}
    <form id="login" method="post" action="/console/login" class="login">
      <label for="token"
        >Admin token<input id="token" name="token" type="password" autocomplete="off" required
      /></label>
      <button id="login-submit" type="submit">Log in</button>
    </form>
    <h2>Where to get an admin token</h2>
    <ul>
      <li>
        On the machine that runs the stack, <code>bin/callplane admin token</code> prints one (minted from the
        stack's admin signing key); <code>bin/callplane init</code> gets one from the admin token issuer and
        saves it in the CLI's state file.
      </li>
      <li>
        With the admin token issuer on: <code>POST &lt;issuer&gt;/v1/admin/keys</code> with the operator
        credential.
      </li>
      <li>Or your identity provider, if the plane trusts it.</li>
    </ul>
    <p class="muted">
      The console needs a plane-wide admin token; an API key or an account's admin token is refused. The token
      is kept in an HttpOnly cookie for this console only, until it expires or you log out.
    </p>`;
}

function errorBody(e: CallplaneError): Html {
  return html`<p class="error" id="error" role="alert" data-code="${e.code}">
      <strong>${e.code}</strong>: ${e.message}
    </p>
    <p><a href="/console/health">Back to the console</a></p>`;
}

export function addConsoleRoutes(router: Router, deps: ApiDeps, opts: ConsoleOptions = {}): ConsoleRoutes {
  const c: ConsoleDeps = {
    api: deps,
    reports: opts.reports ?? (() => deps.trust.replicaReports()),
    startedAt: new Date(),
    replicaWaitMs: opts.replicaWaitMs ?? 300,
    certificateFiles: opts.certificateFiles ?? [],
    callbackProxy: opts.callbackProxy,
    probes: new ProbeCache(opts.probeCacheMs ?? 5000),
    probeTimeoutMs: opts.probeTimeoutMs ?? 250,
    traces: opts.traces,
  };
  const live = new LiveHub({
    render: async () => (await inflightRows(c)).text,
    event: "inflight",
    intervalMs: opts.liveIntervalMs ?? 1000,
    logger: deps.logger,
  });
  const logs = new LogStreams(c, { intervalMs: opts.liveIntervalMs ?? 1000, logger: deps.logger });

  const fail = (req: IncomingMessage, res: ServerResponse, err: unknown): void => {
    if (res.headersSent || res.destroyed) {
      res.destroy();
      return;
    }
    if (err instanceof LoginRequired) {
      redirect(res, "/console/login");
      return;
    }
    const e = toCallplaneError(err);
    if (e.code === "INTERNAL") deps.logger.error({ err: e.cause ?? e }, "console page failed");
    else deps.logger.debug({ code: e.code, detail: e.message }, "console request refused");
    if (LOGIN_CODES.has(e.code)) {
      // a cookie that no longer works is dropped, so the next visit is a plain login
      const clear: Record<string, string> =
        req.headers.authorization === undefined && tokenOf(req)?.from === "cookie"
          ? { "set-cookie": clearedCookie(overTls(req)) }
          : {};
      sendPage(res, e.status, layout({ title: "Log in", signedIn: false, body: loginBody(e) }), clear);
      return;
    }
    sendPage(res, e.status, layout({ title: ERROR_TITLE, signedIn: true, body: errorBody(e) }));
  };

  /** A page that needs an admin: renders `body` in the layout. */
  const page =
    (
      nav: NavPage | undefined,
      fn: (
        ctx: RequestContext,
        admin: ConsoleAdmin,
      ) => Promise<{ title: string; body: Html; scripts?: string[]; styles?: string[] }>,
    ) =>
    async (ctx: RequestContext): Promise<void> => {
      try {
        const admin = await consoleAdmin(deps.auth, ctx.req);
        const p = await fn(ctx, admin);
        sendPage(ctx.res, 200, layout({ ...p, ...(nav ? { nav } : {}), signedIn: true }));
      } catch (err) {
        fail(ctx.req, ctx.res, err);
      }
    };

  const toHealth = ({ res }: RequestContext) => redirect(res, "/console/health");
  router.add("GET", "/console", toHealth);
  router.add("GET", "/console/", toHealth);

  router.add("GET", "/console/login", ({ res }) => {
    sendPage(res, 200, layout({ title: "Log in", signedIn: false, body: loginBody() }));
  });
  router.add("POST", "/console/login", async ({ req, res }) => {
    try {
      requireSameOrigin(req);
      const form = await readForm(req);
      const token = form.get("token")?.trim();
      if (!token) throw new CallplaneError("UNAUTHENTICATED", "paste an admin token into the form");
      const admin = await adminOfToken(deps.auth, token);
      const life = (admin.expiresAt.getTime() - Date.now()) / 1000;
      deps.logger.info({ subject: admin.subject, tokenId: admin.tokenId }, "console login");
      redirect(res, "/console/health", { "set-cookie": sessionCookie(token, overTls(req), life) });
    } catch (err) {
      // a refused login shows the form again with the reason, whatever the code
      if (err instanceof CallplaneError && !res.headersSent)
        sendPage(res, err.status, layout({ title: "Log in", signedIn: false, body: loginBody(err) }));
      else fail(req, res, err);
    }
  });
  router.add("POST", "/console/logout", ({ req, res }) => {
    try {
      requireSameOrigin(req);
      req.resume();
      redirect(res, "/console/login", { "set-cookie": clearedCookie(overTls(req)) });
    } catch (err) {
      fail(req, res, err);
    }
  });

  router.add(
    "GET",
    "/console/health",
    page("health", async ({ req }) => {
      const [rows, certs] = await Promise.all([healthRows(c, req.headers.host ?? ""), certificateRows(c)]);
      return { title: "Health", body: html`${healthBody(rows)}${certificatesBody(certs)}` };
    }),
  );
  router.add(
    "GET",
    "/console/functions",
    page("functions", async ({ query }) => ({
      title: "Functions",
      body: await functionsBody(c, query.get("q") ?? "", pageNumber(query.get("page"))),
    })),
  );
  router.add(
    "GET",
    "/console/functions/:id",
    page("functions", async ({ params }) => functionBody(c, params.id)),
  );
  router.add(
    "GET",
    "/console/audit",
    page("audit", async ({ query }) => ({
      title: "Audit",
      body: await auditBody(c, pageNumber(query.get("page"))),
    })),
  );
  router.add(
    "GET",
    "/console/live",
    page("live", async () => ({ title: "Live", body: await liveBody(c), scripts: [ASSET_PATHS.liveJs] })),
  );
  router.add("GET", "/console/live/events", async ({ req, res }) => {
    try {
      await consoleAdmin(deps.auth, req);
      if (live.isClosed)
        throw new CallplaneError("SHUTTING_DOWN", "the API is stopping; the page reconnects");
      live.add(res);
    } catch (err) {
      fail(req, res, err);
    }
  });
  router.add(
    "GET",
    "/console/logs",
    page("logs", async ({ query }) => ({
      title: "Logs",
      body: await logsBody(c, logFilter(query)),
      scripts: [ASSET_PATHS.logsJs],
    })),
  );
  router.add("GET", "/console/logs/events", async ({ req, res, query }) => {
    try {
      await consoleAdmin(deps.auth, req);
      logs.add(res, logFilter(query));
    } catch (err) {
      fail(req, res, err);
    }
  });
  router.add("GET", "/console/requests", async ({ req, res, query }) => {
    try {
      await consoleAdmin(deps.auth, req);
      redirect(res, `/console/requests/${checkRequestId((query.get("id") ?? "").trim())}`);
    } catch (err) {
      fail(req, res, err);
    }
  });
  router.add(
    "GET",
    "/console/requests/:id",
    page("live", async ({ params }) => ({
      title: "Request",
      body: await requestBody(c, checkRequestId(params.id)),
    })),
  );

  router.add("POST", "/console/actions/:action", async ({ req, res, params }) => {
    try {
      requireSameOrigin(req);
      const admin = await consoleAdmin(deps.auth, req);
      const action = params.action;
      if (!isAction(action))
        throw new CallplaneError(
          "NOT_FOUND",
          `no console action ${JSON.stringify(action.slice(0, 40))}; there are deploy, scale, undeploy and revoke-identity`,
        );
      const form = await readForm(req);
      const p = await plan(c, action, form, admin);
      if (form.get("confirmed") !== "1") {
        sendPage(
          res,
          200,
          layout({ title: "Confirm", nav: "functions", signedIn: true, body: confirmBody(action, p) }),
        );
        return;
      }
      redirect(res, await applyAction(c, action, p, admin));
    } catch (err) {
      fail(req, res, err);
    }
  });

  router.add("GET", "/console/assets/:name", ({ req, res, params }) => {
    const a = Object.hasOwn(ASSETS, params.name) ? ASSETS[params.name] : undefined;
    if (!a) {
      fail(req, res, new CallplaneError("NOT_FOUND", `no console asset ${params.name.slice(0, 64)}`));
      return;
    }
    const headers = {
      "content-type": a.contentType,
      "cache-control": "public, max-age=300",
      etag: a.etag,
      "x-content-type-options": "nosniff",
    };
    if (req.headers["if-none-match"] === a.etag) {
      res.writeHead(304, headers).end();
      return;
    }
    res.writeHead(200, { ...headers, "content-length": Buffer.byteLength(a.body) });
    res.end(a.body);
  });

  return {
    live,
    logs,
    start: () => pruneAudit(deps).then(() => undefined),
    close: () => {
      live.close();
      logs.close();
    },
  };
}

const ERROR_TITLE = "Refused";
