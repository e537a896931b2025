// The deploy form on a function's page (the action itself: actions.ts): the versions that have no
// deployment, and the instance types the registered clusters offer.
import { offeredByType, offeredClusters } from "../instance-types.js";
import type { FunctionVersionRecord } from "../store/types.js";
import type { ConsoleDeps } from "./context.js";
import { html, type Html } from "./html.js";

/** The deploy form for the versions without a deployment, with the instance types the clusters offer. */
export async function deployForm(
  c: ConsoleDeps,
  functionId: string,
  undeployed: FunctionVersionRecord[],
): Promise<Html> {
  const types = offeredByType(await offeredClusters(c.api.store, c.api.compute));
  const heading = html`<h2 id="deploy-heading">Deploy a version</h2>`;
  if (types.size === 0)
    return html`${heading}
      <p class="muted" id="deploy-none">
        No cluster offers an instance type yet: is the compute agent running? (It registers its cluster's
        types when it starts.)
      </p>`;
  return html`${heading}
    <form
      id="deploy"
      class="deploy"
      method="post"
      action="/console/actions/deploy"
      aria-labelledby="deploy-heading"
    >
      <input type="hidden" name="functionId" value="${functionId}" />
      <label for="deploy-version"
        >Version<select id="deploy-version" name="versionId" required>
          ${undeployed.map((v) => html`<option value="${v.versionId}">${v.versionId} (${v.createdAt})</option>`)}
        </select></label
      >
      <label for="deploy-type"
        >Instance type<select id="deploy-type" name="instanceType" required>
          ${[...types].map(
            ([key, t]) => html`<option value="${key}">${t.gpu}/${t.name} (${t.clusters.join(", ")})</option>`,
          )}
        </select></label
      >
      <label for="deploy-min"
        >Min<input id="deploy-min" name="minInstances" type="number" min="0" value="1" required
      /></label>
      <label for="deploy-max"
        >Max<input id="deploy-max" name="maxInstances" type="number" min="1" value="1" required
      /></label>
      <label for="deploy-concurrency"
        >Requests per instance<input
          id="deploy-concurrency"
          name="maxRequestConcurrency"
          type="number"
          min="1"
          value="1"
          required
      /></label>
      <button type="submit">Deploy…</button>
    </form>`;
}
