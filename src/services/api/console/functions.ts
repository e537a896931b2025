// The functions page (every function of the plane, filtered by name and paged on the server, with
// the invocation replicas' last-minute stats merged in and the queue depth of the page's rows) and
// one function's page (its last hour in graphs, its versions, deployments with the scale and
// undeploy forms and the deploy form for a version without one, instances with the
// revoke-identity form, and its secrets by name).
import { CallplaneError } from "../../../lib/errors.js";
import { functionStatus } from "../routes/dto.js";
import type { DeploymentRecord, FunctionVersionRecord, InstanceRecord } from "../store/types.js";
import { ASSET_PATHS } from "./assets.js";
import { deployForm } from "./deploy-form.js";
import { PAGE_SIZE, type ConsoleDeps } from "./context.js";
import { functionHour, graphsBody } from "./graphs.js";
import { html, type Html } from "./html.js";
import type { FunctionStats } from "./reports.js";

interface FunctionRow {
  functionId: string;
  name: string;
  versions: FunctionVersionRecord[];
}

/** Every function, by name (listVersions orders by name, then creation). */
function group(versions: FunctionVersionRecord[]): FunctionRow[] {
  const byId = new Map<string, FunctionRow>();
  for (const v of versions) {
    let f = byId.get(v.functionId);
    if (!f) byId.set(v.functionId, (f = { functionId: v.functionId, name: v.name, versions: [] }));
    f.versions.push(v);
  }
  return [...byId.values()];
}

interface Merged {
  requests: number;
  errors: number;
  inFlight: number;
  p50Ms: number | undefined;
  p99Ms: number | undefined;
}

/** Sums over the replicas; a percentile is the largest any replica saw (not a true percentile of all). */
function mergeStats(stats: FunctionStats[]): Map<string, Merged> {
  const out = new Map<string, Merged>();
  const max = (a: number | undefined, b: number | undefined) =>
    a === undefined ? b : b === undefined ? a : Math.max(a, b);
  for (const s of stats) {
    const m = out.get(s.functionId) ?? {
      requests: 0,
      errors: 0,
      inFlight: 0,
      p50Ms: undefined,
      p99Ms: undefined,
    };
    m.requests += s.requests;
    m.errors += s.errors;
    m.inFlight += s.inFlight;
    m.p50Ms = max(m.p50Ms, s.p50Ms);
    m.p99Ms = max(m.p99Ms, s.p99Ms);
    out.set(s.functionId, m);
  }
  return out;
}

async function replicaStats(c: ConsoleDeps): Promise<Map<string, Merged> | undefined> {
  const reports = c.reports();
  if (!reports) return undefined;
  try {
    const snap = await reports.snapshot({ limit: 0, waitMs: c.replicaWaitMs });
    return mergeStats(snap.flatMap((r) => r.functions));
  } catch {
    return undefined;
  }
}

async function queueDepth(c: ConsoleDeps, versionIds: string[]): Promise<number | undefined> {
  if (versionIds.length === 0) return undefined;
  const backlogs = await Promise.all(
    versionIds.map((v) => c.api.trust.queueBacklog(v).catch(() => undefined)),
  );
  if (backlogs.some((b) => b === undefined)) return undefined;
  return backlogs.reduce((n, b) => n + b!.pending, 0);
}

const ms = (v: number | undefined) => (v === undefined ? "" : String(Math.round(v)));

