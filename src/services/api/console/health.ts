// The health page: one row per component, each with a state the API can tell from here: itself,
// its database (one cheap read), NATS (health-nats.ts: its connection, each server, JetStream, the
// auth callout), the admin token issuer (only when enabled), each invocation and grpc-proxy replica
// (the registry buckets, and the invocation replicas' own reports), the callback proxy
// (health-proxy.ts: its /health, only when enabled), each registered compute cluster, the MEK
// provider (health-mek.ts). Every probe of another part runs in parallel with a short deadline and
// is kept a few seconds (probe-cache.ts).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { html, type Html } from "./html.js";
import { formatAge, type ConsoleDeps } from "./context.js";
import { mekRows } from "./health-mek.js";
import { natsRows } from "./health-nats.js";
import { callbackProxyRows } from "./health-proxy.js";
import type { Row } from "./health-row.js";
import type { RegistryEntry, ReplicaReport } from "./reports.js";

function packageVersion(): string | undefined {
  // dist/src/services/api/console/ → the repository (or image) root
  try {
    const pkg = JSON.parse(
      readFileSync(join(import.meta.dirname, "..", "..", "..", "..", "..", "package.json"), "utf8"),
    ) as { name?: string; version?: string };
    return pkg.name === "callplane" ? pkg.version : undefined;
  } catch {
    return undefined;
  }
}
const VERSION = packageVersion();

async function databaseRow(c: ConsoleDeps): Promise<Row> {
  const started = Date.now();
  try {
    await c.api.store.getAccount(c.api.ncaId);
    return { component: "database", state: "up", detail: `answered a read in ${Date.now() - started} ms` };
  } catch (err) {
    return { component: "database", state: "down", detail: `a read failed: ${(err as Error).message}` };
  }
}

async function replicaRows(c: ConsoleDeps): Promise<Row[]> {
  const reports = c.reports();
  if (!reports)
    return ["invocation", "grpc-proxy"].map((component) => ({
      component,
      state: "unknown" as const,
      detail: "replica reports travel over NATS, which this API is not configured with",
    }));
  let registry: RegistryEntry[];
  let snapshot: ReplicaReport[];
  try {
    [registry, snapshot] = await Promise.all([
      reports.registry(),
      reports.snapshot({ limit: 0, waitMs: c.replicaWaitMs }),
    ]);
  } catch (err) {
    return ["invocation", "grpc-proxy"].map((component) => ({
      component,
      state: "unknown" as const,
      detail: `the replicas could not be asked: ${(err as Error).message}`,
    }));
  }
  const byHolder = new Map(snapshot.map((r) => [r.holder, r]));
  const rows: Row[] = [];
  const invocation = registry.filter((e) => e.kind === "invocation");
  for (const e of invocation) {
    const r = byHolder.get(e.holder);
    rows.push(
      r
        ? {
            component: "invocation",
            id: e.holder,
            state: "up",
            version: r.version,
            where: e.relayUrl,
            detail: `${r.inFlight} requests held; started ${r.startedAt}`,
          }
        : {
            component: "invocation",
            id: e.holder,
            state: "degraded",
            where: e.relayUrl,
            detail: `registered, but did not answer within ${c.replicaWaitMs} ms`,
          },
    );
  }
  // every replica registers (relay or not); one that answers but is not in the registry (yet, or an
  // older replica that registered only with relay on) is up too
  for (const r of snapshot)
    if (!invocation.some((e) => e.holder === r.holder))
      rows.push({
        component: "invocation",
        id: r.holder,
        state: "up",
        version: r.version,
        where: "not in the registry",
        detail: `${r.inFlight} requests held; started ${r.startedAt}`,
      });
  if (rows.length === 0)
    rows.push({ component: "invocation", state: "down", detail: "no replica is registered or answering" });
  const grpc = registry.filter((e) => e.kind === "grpc-proxy");
  for (const e of grpc)
    rows.push({
      component: "grpc-proxy",
      id: e.holder,
      state: "up",
      where: e.relayUrl,
      detail: `registered; started ${e.startedAt}`,
    });
  if (grpc.length === 0)
    rows.push({
      component: "grpc-proxy",
      state: "unknown",
      detail: "none in the registry (no grpc-proxy replica runs, or none could reach NATS)",
    });
  return rows;
}

async function computeRows(c: ConsoleDeps): Promise<Row[]> {
  try {
    const clusters = await c.api.store.listClusters();
    return clusters.map((k) => ({
      component: "compute",
      id: k.clusterId,
      state: "unknown" as const,
      where: k.backend,
      detail: `registered ${k.instanceTypes.length} instance types at ${k.updatedAt} (the agent's liveness is not reported to the API)`,
    }));
  } catch (err) {
    return [
      { component: "compute", state: "unknown", detail: `clusters unreadable: ${(err as Error).message}` },
    ];
  }
}

export async function healthRows(c: ConsoleDeps, host: string): Promise<Row[]> {
  const api: Row = {
    component: "api",
    state: "up",
    version: VERSION,
    where: host,
    detail: `serving this page; up ${formatAge(Date.now() - c.startedAt.getTime())}`,
  };
  const issuer: Row[] = c.api.adminIssuer?.enabled
    ? [
        c.api.auth.issuerTokensAccepted
          ? {
              component: "admin-issuer",
              state: "unknown",
              detail: "enabled; the API accepts the tokens it signs (the API does not call it)",
            }
          : {
              component: "admin-issuer",
              state: "degraded",
              detail: "enabled, but the API was not given its key: its tokens are refused",
            },
      ]
    : [];
  const [db, nats, replicas, proxy, compute, mek] = await Promise.all([
    databaseRow(c),
    natsRows(c),
    replicaRows(c),
    callbackProxyRows(c),
    computeRows(c),
    mekRows(c),
  ]);
  return [api, db, ...nats, ...issuer, ...replicas, ...proxy, ...compute, ...mek];
}

export function healthBody(rows: Row[]): Html {
  return html`<div class="table-wrap">
    <table id="components">
      <caption class="muted">
        What this API can tell about each part of the plane now.
      </caption>
      <thead>
        <tr>
          <th scope="col">Component</th>
          <th scope="col">State</th>
          <th scope="col">Version</th>
          <th scope="col">Replica or address</th>
          <th scope="col">Detail</th>
        </tr>
      </thead>
      <tbody>
        ${rows.map(
          (r) =>
            html`<tr
              data-component="${r.component}"
              data-state="${r.state}"
              ${r.id !== undefined ? html` data-id="${r.id}"` : ""}
            >
              <th scope="row">${r.component}</th>
              <td class="state">${r.state}</td>
              <td>${r.version ?? ""}</td>
              <td>
                <span class="id">${r.id ?? ""}</span>${r.id && r.where ? html`<br />` : ""}${r.where ?? ""}
              </td>
              <td>${r.detail}</td>
            </tr> `,
        )}
      </tbody>
    </table>
  </div>`;
}
