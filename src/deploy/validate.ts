// Every rendered object is checked against the schema its models package carries (the Kubernetes
// API schema of kubernetes-models 4.5, which has the fields of Kubernetes 1.30; the Gateway API
// v1.0 CRDs of @kubernetes-models/gateway-api 0.5; the cert-manager CRDs of
// @kubernetes-models/cert-manager 4.4): types, required
// fields, enums, patterns and ranges. Those schemas let unknown fields through (the typed models
// refuse them at compile time instead) and do not check object names, so names are checked here.
import { stringify } from "yaml";
import type { K8sObject, RenderedFile } from "./render/types.js";

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$/;

/** Kinds whose names become DNS labels (a Service's name is a host name). */
const LABEL_NAMED = new Set(["Service", "Namespace", "StatefulSet"]);

export function describeObject(o: K8sObject): string {
  return `${o.kind} ${o.metadata?.namespace ? `${o.metadata.namespace}/` : ""}${o.metadata?.name ?? "(no name)"}`;
}

/** The problems of one object: empty when it is valid. */
export function objectProblems(o: K8sObject): string[] {
  const p: string[] = [];
  try {
    o.validate();
  } catch (err) {
    p.push(`${describeObject(o)}: ${(err as Error).message}`);
  }
  const name = o.metadata?.name;
  if (!name) p.push(`${describeObject(o)}: no metadata.name`);
  else if (!(LABEL_NAMED.has(o.kind) ? DNS_LABEL : DNS_SUBDOMAIN).test(name))
    p.push(
      `${describeObject(o)}: the name is not a valid ${LABEL_NAMED.has(o.kind) ? "DNS label" : "DNS subdomain"}`,
    );
  const ns = o.metadata?.namespace;
  if (ns !== undefined && !DNS_LABEL.test(ns))
    p.push(`${describeObject(o)}: the namespace is not a DNS label`);
  const labels = (o.toJSON() as { metadata?: { labels?: Record<string, string> } }).metadata?.labels ?? {};
  for (const [k, v] of Object.entries(labels))
    if (!LABEL_VALUE.test(v))
      p.push(`${describeObject(o)}: the label ${k} has the invalid value ${JSON.stringify(v)}`);
  return p;
}

/** Every problem of every object, and objects that share a kind, namespace and name. */
export function validateFiles(files: RenderedFile[]): string[] {
  const p: string[] = [];
  const seen = new Set<string>();
  for (const f of files) {
    for (const o of f.objects) {
      p.push(...objectProblems(o).map((x) => `${f.name}: ${x}`));
      const id = `${o.apiVersion}/${describeObject(o)}`;
      if (seen.has(id)) p.push(`${f.name}: ${describeObject(o)} is rendered twice`);
      seen.add(id);
    }
  }
  return p;
}

export const HEADER = "# Rendered by `callplane render`";

/** One file's text: a header naming its source, then one YAML document per object. */
export function fileText(f: RenderedFile, source: string): string {
  const docs = f.objects.map((o) => stringify(o.toJSON(), { lineWidth: 0 }).trimEnd());
  return `${HEADER} from ${source}. Do not edit: change the environment file and render again.\n---\n${docs.join("\n---\n")}\n`;
}