export async function functionsBody(c: ConsoleDeps, q: string, page: number): Promise<Html> {
  const { store } = c.api;
  const needle = q.trim().toLowerCase();
  const all = group(await store.listVersions()).filter(
    (f) => !needle || f.name.toLowerCase().includes(needle),
  );
  const pages = Math.max(1, Math.ceil(all.length / PAGE_SIZE));
  const shown = all.slice((page - 1) * PAGE_SIZE, page * PAGE_SIZE);
  const [deployments, instances, stats] = await Promise.all([
    store.listDeployments(),
    store.listInstances(),
    replicaStats(c),
  ]);
  const rows = await Promise.all(
    shown.map(async (f) => {
      const ds = deployments.filter((d) => d.functionId === f.functionId);
      const is = instances.filter((i) => i.functionId === f.functionId);
      const states = ds.map((d) =>
        functionStatus(
          d,
          is.filter((i) => i.versionId === d.versionId),
        ),
      );
      const ready = is.filter((i) => i.status === "ACTIVE").length;
      const desired = ds.reduce((n, d) => n + d.specs.reduce((m, s) => m + s.minInstances, 0), 0);
      const s = stats?.get(f.functionId);
      const depth = await queueDepth(
        c,
        ds.map((d) => d.versionId),
      );
      return html`<tr data-function-id="${f.functionId}" data-function-name="${f.name}">
        <th scope="row"><a href="/console/functions/${f.functionId}">${f.name}</a></th>
        <td class="num">${f.versions.length}</td>
        <td>
          ${states.length ? [...new Set(states)].join(", ") : html`<span class="muted">not deployed</span>`}
        </td>
        <td class="num">${ds.length ? `${ready}/${desired}` : ""}</td>
        <td class="num">${s ? s.inFlight : ""}</td>
        <td class="num">${s ? s.requests : ""}</td>
        <td class="num">${s && s.requests > 0 ? (s.errors / s.requests).toFixed(3) : ""}</td>
        <td class="num">
          ${s && (s.p50Ms !== undefined || s.p99Ms !== undefined) ? `${ms(s.p50Ms)}/${ms(s.p99Ms)}` : ""}
        </td>
        <td class="num">${depth ?? ""}</td>
      </tr> `;
    }),
  );
  const link = (p: number) =>
    `/console/functions?${new URLSearchParams({ ...(q ? { q } : {}), page: String(p) }).toString()}`;
  return html`<form class="filter" method="get" action="/console/functions" role="search">
      <label for="q">Name contains<input id="q" name="q" type="search" value="${q}" /></label>
      <button type="submit">Filter</button>
    </form>
    <p class="muted">
      ${all.length} ${all.length === 1 ? "function" : "functions"}${needle ? html` matching “${q}”` : ""}.
      Requests, errors and in flight: the last minute, summed over the invocation replicas that
      answered${stats ? "" : " (none answered: blank)"}; Errors: their share. p50/p99: the largest any one
      replica saw. Queued: messages waiting in the deployed versions' work queues.
    </p>
    <div class="table-wrap">
      <table id="functions">
        <thead>
          <tr>
            <th scope="col">Name</th>
            <th scope="col" class="num">Versions</th>
            <th scope="col">State</th>
            <th scope="col" class="num">Ready/desired</th>
            <th scope="col" class="num">In flight</th>
            <th scope="col" class="num">Req/min</th>
            <th scope="col" class="num">Errors</th>
            <th scope="col" class="num">p50/p99 ms</th>
            <th scope="col" class="num">Queued</th>
          </tr>
        </thead>
        <tbody>
          ${rows}
        </tbody>
      </table>
    </div>
    <nav class="pager" aria-label="Pages">
      ${page > 1 ? html`<a href="${link(page - 1)}" rel="prev">Previous</a>` : ""}<span
        >Page ${page} of ${pages}</span
      >${page < pages ? html`<a href="${link(page + 1)}" rel="next">Next</a>` : ""}
    </nav>`;
}

/** A function's versions, or FUNCTION_NOT_FOUND. The console sees every account's functions. */
export async function loadFunction(c: ConsoleDeps, functionId: string): Promise<FunctionVersionRecord[]> {
  const versions = /^[0-9a-f-]{36}$/.test(functionId) ? await c.api.store.listVersions(functionId) : [];
  if (versions.length === 0)
    throw new CallplaneError("FUNCTION_NOT_FOUND", `no function with id ${functionId.slice(0, 64)}`);
  return versions;
}

function deploymentRow(f: FunctionVersionRecord, d: DeploymentRecord, is: InstanceRecord[]): Html {
  const spec = d.specs[0];
  const min = spec?.minInstances ?? 0;
  const max = spec?.maxInstances ?? 0;
  const idp = d.versionId;
  return html`<tr data-version-id="${d.versionId}">
    <td><span class="id">${d.versionId}</span></td>
    <td class="state">${functionStatus(d, is)}</td>
    <td>${d.specs.map((s) => `${s.gpu}/${s.instanceType}`).join(", ")}</td>
    <td class="num">${d.specs.map((s) => `${s.minInstances}–${s.maxInstances}`).join(", ")}</td>
    <td class="num">${is.filter((i) => i.status === "ACTIVE").length}</td>
    <td>${d.updatedAt}</td>
    <td>
      <form class="scale" method="post" action="/console/actions/scale">
        <input type="hidden" name="functionId" value="${f.functionId}" />
        <input type="hidden" name="versionId" value="${d.versionId}" />
        <label for="min-${idp}"
          >Min<input id="min-${idp}" name="minInstances" type="number" min="0" value="${min}" required
        /></label>
        <label for="max-${idp}"
          >Max<input id="max-${idp}" name="maxInstances" type="number" min="1" value="${max}" required
        /></label>
        <button type="submit">Scale…</button>
      </form>
      <form class="undeploy" method="post" action="/console/actions/undeploy">
        <input type="hidden" name="functionId" value="${f.functionId}" />
        <input type="hidden" name="versionId" value="${d.versionId}" />
        <button type="submit" class="danger">Undeploy…</button>
      </form>
    </td>
  </tr> `;
}

