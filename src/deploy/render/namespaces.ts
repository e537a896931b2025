// 00-namespaces.yaml and 01-config.yaml: the control plane's and the workers' namespaces, and the
// ConfigMaps the pods read their configuration from (the pods' copy of the environment file, and
// nats-server's configuration when the NATS StatefulSet is rendered).
import { ConfigMap, Namespace } from "kubernetes-models/v1";
import { WORKLOADS } from "../layout.js";
import type { RenderContext } from "./context.js";
import { natsConfText } from "./nats.js";
import type { K8sObject } from "./types.js";

export function renderNamespaces(k: RenderContext): K8sObject[] {
  return [
    new Namespace({ metadata: { name: k.ns, labels: k.meta(k.ns).labels } }),
    new Namespace({
      metadata: {
        name: k.workerNs,
        labels: { ...k.meta(k.workerNs).labels, "callplane.io/role": "workers" },
      },
    }),
  ];
}

export function renderConfigMaps(k: RenderContext): K8sObject[] {
  const out: K8sObject[] = [
    new ConfigMap({ metadata: k.meta("callplane-config"), data: { "callplane.yaml": k.configText } }),
  ];
  if (k.c.nats.server.enabled)
    out.push(
      new ConfigMap({
        metadata: k.meta("nats-config", WORKLOADS.nats),
        data: { "nats.conf": natsConfText(k) },
      }),
    );
  return out;
}
