// Keeps docs/operations.md's metrics table, and the dashboards and alert rules of
// deploy/observability/, in step with what the services really expose: every service is started
// (the API, the admin issuer, an invocation replica, a worker, grpc-proxy, the compute agent, the
// admission webhook, and HAProxy as the callback proxy), given some traffic, and its GET /metrics
// read. A series a service exposes that the table does not list (or lists with another type, other
// labels or not for that service) fails here, as does a documented one nobody exposes, and a metric
// a rule or a panel names that no service exposes (a renamed metric would leave an alert that can
// never fire).
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { Agent, fetch as undiciFetch } from "undici";
import { createAdmissionWebhook } from "../../../src/services/admission-webhook/service.js";
import { createComputeAgent } from "../../../src/services/compute/agent.js";
import { createWorkerAgent } from "../../../src/services/worker/agent.js";
import { workerConfigFromEnv } from "../../../src/services/worker/config.js";
import { testInstanceEnv } from "../../testkit/compute.js";
import { echoMessage, grpcClient, meta, startGrpcPlane, unary } from "../../testkit/grpc.js";
import { removeDir, repoRoot } from "../../testkit/index.js";
import { familyOf, parseMetrics, scrape, type Scrape } from "../../testkit/metrics.js";
import { startPlane, workerEnv } from "../../testkit/plane.js";
import { allExpressions, familyName, selectors } from "../../testkit/promql.js";
import { mintAdminToken, startApi, startIssuer } from "../../testkit/services.js";
import { testPki } from "../../testkit/tls.js";

const SERVICES = [
  "api",
  "admin-issuer",
  "invocation",
  "grpc-proxy",
  "worker",
  "compute",
  "admission-webhook",
] as const;
type Service = (typeof SERVICES)[number];

/** Labels the registry adds to every series of a service (not the metric's own). */
const DEFAULT_LABELS: Record<Service, string[]> = {
  api: ["service"],
  "admin-issuer": ["service"],
  invocation: ["service"],
  "grpc-proxy": ["service"],
  worker: ["service", "function_id", "function_version_id"],
  compute: ["service"],
  "admission-webhook": ["service"],
};

/**
 * Documented for a service, but not exposed by the one this test starts: grpc-proxy reloads
 * certificates only for a worker TLS listener (behind the callback proxy), which this one has not.
 */
const NOT_EXPOSED_HERE = new Set([
  "grpc-proxy callplane_tls_reloads_total",
  "grpc-proxy callplane_tls_cert_not_after_seconds",
]);

interface Row {
  metric: string;
  type: string;
  labels: string[];
  services: string[];
  meaning: string;
}

function metricsTable(): Row[] {
  const doc = readFileSync(join(repoRoot, "docs", "operations.md"), "utf8");
  const cells = (l: string) =>
    l
      .trim()
      .slice(1, -1)
      .split("|")
      .map((c) => c.trim());
  const header = ["metric", "type", "labels", "services", "meaning"];
  const lines = doc.split("\n");
  const at = lines.findIndex((l) => l.trim().startsWith("|") && cells(l).join("|") === header.join("|"));
  assert.notEqual(
    at,
    -1,
    "docs/operations.md has a metrics table (metric | type | labels | services | meaning)",
  );
  const rows: Row[] = [];
  for (let i = at + 2; i < lines.length && lines[i].trim().startsWith("|"); i++) {
    const [metric, type, labels, services, meaning] = cells(lines[i]);
    const m = /^`([a-z_]+)`$/.exec(metric);
    assert.ok(m, `line ${i + 1}: the metric column holds one backquoted name, not ${metric}`);
    rows.push({
      metric: m[1],
      type,
      labels:
        labels === "—" ? [] : labels.split(",").map((l) => /^`([a-z_]+)`$/.exec(l.trim())?.[1] ?? `?${l}`),
      services: services.split(",").map((s) => s.trim()),
      meaning,
    });
  }
  return rows;
}

