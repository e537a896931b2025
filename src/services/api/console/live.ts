// The live page (the requests the invocation replicas hold now, refreshed by server-sent events
// from one shared poll: live-hub.ts) and the request lookup (asks the replica a request id names).
import { CallplaneError } from "../../../lib/errors.js";
import { formatAge, type ConsoleDeps } from "./context.js";
import { html, type Html } from "./html.js";
import { traceSection } from "./request-trace.js";
import type { WorkerSeen } from "../../../plane/console-wire.js";

/** Rows shown at most (the oldest first, as the replicas report them). */
export const LIVE_LIMIT = 200;

/** The live table's body: rendered for the page and for every event. */
export async function inflightRows(c: ConsoleDeps): Promise<Html> {
  const reports = c.reports();
  if (!reports)
    return html`<tr>
      <td colspan="7" class="muted">
        Replica reports travel over NATS, which this API is not configured with.
      </td>
    </tr>`;
  const [snapshot, versions] = await Promise.all([
    reports.snapshot({ limit: LIVE_LIMIT, waitMs: c.replicaWaitMs }),
    c.api.store.listVersions(),
  ]);
  const names = new Map(versions.map((v) => [v.functionId, v.name]));
  const rows = snapshot
    .flatMap((r) => r.requests.map((q) => ({ ...q, holder: r.holder })))
    .sort((a, b) => b.ageMs - a.ageMs)
    .slice(0, LIVE_LIMIT);
  if (rows.length === 0)
    return html`<tr>
      <td colspan="7" class="muted">
        No request in flight on the ${snapshot.length} replicas that answered.
      </td>
    </tr>`;
  return html`${rows.map(
    (q) =>
      html`<tr
        data-request-id="${q.requestId}"
        data-state="${q.state}"
        ${q.worker?.instanceId ? html` data-worker-instance="${q.worker.instanceId}"` : ""}
      >
        <td><a class="id" href="/console/requests/${q.requestId}">${q.requestId}</a></td>
        <td>${names.get(q.functionId) ?? q.functionId}</td>
        <td><span class="id">${q.versionId}</span></td>
        <td><span class="id">${q.holder}</span></td>
        <td class="state">${stateText(q.state)}${q.poll ? " (polled)" : ""}</td>
        <td class="worker">${workerCell(q.worker)}</td>
        <td class="num">${formatAge(q.ageMs)}</td>
      </tr>`,
  )}`;
}

export function lookupForm(value = ""): Html {
  return html`<form id="lookup" method="get" action="/console/requests" class="lookup" role="search">
    <label for="request-id"
      >Request id<input id="request-id" name="id" type="search" value="${value}" required
    /></label>
    <button type="submit">Look up</button>
  </form>`;
}

export async function liveBody(c: ConsoleDeps): Promise<Html> {
  return html`${lookupForm()}
    <p class="muted" aria-live="polite">
      <span id="live-status">as of page load</span>: requests held by the invocation replicas, oldest first
      (at most ${LIVE_LIMIT}). <em>queued</em>: no worker has called back yet (it waits in the work queue, or
      a worker runs it without needing the replica: its body fit in the work message); <em>with worker</em>: a
      worker called back (it fetched the rest of a large body, or took a status poll) and has not begun its
      answer; <em>responding</em>: the answer is on its way to the client. The worker is the one that called
      back: its instance id, and the address it called from.
    </p>
    <div class="table-wrap">
      <table id="inflight">
        <thead>
          <tr>
            <th scope="col">Request id</th>
            <th scope="col">Function</th>
            <th scope="col">Version</th>
            <th scope="col">Replica</th>
            <th scope="col">State</th>
            <th scope="col">Worker</th>
            <th scope="col" class="num">Age</th>
          </tr>
        </thead>
        <tbody>
          ${await inflightRows(c)}
        </tbody>
      </table>
    </div>`;
}

export const REQUEST_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export function checkRequestId(id: string): string {
  if (!REQUEST_ID.test(id))
    throw new CallplaneError(
      "VALIDATION_FAILED",
      `"${id.slice(0, 64)}" is not a request id (a UUID, NVCF-REQID)`,
      {
        extra: { errors: [{ field: "id", message: "must be a UUID" }] },
      },
    );
  return id.toLowerCase();
}

export async function requestBody(c: ConsoleDeps, requestId: string): Promise<Html> {
  const reports = c.reports();
  const r = reports ? await reports.lookup(requestId) : undefined;
  const state = r?.state ?? "unknown";
  const names = r?.functionId ? await c.api.store.listVersions(r.functionId) : [];
  return html`${lookupForm(requestId)}
    <dl id="request">
      <dt>Request id</dt>
      <dd><span class="id">${requestId}</span></dd>
      <dt>State</dt>
      <dd id="request-state" class="state">${stateText(state)}</dd>
      ${
        r?.worker
          ? html`<dt>Worker</dt>
              <dd id="request-worker">${workerCell(r.worker)}</dd>`
          : ""
      }
      ${
        r?.holder
          ? html`<dt>Replica</dt>
              <dd><span class="id">${r.holder}</span></dd>`
          : ""
      }
      ${
        r?.functionId
          ? html`<dt>Function</dt>
              <dd><a href="/console/functions/${r.functionId}">${names[0]?.name ?? r.functionId}</a></dd>`
          : ""
      }
      ${
        r?.versionId
          ? html`<dt>Version</dt>
              <dd><span class="id">${r.versionId}</span></dd>`
          : ""
      }
      ${
        r?.ageMs !== undefined
          ? html`<dt>Age</dt>
              <dd>${formatAge(r.ageMs)}</dd>`
          : ""
      }
      ${
        r?.durationMs !== undefined
          ? html`<dt>Duration</dt>
              <dd>${formatAge(r.durationMs)}</dd>`
          : ""
      }
      ${
        r?.endedAt
          ? html`<dt>Ended</dt>
              <dd>${r.endedAt}</dd>`
          : ""
      }
      ${
        r?.state === "failed"
          ? html`<dt>Error</dt>
              <dd id="request-error">${r.status ?? ""} <code>${r.code ?? ""}</code> ${r.detail ?? ""}</dd>`
          : ""
      }
      ${
        r?.state === "answered" && r.status !== undefined
          ? html`<dt>Status</dt>
              <dd>${r.status}</dd>`
          : ""
      }
    </dl>
    ${
      !reports
        ? html`<p class="muted">Replica reports travel over NATS, which this API is not configured with.</p>`
        : r === undefined
          ? html`<p class="muted">
              No replica answered for this id: the replica that held it is gone, or the id is not one of this
              plane's.
            </p>`
          : ""
    }
    ${await traceSection(c, requestId)}`;
}

// ---- which worker has a request (the replicas' WorkerSeen, plane/console-wire.ts)

/** A state as the pages say it (the wire's `with-worker` reads "with worker"). */
function stateText(state: string): string {
  return state === "with-worker" ? "with worker" : state;
}

/** The worker cell: its instance id, and the address it called back from; empty before it did. */
function workerCell(w: WorkerSeen | undefined): Html {
  if (!w) return html``;
  return html`${w.instanceId ? html`<span class="id">${w.instanceId}</span>` : ""}${
    w.instanceId && w.address ? " " : ""
  }${w.address ? html`<span class="muted">${w.address}</span>` : ""}`;
}