export async function functionBody(
  c: ConsoleDeps,
  functionId: string,
): Promise<{ title: string; body: Html; scripts: string[]; styles: string[] }> {
  const { store, secrets } = c.api;
  const versions = await loadFunction(c, functionId);
  const f = versions[0];
  const [deployments, instances, secretNames, hour] = await Promise.all([
    store.listDeployments(),
    store.listInstances(),
    secrets
      ? secrets.names(versions.map((v) => v.versionId)).catch(() => undefined)
      : Promise.resolve(undefined),
    functionHour(c, functionId),
  ]);
  const ds = deployments.filter((d) => d.functionId === functionId);
  const is = instances.filter((i) => i.functionId === functionId);
  const names = new Set([...(secretNames?.values() ?? [])].flat());
  const undeployed = versions.filter((v) => !ds.some((d) => d.versionId === v.versionId));
  const deploy = undeployed.length ? await deployForm(c, functionId, undeployed) : "";
  const body = html`<p>
      Function <span class="id">${functionId}</span> of account <span class="id">${f.ncaId}</span>.
    </p>
    ${graphsBody(hour)}
    <h2 id="versions-heading">Versions</h2>
    <div class="table-wrap">
      <table id="versions" aria-labelledby="versions-heading">
        <thead>
          <tr>
            <th scope="col">Version</th>
            <th scope="col">Created</th>
            <th scope="col">Image</th>
            <th scope="col">Type</th>
            <th scope="col">Deployed</th>
          </tr>
        </thead>
        <tbody>
          ${versions.map(
            (v) =>
              html`<tr data-version-id="${v.versionId}">
                <td><span class="id">${v.versionId}</span></td>
                <td>${v.createdAt}</td>
                <td><code>${v.spec.containerImage}</code></td>
                <td>${v.spec.functionType}</td>
                <td>${ds.some((d) => d.versionId === v.versionId) ? "yes" : "no"}</td>
              </tr> `,
          )}
        </tbody>
      </table>
    </div>
    <h2 id="deployments-heading">Deployments</h2>
    <div class="table-wrap">
      <table id="deployments" aria-labelledby="deployments-heading">
        <thead>
          <tr>
            <th scope="col">Version</th>
            <th scope="col">State</th>
            <th scope="col">Instance type</th>
            <th scope="col" class="num">Min–max</th>
            <th scope="col" class="num">Active</th>
            <th scope="col">Updated</th>
            <th scope="col">Actions</th>
          </tr>
        </thead>
        <tbody>
          ${ds.map((d) =>
            deploymentRow(
              f,
              d,
              is.filter((i) => i.versionId === d.versionId),
            ),
          )}
        </tbody>
      </table>
    </div>
    ${ds.length ? "" : html`<p class="muted">No version of this function is deployed.</p>`} ${deploy}
    <h2 id="instances-heading">Instances</h2>
    <div class="table-wrap">
      <table id="instances" aria-labelledby="instances-heading">
        <thead>
          <tr>
            <th scope="col">Instance</th>
            <th scope="col">Version</th>
            <th scope="col">State</th>
            <th scope="col">Type</th>
            <th scope="col">Where</th>
            <th scope="col">Updated</th>
            <th scope="col">Message</th>
            <th scope="col">Actions</th>
          </tr>
        </thead>
        <tbody>
          ${is.map(
            (i) =>
              html`<tr data-instance-id="${i.instanceId}" data-state="${i.status}">
                <td><span class="id">${i.instanceId}</span></td>
                <td><span class="id">${i.versionId}</span></td>
                <td class="state">${i.status}</td>
                <td>${i.gpu}/${i.instanceType}</td>
                <td>${i.location}</td>
                <td>${i.updatedAt}</td>
                <td>${i.message ?? ""}</td>
                <td>
                  ${
                    i.status === "TERMINATED"
                      ? ""
                      : html`<form
                          class="revoke-identity"
                          method="post"
                          action="/console/actions/revoke-identity"
                        >
                          <input type="hidden" name="functionId" value="${functionId}" />
                          <input type="hidden" name="instanceId" value="${i.instanceId}" />
                          <button type="submit" class="danger">Revoke identity…</button>
                        </form>`
                  }
                </td>
              </tr> `,
          )}
        </tbody>
      </table>
    </div>
    ${
      names.size
        ? html`<h2 id="secrets-heading">Secrets</h2>
            <ul id="secrets" aria-labelledby="secrets-heading">
              ${[...names].sort().map((n) => html`<li><code>${n}</code></li>`)}
            </ul>
            <p class="muted">Names only; values are never shown.</p>`
        : ""
    }`;
  return {
    title: f.name,
    body,
    scripts: [ASSET_PATHS.uplotJs, ASSET_PATHS.graphsJs],
    styles: [ASSET_PATHS.uplotCss],
  };
}