test(
  "the metrics table, the dashboards and the alert rules match what the running services expose",
  { timeout: 180_000 },
  async (t) => {
    // ---- start every service, and give each some traffic
    const plane = await startPlane(t, { proxy: true, workers: 0, invocation: { metricsOnClientPort: true } });
    const dir = mkdtempSync(join(tmpdir(), "callplane-metrics-docs-"));
    t.after(() => removeDir(dir));
    const worker = createWorkerAgent(
      workerConfigFromEnv(
        workerEnv(plane, join(dir, "worker"), {
          NVCF_REGION: "test",
          CALLPLANE_WORKER_HOST_MAP: `invocation.worker.callplane.test=${plane.proxy!.host}`,
          NVCF_PROXY_CA_PEM: plane.proxy!.pki.ca.certPem,
        }),
      ),
    );
    const { health } = await worker.start();
    t.after(() => worker.destroy());
    const r = await fetch(plane.invokeUrl(), {
      method: "POST",
      headers: { authorization: `Bearer ${plane.fn.apiKey}`, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(r.status, 200, await r.text());

    const grpc = await startGrpcPlane(t);
    const call = await unary(grpcClient(t, grpc.proxies[0].target), echoMessage("x"), meta(grpc.fn));
    assert.equal(call.err, null);

    const issuer = await startIssuer(t, plane.api.issuerKeyFile);
    await mintAdminToken(issuer);

    // the compute agent, against an API of its own with no deployment (it starts no instance)
    const computeApi = await startApi(t, {});
    const compute = createComputeAgent({
      listen: { host: "127.0.0.1", port: 0 },
      apiUrl: computeApi.url,
      serviceToken: computeApi.serviceToken("compute"),
      instanceNetwork: "127.0.91.0/24",
      syncIntervalMs: 500,
      reporter: "metrics-docs",
      instanceEnv: testInstanceEnv({
        natsUrl: plane.nats.url,
        natsCaPem: plane.nats.pki.ca.certPem,
        dataDir: join(dir, "compute"),
      }),
      tokenSource: "api",
    });
    t.after(() => compute.destroy());
    const computeUrl = await compute.listen();

    const pki = await testPki();
    const cert = await pki.issue(["localhost"]);
    writeFileSync(join(dir, "webhook.crt"), cert.certPem);
    writeFileSync(join(dir, "webhook.key"), cert.keyPem, { mode: 0o600 });
    const webhook = createAdmissionWebhook({
      listen: { host: "127.0.0.1", port: 0 },
      tls: { certFile: join(dir, "webhook.crt"), keyFile: join(dir, "webhook.key") },
      agentUsername: "system:serviceaccount:nvcf:nvcf-compute",
    });
    const webhookUrl = await webhook.listen();
    t.after(() => webhook.destroy());
    const tlsAgent = new Agent({ connect: { ca: pki.ca.certPem, servername: "localhost" } });
    t.after(() => tlsAgent.close());
    const webhookScrape = async (): Promise<Scrape> => {
      const res = await undiciFetch(`${webhookUrl.origin}/metrics`, { dispatcher: tlsAgent });
      assert.equal(res.status, 200);
      return parseMetrics(await res.text());
    };

    const scrapes: Record<Service, Scrape> = {
      api: await scrape(`${plane.api.url}/metrics`),
      "admin-issuer": await scrape(`${issuer.url}/metrics`),
      invocation: await scrape(`${plane.replicas[0].url}/metrics`),
      "grpc-proxy": await scrape(`${grpc.proxies[0].proxy.urls!.connect.origin}/metrics`),
      worker: await scrape(`${health.origin}/metrics`),
      compute: await scrape(`${computeUrl.origin}/metrics`),
      "admission-webhook": await webhookScrape(),
    };
    const haproxy = await scrape(plane.proxy!.metricsUrl);

    // ---- the table against the scrapes
    const rows = metricsTable();
    const byName = new Map(rows.map((r) => [r.metric, r]));
    assert.equal(byName.size, rows.length, "each metric is listed once");
    for (const row of rows) {
      assert.ok(["counter", "gauge", "histogram"].includes(row.type), `${row.metric}: type ${row.type}`);
      for (const s of row.services)
        assert.ok((SERVICES as readonly string[]).includes(s), `${row.metric}: service ${s}`);
      assert.ok(row.meaning.length >= 20, `${row.metric}: say what it means`);
    }
    for (const service of SERVICES) {
      const s = scrapes[service];
      for (const x of s.samples)
        if (x.name.startsWith("callplane_"))
          assert.equal(x.labels.service, service, `${service} labels its series service="${service}"`);
      for (const [family, type] of s.types) {
        if (!family.startsWith("callplane_")) continue;
        const row = byName.get(family);
        assert.ok(row, `${service} exposes ${family}, which docs/operations.md does not list`);
        assert.equal(type, row.type, `${family}: type`);
        assert.ok(
          row.services.includes(service),
          `${family} is exposed by ${service}, which its row does not name`,
        );
        const own = (labels: Record<string, string>) =>
          Object.keys(labels)
            .filter((l) => l !== "le" && !DEFAULT_LABELS[service].includes(l))
            .sort();
        for (const x of s.samples.filter((y) => familyOf(s, y.name) === family))
          assert.deepEqual(own(x.labels), [...row.labels].sort(), `${family} on ${service}: labels`);
      }
    }
    for (const row of rows)
      for (const service of row.services as Service[]) {
        if (NOT_EXPOSED_HERE.has(`${service} ${row.metric}`)) continue;
        assert.ok(
          scrapes[service].types.has(row.metric),
          `${service} does not expose ${row.metric}, which its row names`,
        );
      }

    // ---- every metric the dashboards and rules read is exposed, with the labels they select on
    const exposed = new Map<string, Set<string>>();
    const histograms = new Set<string>();
    for (const s of [...Object.values(scrapes), haproxy]) {
      for (const [family, type] of s.types) {
        if (!exposed.has(family)) exposed.set(family, new Set());
        if (type === "histogram") histograms.add(family);
      }
      for (const x of s.samples)
        for (const l of Object.keys(x.labels)) exposed.get(familyOf(s, x.name))?.add(l);
    }
    // each row's own labels, and the service label every callplane series carries
    for (const row of rows) for (const l of [...row.labels, "service"]) exposed.get(row.metric)?.add(l);
    // what Prometheus adds to every series it scrapes
    const targetLabels = ["instance", "job", "pod", "namespace"];
    const expressions = allExpressions(repoRoot);
    assert.ok(expressions.length > 50);
    for (const { where, expr } of expressions)
      for (const sel of selectors(expr)) {
        const family = familyName(sel.metric, histograms);
        const labels = exposed.get(family);
        assert.ok(labels, `${where}: ${sel.metric} is exposed by no service`);
        if (sel.metric !== family) assert.match(sel.metric, /_(bucket|sum|count)$/);
        for (const l of sel.labels)
          assert.ok(
            labels.has(l) || targetLabels.includes(l) || (sel.metric.endsWith("_bucket") && l === "le"),
            `${where}: ${sel.metric} has no label ${l}`,
          );
      }
  },
);
