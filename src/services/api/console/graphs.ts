// The graphs on a function's page: its last hour, minute by minute (requests, the error ratio, p50
// and p99 latency), from the invocation replicas' own minute cells (plane/recent-window.ts). The
// page asks only that function's hour, once, when it is loaded (ReplicaReports.snapshot with
// `hour`); the replicas' minutes are added up here, per minute, versions and replicas together, and
// the quantiles are read from the added duration buckets, so they are the plane's, not the largest
// any replica saw. The points go into the page as JSON that the console's own script (graphs.js)
// draws with uPlot; the page says the same in words for a reader without the graphs.
import { quantileOfBuckets, HOUR_MINUTES } from "../../../plane/recent-window.js";
import type { ConsoleDeps } from "./context.js";
import { html, raw, type Html } from "./html.js";
import type { VersionHour } from "./reports.js";

/** A function's hour on the plane: point i is the minute starting at `start + i * 60 s` (ms). */
export interface HourPoints {
  start: number;
  requests: number[];
  errors: number[];
  /** errors / requests; null in a minute with no request (a gap, not a zero). */
  errorRatio: Array<number | null>;
  p50Ms: Array<number | null>;
  p99Ms: Array<number | null>;
}

const MINUTE_MS = 60_000;

/** Adds up the replicas' versions' minutes, aligned on this API's clock. */
export function mergeHours(hours: VersionHour[], now = Date.now()): HourPoints {
  const first = Math.floor(now / MINUTE_MS) - HOUR_MINUTES + 1;
  const requests = new Array<number>(HOUR_MINUTES).fill(0);
  const errors = new Array<number>(HOUR_MINUTES).fill(0);
  const buckets = Array.from({ length: HOUR_MINUTES }, () => new Map<number, number>());
  for (const h of hours) {
    if (!Number.isFinite(h.start) || !Array.isArray(h.requests)) continue;
    const offset = Math.round(h.start / MINUTE_MS) - first;
    for (let i = 0; i < h.requests.length; i++) {
      const at = offset + i;
      if (at < 0 || at >= HOUR_MINUTES) continue;
      requests[at] += Number(h.requests[i]) || 0;
      errors[at] += Number(h.errors?.[i]) || 0;
      for (const [b, n] of h.latency?.[i] ?? []) buckets[at].set(b, (buckets[at].get(b) ?? 0) + n);
    }
  }
  return {
    start: first * MINUTE_MS,
    requests,
    errors,
    errorRatio: requests.map((n, i) => (n > 0 ? errors[i] / n : null)),
    p50Ms: buckets.map((b) => quantileOfBuckets(b, 0.5) ?? null),
    p99Ms: buckets.map((b) => quantileOfBuckets(b, 0.99) ?? null),
  };
}

/** The function's hour, or undefined when no replica could be asked (NATS off, or it failed). */
export async function functionHour(c: ConsoleDeps, functionId: string): Promise<HourPoints | undefined> {
  const reports = c.reports();
  if (!reports) return undefined;
  try {
    const snap = await reports.snapshot({ limit: 0, functionId, hour: true, waitMs: c.replicaWaitMs });
    return mergeHours(snap.flatMap((r) => r.hour ?? []));
  } catch {
    return undefined;
  }
}

const GRAPHS: ReadonlyArray<[id: string, caption: string]> = [
  ["graph-rate", "Requests per minute"],
  ["graph-errors", "Error ratio"],
  ["graph-latency", "Latency p50 and p99 (ms)"],
];

export function graphsBody(h: HourPoints | undefined): Html {
  if (!h)
    return html`<h2 id="graphs-heading">Last hour</h2>
      <p class="muted" id="graphs-summary">
        No graphs: the invocation replicas could not be asked (their reports travel over NATS).
      </p>`;
  const total = h.requests.reduce((a, b) => a + b, 0);
  const errors = h.errors.reduce((a, b) => a + b, 0);
  const worst = Math.max(0, ...h.p99Ms.map((v) => v ?? 0));
  // JSON of numbers and nulls only; `<` is escaped anyway, so the element cannot be closed early
  const data = JSON.stringify(h).replace(/</g, "\\u003c");
  return html`<h2 id="graphs-heading">Last hour</h2>
    <p class="muted" id="graphs-summary" data-requests="${total}">
      ${
        total === 0
          ? "No request of this function ended in the last hour on the invocation replicas that answered."
          : `${total} requests ended in the last hour, ${errors} of them errors (${((100 * errors) / total).toFixed(1)}%); the worst minute's p99 was ${worst} ms.`
      }
      Per minute, summed over the replicas that answered and every version; latency from the client's request
      to the end of its answer (quantiles at most a fifth above the true ones).
    </p>
    <div class="graphs" aria-labelledby="graphs-heading">
      ${GRAPHS.map(
        ([id, caption]) =>
          html`<figure class="graph">
            <figcaption>${caption}</figcaption>
            <div id="${id}" class="graph-plot"></div>
          </figure>`,
      )}
    </div>
    <script type="application/json" id="hour-data">
      ${raw(data)}
    </script>`;
}
