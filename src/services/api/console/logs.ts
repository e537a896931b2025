// The logs page: the recent log lines of every service that keeps them (the invocation and
// grpc-proxy replicas, and the callback proxy's access log), asked over NATS (callplane.console.logs,
// plane/console-logs.ts), filtered by request id and/or function id, merged by time, newest first.
// Live updates are server-sent events from one shared poll per filter (live-hub.ts): clients that
// watch the same filter share one poll, and at most LOG_STREAMS filters are watched at once.
import type { ServerResponse } from "node:http";
import { CallplaneError } from "../../../lib/errors.js";
import type { Logger } from "../../../lib/log.js";
import { RECENT_LOG_LINES } from "../../../lib/log-ring.js";
import type { ConsoleDeps } from "./context.js";
import { html, type Html } from "./html.js";
import { LiveHub } from "./live-hub.js";
import { REQUEST_ID } from "./live.js";
import type { LogsReply } from "./reports.js";

/** Rows shown at most, across every service (each is asked for this many). */
export const LOGS_LIMIT = 200;
/** Distinct filters watched live at once (each one a poll of every service per interval). */
export const LOG_STREAMS = 16;

export interface LogFilter {
  requestId?: string;
  functionId?: string;
}

/** The filter of the page's query; a value that is not an id is VALIDATION_FAILED naming its field. */
export function logFilter(query: URLSearchParams): LogFilter {
  const filter: LogFilter = {};
  const errors: Array<{ field: string; message: string }> = [];
  for (const field of ["requestId", "functionId"] as const) {
    const value = (query.get(field) ?? "").trim();
    if (value === "") continue;
    if (REQUEST_ID.test(value)) filter[field] = value.toLowerCase();
    else errors.push({ field, message: `"${value.slice(0, 64)}" is not a UUID` });
  }
  if (errors.length > 0)
    throw new CallplaneError(
      "VALIDATION_FAILED",
      `${errors.map((e) => `${e.field}: ${e.message}`).join("; ")}. A request id is the NVCF-REQID of an invocation, a function id the one callplane function list shows; leave a field empty to see every line`,
      { extra: { errors } },
    );
  return filter;
}

function filterQuery(f: LogFilter): string {
  const q = new URLSearchParams();
  if (f.requestId) q.set("requestId", f.requestId);
  if (f.functionId) q.set("functionId", f.functionId);
  const s = q.toString();
  return s ? `?${s}` : "";
}

interface Row {
  time: number;
  service: string;
  replica: string;
  level: string;
  msg: string;
  requestId: string | undefined;
  detail: string;
}

const LEVELS: Record<number, string> = {
  10: "trace",
  20: "debug",
  30: "info",
  40: "warn",
  50: "error",
  60: "fatal",
};
/** Fields every line has or that have a column of their own. */
const SHOWN = new Set(["time", "level", "service", "pid", "hostname", "msg", "requestId"]);
const DETAIL_CHARS = 300;

function detailOf(o: Record<string, unknown>): string {
  const parts: string[] = [];
  for (const [k, v] of Object.entries(o)) {
    // "-" is HAProxy's mark for a value its access-log line did not have
    if (SHOWN.has(k) || v === "" || v === "-" || v === undefined || v === null) continue;
    // an error's message, not its stack
    const value =
      k === "err" && typeof v === "object" && typeof (v as { message?: unknown }).message === "string"
        ? (v as { message: string }).message
        : typeof v === "string"
          ? v
          : JSON.stringify(v);
    parts.push(`${k}=${value}`);
  }
  const s = parts.join(" ");
  return s.length > DETAIL_CHARS ? `${s.slice(0, DETAIL_CHARS - 1)}…` : s;
}

function rowsOf(reply: LogsReply): Row[] {
  const rows: Row[] = [];
  for (const line of reply.lines) {
    let o: Record<string, unknown>;
    try {
      o = JSON.parse(line) as Record<string, unknown>;
    } catch {
      continue;
    }
    // pino writes ISO time and level labels; HAProxy's access log epoch milliseconds and numbers
    const time = typeof o.time === "number" ? o.time : Date.parse(String(o.time));
    rows.push({
      time: Number.isFinite(time) ? time : 0,
      service: reply.service,
      replica: reply.replica,
      level:
        typeof o.level === "number"
          ? (LEVELS[o.level] ?? String(o.level))
          : typeof o.level === "string"
            ? o.level
            : "",
      msg: typeof o.msg === "string" ? o.msg : "",
      // a link only for an id (the access log's "-" names no request)
      requestId: typeof o.requestId === "string" && REQUEST_ID.test(o.requestId) ? o.requestId : undefined,
      detail: detailOf(o),
    });
  }
  return rows;
}

function timeOf(ms: number): { short: string; iso: string } {
  if (ms === 0) return { short: "", iso: "" };
  const iso = new Date(ms).toISOString();
  return { short: iso.slice(11, 23), iso };
}

