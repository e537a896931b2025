// 70-observability.yaml: the Grafana dashboards and Prometheus alert rules shipped in
// deploy/observability/, as ConfigMaps in the control plane's namespace. A dashboard's ConfigMap
// carries the label Grafana's dashboard sidecar looks for (grafana_dashboard: "1", the Grafana Helm
// chart's and kube-prometheus-stack's default); the rules' carries prometheus_rule: "1" and holds
// the rule file as Prometheus reads it (a PrometheusRule's spec.groups is the same list). The files
// are read as they are in the checkout render runs from: they are data, not rendered from the
// environment file.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { checkoutRoot } from "../../lib/paths.js";
import { ConfigMap } from "kubernetes-models/v1";
import type { RenderContext } from "./context.js";
import type { K8sObject } from "./types.js";

/** deploy/observability/ in the checkout. */
export const OBSERVABILITY_DIR = join(checkoutRoot, "deploy", "observability");

export const GRAFANA_DASHBOARD_LABEL = "grafana_dashboard";
export const PROMETHEUS_RULE_LABEL = "prometheus_rule";
export const ALERTS_CONFIG_MAP = "callplane-prometheus-rules";

/** The files of one kind (dashboards/*.json, alerts/*.yaml), sorted by name. */
export function observabilityFiles(kind: "dashboards" | "alerts"): Array<{ name: string; text: string }> {
  const dir = join(OBSERVABILITY_DIR, kind);
  const ext = kind === "dashboards" ? ".json" : ".yaml";
  return readdirSync(dir)
    .filter((f) => f.endsWith(ext))
    .sort()
    .map((name) => ({ name, text: readFileSync(join(dir, name), "utf8") }));
}

export function renderObservability(k: RenderContext): K8sObject[] {
  const out: K8sObject[] = [];
  for (const { name, text } of observabilityFiles("dashboards")) {
    const meta = k.meta(`${name.replace(/\.json$/, "")}-dashboard`);
    out.push(
      new ConfigMap({
        metadata: { ...meta, labels: { ...meta.labels, [GRAFANA_DASHBOARD_LABEL]: "1" } },
        data: { [name]: text },
      }),
    );
  }
  const meta = k.meta(ALERTS_CONFIG_MAP);
  out.push(
    new ConfigMap({
      metadata: { ...meta, labels: { ...meta.labels, [PROMETHEUS_RULE_LABEL]: "1" } },
      data: Object.fromEntries(observabilityFiles("alerts").map((f) => [f.name, f.text])),
    }),
  );
  return out;
}
