// What a PromQL expression reads: the metric names it selects and the label names its matchers use,
// found without a full parser (promtool is not on every machine). Enough for the expressions in
// deploy/observability/: strings are dropped, `{...}` matchers and `[...]` ranges read apart, and
// identifiers that are keywords, functions (followed by "("), grouping labels (`by (...)`) or
// numbers and durations are not metric names.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parse as parseYaml } from "yaml";

const KEYWORDS = new Set([
  "and",
  "or",
  "unless",
  "by",
  "without",
  "on",
  "ignoring",
  "group_left",
  "group_right",
  "bool",
  "offset",
  "inf",
  "nan",
  // aggregations, which may put `by (...)` before their parenthesis
  "sum",
  "min",
  "max",
  "avg",
  "count",
  "group",
  "stddev",
  "stdvar",
  "topk",
  "bottomk",
  "quantile",
  "count_values",
]);

export interface Selector {
  metric: string;
  /** The label names its matchers name. */
  labels: string[];
}

/** The selectors of an expression (metric name and matcher label names). */
export function selectors(expr: string): Selector[] {
  // strings: "..." (matcher values, legend-free); template variables stay inside them
  const noStrings = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  // grouping lists name labels, not metrics
  const noGrouping = noStrings.replace(
    /\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)/g,
    (_, kw: string) => `${kw} ()`,
  );
  // ranges and subqueries: [5m], [10m:1m], [$__rate_interval]
  const noRanges = noGrouping.replace(/\[[^\]]*\]/g, "");
  const out: Selector[] = [];
  const re = /([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?(\s*\()?/g;
  for (const m of noRanges.matchAll(re)) {
    const [, name, matchers, call] = m;
    const before = noRanges.slice(0, m.index);
    // a label name inside a matcher list of a selector without a name ({__name__=...}) is not used here
    if (/\{[^}]*$/.test(before)) continue;
    if (call) continue; // a function or aggregation
    if (KEYWORDS.has(name.toLowerCase())) continue;
    if (/^\$/.test(name) || /[0-9]$/.test(before.slice(-1))) continue; // 5m, 1e3
    const labels = matchers
      ? [...matchers.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)/g)].map((x) => x[1])
      : [];
    out.push({ metric: name, labels });
  }
  return out;
}

/** A histogram's series name the expression reads, as its family: x_bucket, x_sum, x_count → x. */
export function familyName(metric: string, histograms: ReadonlySet<string>): string {
  const m = /^(.*)_(bucket|sum|count)$/.exec(metric);
  return m && histograms.has(m[1]) ? m[1] : metric;
}

export const observabilityDir = (repoRoot: string) => join(repoRoot, "deploy", "observability");

export interface AlertRule {
  alert: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

/** Every alert rule of every file in deploy/observability/alerts/. */
export function alertRules(repoRoot: string): Array<AlertRule & { file: string }> {
  const dir = join(observabilityDir(repoRoot), "alerts");
  return readdirSync(dir)
    .filter((f) => f.endsWith(".yaml"))
    .flatMap((file) => {
      const doc = parseYaml(readFileSync(join(dir, file), "utf8")) as {
        groups: Array<{ name: string; rules: AlertRule[] }>;
      };
      return doc.groups.flatMap((g) => g.rules.map((r) => ({ ...r, file })));
    });
}

export interface Dashboard {
  file: string;
  uid: string;
  title: string;
  panels: Array<{
    id: number;
    type: string;
    title: string;
    gridPos: { x: number; y: number; w: number; h: number };
    datasource?: { type: string; uid: string };
    targets?: Array<{ refId: string; expr: string; datasource?: { uid: string } }>;
  }>;
  templating: { list: Array<{ name: string; type: string; query?: unknown; definition?: string }> };
}

export function dashboards(repoRoot: string): Dashboard[] {
  const dir = join(observabilityDir(repoRoot), "dashboards");
  return readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .sort()
    .map((file) => ({
      file,
      ...(JSON.parse(readFileSync(join(dir, file), "utf8")) as Omit<Dashboard, "file">),
    }));
}

/** Every PromQL expression of the dashboards and rules, with where it is. */
export function allExpressions(repoRoot: string): Array<{ where: string; expr: string }> {
  const out: Array<{ where: string; expr: string }> = [];
  for (const r of alertRules(repoRoot)) out.push({ where: `${r.file}: ${r.alert}`, expr: r.expr });
  for (const d of dashboards(repoRoot)) {
    for (const p of d.panels)
      for (const t of p.targets ?? [])
        out.push({ where: `${d.file}: ${p.title} (${t.refId})`, expr: t.expr });
    for (const v of d.templating.list)
      if (v.type === "query" && v.definition) {
        const m = /^label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\)$/.exec(v.definition);
        if (m) out.push({ where: `${d.file}: variable ${v.name}`, expr: m[1] });
      }
  }
  return out;
}