/** The table's body: rendered for the page and for every live update. */
export async function logRows(c: ConsoleDeps, f: LogFilter): Promise<Html> {
  const reports = c.reports();
  if (!reports)
    return html`<tr>
      <td colspan="7" class="muted">Log lines travel over NATS, which this API is not configured with.</td>
    </tr>`;
  const replies = await reports.logs({ ...f, limit: LOGS_LIMIT }, c.replicaWaitMs);
  const rows = replies
    .flatMap(rowsOf)
    .sort((a, b) => b.time - a.time)
    .slice(0, LOGS_LIMIT);
  const problems = replies.filter((r) => r.problem !== undefined);
  const notes = problems.map(
    (r) =>
      html`<tr class="problem">
        <td colspan="7" class="muted">${r.service} ${r.replica}: ${r.problem}</td>
      </tr>`,
  );
  if (rows.length === 0)
    return html`${notes}
      <tr>
        <td colspan="7" class="muted" id="logs-empty">
          No line matches among the recent lines of the ${replies.length} services that answered.
        </td>
      </tr>`;
  return html`${notes}${rows.map((r) => {
    const t = timeOf(r.time);
    return html`<tr data-level="${r.level}" data-service="${r.service}">
      <td><time datetime="${t.iso}" title="${t.iso}">${t.short}</time></td>
      <td>${r.service}</td>
      <td><span class="id">${r.replica}</span></td>
      <td class="level">${r.level}</td>
      <td>${r.msg}</td>
      <td>
        ${r.requestId ? html`<a class="id" href="/console/requests/${r.requestId}">${r.requestId}</a>` : ""}
      </td>
      <td><code>${r.detail}</code></td>
    </tr>`;
  })}`;
}

export async function logsBody(c: ConsoleDeps, f: LogFilter): Promise<Html> {
  return html`<form id="log-filter" method="get" action="/console/logs" class="filter" role="search">
      <label for="log-request-id"
        >Request id<input
          id="log-request-id"
          name="requestId"
          type="search"
          value="${f.requestId ?? ""}"
          size="38"
      /></label>
      <label for="log-function-id"
        >Function id<input
          id="log-function-id"
          name="functionId"
          type="search"
          value="${f.functionId ?? ""}"
          size="38"
      /></label>
      <button type="submit">Filter</button>
      ${f.requestId || f.functionId ? html`<a href="/console/logs">Clear</a>` : ""}
      <button id="logs-pause" type="button" aria-pressed="false" aria-controls="logs">Pause</button>
    </form>
    <p class="muted" aria-live="polite">
      <span id="logs-status">as of page load</span>: the newest ${LOGS_LIMIT} lines of the invocation and
      grpc-proxy replicas and the callback proxy's access log, newest first. Each replica keeps its last
      ${RECENT_LOG_LINES.toLocaleString("en-US")} lines at its log level, the callback proxy its last 1 MB of
      callbacks; a filter finds the lines that name the request or the function (a request that went well
      leaves no replica line at level info; its callbacks through the proxy name the request, not the
      function).
    </p>
    <div class="table-wrap">
      <table id="logs" data-events="/console/logs/events${filterQuery(f)}">
        <thead>
          <tr>
            <th scope="col">Time (UTC)</th>
            <th scope="col">Service</th>
            <th scope="col">Replica</th>
            <th scope="col">Level</th>
            <th scope="col">Message</th>
            <th scope="col">Request id</th>
            <th scope="col">Details</th>
          </tr>
        </thead>
        <tbody>
          ${await logRows(c, f)}
        </tbody>
      </table>
    </div>`;
}

/** One shared poll per filter being watched, at most LOG_STREAMS of them. */
export class LogStreams {
  private readonly hubs = new Map<string, LiveHub>();
  private closed = false;

  constructor(
    private readonly c: ConsoleDeps,
    private readonly opts: { intervalMs: number; logger: Logger },
  ) {}

  /** Filters with a hub now (tests read it). */
  get size(): number {
    return this.hubs.size;
  }

  add(res: ServerResponse, f: LogFilter): void {
    if (this.closed) throw new CallplaneError("SHUTTING_DOWN", "the API is stopping; the page reconnects");
    // a hub whose clients all left has stopped polling; it is dropped here
    for (const [key, hub] of this.hubs) if (hub.listeners === 0) this.hubs.delete(key);
    const key = filterQuery(f);
    let hub = this.hubs.get(key);
    if (!hub) {
      if (this.hubs.size >= LOG_STREAMS)
        throw new CallplaneError(
          "UNAVAILABLE",
          `${LOG_STREAMS} different log filters are being watched live already; the page still shows the lines as of its load. Reload later, or watch one of the filters already open`,
        );
      hub = new LiveHub({
        render: async () => (await logRows(this.c, f)).text,
        event: "logs",
        intervalMs: this.opts.intervalMs,
        logger: this.opts.logger,
      });
      this.hubs.set(key, hub);
    }
    hub.add(res);
  }

  close(): void {
    this.closed = true;
    for (const hub of this.hubs.values()) hub.close();
    this.hubs.clear();
  }
}
