// The audit page: what operators did in the console, newest first, paged.
import { PAGE_SIZE, type ConsoleDeps } from "./context.js";
import { html, type Html } from "./html.js";

export async function auditBody(c: ConsoleDeps, page: number): Promise<Html> {
  // one more than a page: whether there is a next one
  const rows = await c.api.store.listAudit({ limit: PAGE_SIZE + 1, offset: (page - 1) * PAGE_SIZE });
  const more = rows.length > PAGE_SIZE;
  return html`<p class="muted">
      Every action taken in the console: deploy, scale, undeploy, revoke identity. Newest first.
    </p>
    <div class="table-wrap">
      <table id="audit">
        <thead>
          <tr>
            <th scope="col">When</th>
            <th scope="col">Who</th>
            <th scope="col">What</th>
            <th scope="col">Target</th>
            <th scope="col">Detail</th>
          </tr>
        </thead>
        <tbody>
          ${rows.slice(0, PAGE_SIZE).map(
            (r) =>
              html`<tr data-action="${r.action}">
                <td>${r.at}</td>
                <td>${r.actor}</td>
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
