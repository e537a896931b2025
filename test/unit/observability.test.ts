// The dashboards and alert rules of deploy/observability/ are well formed and documented: every rule
// has an expression, a duration, a severity and words for whoever is paged; every dashboard parses,
// has a unique uid, reads its data source from its variable and places its panels on the grid; the
// tables of docs/operations.md list exactly these files and alerts. `promtool check rules` runs
// when Debian's prometheus package is installed. (That every metric they name is one the services
// expose is checked against running services: test/integration/metrics/metrics-docs.test.ts.)
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { alertRules, allExpressions, dashboards, observabilityDir, selectors } from "../testkit/promql.js";

// compiled to dist/test/unit/, so the repository root is three levels up
const repoRoot = join(import.meta.dirname, "..", "..", "..");
const operations = readFileSync(join(repoRoot, "docs", "operations.md"), "utf8");

/** The rows of the markdown table whose header row is exactly `header`. */
function tableRows(doc: string, header: string[]): string[][] {
  const cells = (l: string) =>
    l
      .trim()
      .slice(1, -1)
      .split("|")
      .map((c) => c.trim());
  const lines = doc.split("\n");
  const at = lines.findIndex((l) => l.trim().startsWith("|") && cells(l).join("|") === header.join("|"));
  assert.notEqual(at, -1, `no table with columns ${header.join(" | ")}`);
  const rows: string[][] = [];
  for (let i = at + 2; i < lines.length && lines[i].trim().startsWith("|"); i++) rows.push(cells(lines[i]));
  return rows;
}
const code = (cell: string) => /^`([^`]+)`$/.exec(cell)?.[1] ?? cell;

void test("every alert rule has an expression, a duration, a severity, a summary and a description", () => {
  const rules = alertRules(repoRoot);
  assert.ok(
    rules.length >= 6,
    "the rules cover error rate, latency, queue growth, no ready instance, certificates, NATS",
  );
  const names = rules.map((r) => r.alert);
  assert.deepEqual(
    names.filter((n, i) => names.indexOf(n) !== i),
    [],
    "alert names are unique",
  );
  for (const r of rules) {
    assert.match(r.alert, /^[A-Z][A-Za-z]+$/, r.alert);
    assert.ok(r.expr?.trim(), `${r.alert}: expr`);
    assert.match(r.for ?? "", /^\d+[smh]$/, `${r.alert}: for`);
    assert.ok(["warning", "critical"].includes(r.labels?.severity ?? ""), `${r.alert}: severity`);
    assert.ok((r.annotations?.summary ?? "").length > 10, `${r.alert}: summary`);
    assert.ok((r.annotations?.description ?? "").length > 40, `${r.alert}: description`);
    assert.ok(selectors(r.expr).length > 0, `${r.alert}: reads no metric`);
  }
  for (const topic of [/ErrorRate/, /Latency/, /Queue/, /NoReadyInstance/, /Certificate/, /Nats/])
    assert.ok(
      names.some((n) => topic.test(n)),
      `an alert for ${String(topic)}`,
    );
});

void test("docs/operations.md's alert table is the rules: names, durations and severities", () => {
  const rows = tableRows(operations, ["alert", "fires when", "for", "severity"]);
  const rules = alertRules(repoRoot);
  assert.deepEqual(
    rows.map((r) => code(r[0])),
    rules.map((r) => r.alert),
    "the table lists the rules, in the file's order",
  );
  for (const [name, , dur, severity] of rows) {
    const r = rules.find((x) => x.alert === code(name))!;
    assert.equal(dur, r.for, `${r.alert}: for`);
    assert.equal(severity, r.labels?.severity, `${r.alert}: severity`);
  }
});

void test("every dashboard parses, has its own uid, reads the datasource variable and fits the grid", () => {
  const all = dashboards(repoRoot);
  assert.deepEqual(
    all.map((d) => d.file),
    [
      "callplane-callback-proxy.json",
      "callplane-function.json",
      "callplane-nats-queue.json",
      "callplane-overview.json",
      "callplane-replica.json",
    ],
  );
  for (const d of all) {
    assert.equal(`${d.uid}.json`, d.file, "the uid names the file");
    assert.ok(d.title.startsWith("callplane: "), d.title);
    assert.ok(
      d.templating.list.some((v) => v.name === "datasource" && v.type === "datasource"),
      `${d.file}: a datasource variable`,
    );
    const ids = d.panels.map((p) => p.id);
    assert.equal(new Set(ids).size, ids.length, `${d.file}: panel ids are unique`);
    for (const p of d.panels) {
      assert.ok(p.gridPos.x >= 0 && p.gridPos.x + p.gridPos.w <= 24, `${d.file}: ${p.title} fits 24 columns`);
      if (p.type === "row") continue;
      assert.equal(p.datasource?.uid, "${datasource}", `${d.file}: ${p.title} uses the variable`);
      assert.ok((p.targets ?? []).length > 0, `${d.file}: ${p.title} has a query`);
      for (const t of p.targets ?? [])
        assert.ok(selectors(t.expr).length > 0, `${d.file}: ${p.title} reads a metric`);
    }
  }
  const rows = tableRows(operations, ["file", "what it shows"]).map((r) => code(r[0]));
  assert.deepEqual(
    rows.filter((f) => f.startsWith("dashboards/")).sort(),
    all.map((d) => `dashboards/${d.file}`),
    "docs/operations.md lists every dashboard",
  );
});

void test("every expression is balanced and reads metrics by name", () => {
  for (const { where, expr } of allExpressions(repoRoot)) {
    for (const [open, close] of [
      ["(", ")"],
      ["{", "}"],
      ["[", "]"],
    ]) {
      const n = (c: string) => expr.split(c).length - 1;
      assert.equal(n(open), n(close), `${where}: ${open}${close} unbalanced in ${expr}`);
    }
    for (const s of selectors(expr))
      assert.match(s.metric, /^(callplane|haproxy|process|nodejs)_[a-z0-9_]+$/, `${where}: ${s.metric}`);
  }
});

void test("promtool check rules accepts the rule files (when Debian's prometheus package is installed)", (t) => {
  const probe = spawnSync("promtool", ["--version"], { encoding: "utf8" });
  if (probe.error) {
    t.skip("promtool is not installed (apt-get install prometheus); the rules are parsed and checked above");
    return;
  }
  const file = join(observabilityDir(repoRoot), "alerts", "callplane-alerts.yaml");
  const r = spawnSync("promtool", ["check", "rules", file], { encoding: "utf8" });
  assert.equal(r.status, 0, `${r.stdout}${r.stderr}`);
});
