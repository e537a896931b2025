// The audit log: what operators did in the console, recorded by the actions (actions.ts) with who
// did it (the admin token's subject and id), kept within its bounds (api.audit), and its page,
// newest first, paged.
import type { ApiDeps } from "../routes/deps.js";
import type { AuditRecord } from "../store/types.js";
import { PAGE_SIZE, type ConsoleDeps } from "./context.js";
import { html, type Html } from "./html.js";

const DAY_MS = 86_400_000;

/**
 * Records an applied action, then prunes. Actions are rare (an operator's clicks), so each one
 * prunes: two deletes along the time index, nothing to run on a timer.
 */
export async function recordAudit(api: ApiDeps, entry: AuditRecord): Promise<void> {
  await api.store.appendAudit(entry);
  await pruneAudit(api);
}

/** Removes the rows past api.audit's bounds; a failure is logged (the log then keeps a few more). */
export async function pruneAudit(api: ApiDeps, now = Date.now()): Promise<number> {
  const { maxRows, maxAgeDays } = api.audit;
  try {
    const n = await api.store.pruneAudit({
      keepRows: maxRows,
      before: new Date(now - maxAgeDays * DAY_MS).toISOString(),
    });
    if (n > 0) api.logger.info({ removed: n, maxRows, maxAgeDays }, "pruned the console's audit log");
    return n;
  } catch (err) {
    api.logger.warn({ err }, "could not prune the console's audit log (api.audit)");
    return 0;
  }
}

export async function auditBody(c: ConsoleDeps, page: number): Promise<Html> {
  // one more than a page: whether there is a next one
  const rows = await c.api.store.listAudit({ limit: PAGE_SIZE + 1, offset: (page - 1) * PAGE_SIZE });
  const more = rows.length > PAGE_SIZE;
  return html`<p class="muted">
      Every action taken in the console: deploy, scale, undeploy, revoke identity. Newest first. Who: the admin
      token's subject, and the token's id (revoke a token by it). Kept: the newest
      ${c.api.audit.maxRows.toLocaleString("en")} actions of the last ${c.api.audit.maxAgeDays} days
      (<code>api.audit</code>).
    </p>
    <div class="table-wrap">
      <table id="audit">
        <thead>
          <tr>
            <th scope="col">When</th>
            <th scope="col">Who</th>
            <th scope="col">Token</th>
            <th scope="col">What</th>
            <th scope="col">Target</th>
            <th scope="col">Detail</th>
          </tr>
        </thead>
        <tbody>
          ${rows.slice(0, PAGE_SIZE).map(
            (r) =>
              html`<tr data-action="${r.action}" data-subject="${r.subject}">
                <td>${r.at}</td>
                <td class="who">${r.subject}</td>
                <td><span class="id">${r.tokenId ?? ""}</span></td>
                <td>${r.action}</td>
                <td><span class="id">${r.target}</span></td>
                <td><code>${JSON.stringify(r.detail)}</code></td>
              </tr> `,
          )}
        </tbody>
      </table>
    </div>
    ${rows.length === 0 ? html`<p class="muted">Nothing yet.</p>` : ""}
    <nav class="pager" aria-label="Pages">
      ${page > 1 ? html`<a href="/console/audit?page=${page - 1}" rel="prev">Newer</a>` : ""}<span
        >Page ${page}</span
      >${more ? html`<a href="/console/audit?page=${page + 1}" rel="next">Older</a>` : ""}
    </nav>`;
}
