// A request's trace on the console's request page, when tracing is on: the spans of every trace
// that holds a span of the request (a status poll is a trace of its own), from the span file the
// services write (`observability.tracing.file`, as `npm start` sets it), searched for the request
// without parsing the rest, or from a Tempo-compatible query API (`observability.tracing.queryUrl`).
// The same reading `callplane trace` does; the page shows each span's offset, duration, service,
// name (indented by depth) and status.
import { TraceQueryError, queryRequestSpans } from "../../../lib/tracing/query.js";
import { requestSpansInFile } from "../../../lib/tracing/span-file.js";
import { formatDuration, tracesOfRequest, type TraceView } from "../../../lib/tracing/timeline.js";
import type { ConsoleDeps, TraceSource } from "./context.js";
import { html, type Html } from "./html.js";

export type { TraceSource };

/** How long the page waits for a trace query API. */
const QUERY_TIMEOUT_MS = 2000;

/** Indentation steps the stylesheet has (assets.ts .depth-N); deeper spans share the last. */
const MAX_DEPTH_SHOWN = 8;

/** Spans shown at most per trace (a long stream's trace has a span per tunnel, not per message). */
const SPANS_SHOWN = 200;

export async function traceSection(c: ConsoleDeps, requestId: string): Promise<Html> {
  const src = c.traces;
  if (!src)
    return html`<h2 id="trace-heading">Trace</h2>
      <p class="muted" id="trace-off">
        Tracing is off for this plane, or its spans go to a backend the console cannot query (<code
          >observability.tracing.file</code
        >
        or <code>.queryUrl</code>).
      </p>`;
  let views: TraceView[];
  try {
    const spans =
      "file" in src
        ? requestSpansInFile(src.file, requestId)
        : await queryRequestSpans(src.queryUrl, requestId, QUERY_TIMEOUT_MS);
    views = tracesOfRequest(spans, requestId);
  } catch (err) {
    const why = err instanceof TraceQueryError ? err.message : (err as Error).message;
    return html`<h2 id="trace-heading">Trace</h2>
      <p class="error" id="trace-error">The spans could not be read: ${why}</p>`;
  }
  if (views.length === 0)
    return html`<h2 id="trace-heading">Trace</h2>
      <p class="muted" id="trace-none">
        No span names this request: it was not sampled (with <code>npm start</code>, a request without a
        sampled <code>traceparent</code> is recorded one time in a hundred), or its spans are not written yet
        (about a second after they end).
      </p>`;
  return html`<h2 id="trace-heading">Trace</h2>
    ${views.map((v) => traceTable(v))}`;
}

function traceTable(v: TraceView): Html {
  const shown = v.spans.slice(0, SPANS_SHOWN);
  return html`<div class="table-wrap">
    <table class="trace" data-trace-id="${v.traceId}">
      <caption>
        trace
        <span class="id">${v.traceId}</span
        >,
        ${formatDuration(v.end - v.start)}${
          v.spans.length > shown.length ? html`, the first ${shown.length} of ${v.spans.length} spans` : ""
        }
      </caption>
      <thead>
        <tr>
          <th scope="col">Offset</th>
          <th scope="col">Duration</th>
          <th scope="col">Service</th>
          <th scope="col">Span</th>
          <th scope="col">Status</th>
        </tr>
      </thead>
      <tbody>
        ${shown.map(
          (s) =>
            html`<tr data-span="${s.name}" data-service="${s.service}" data-status="${s.status}">
              <td class="num">${formatDuration(s.start - v.start)}</td>
              <td class="num">${formatDuration(s.end - s.start)}</td>
              <td>${s.service}</td>
              <td class="depth-${String(Math.min(s.depth, MAX_DEPTH_SHOWN))}">${s.name}</td>
              <td>${s.status}${s.statusMessage ? html`: ${s.statusMessage}` : ""}</td>
            </tr>`,
        )}
      </tbody>
    </table>
  </div>`;
}
