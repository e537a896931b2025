// 00-namespaces.yaml and 01-config.yaml: the control plane's and the workers' namespaces, and the
// ConfigMaps the pods read their configuration from (the pods' copy of the environment file,
// nats-server's configuration when the NATS StatefulSet is rendered, and the worker callback proxy's
// HAProxy configuration when the proxy is on).
import { ConfigMap, Namespace } from "kubernetes-models/v1";
import { HAPROXY, WORKLOADS } from "../layout.js";
import { haproxyConfigData } from "./callback-proxy.js";
import type { RenderContext } from "./context.js";
import { natsConfText } from "./nats.js";
import type { K8sObject } from "./types.js";

/**
 * The label Kubernetes 1.21 and later put on every namespace (its name), set here for 1.20, which
 * does not: the network policies select the control plane's namespace by it, and the admission
 * webhook's registration the workers'.
 */
export const NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name";

export function renderNamespaces(k: RenderContext): K8sObject[] {
  return [
    new Namespace({
      metadata: { name: k.ns, labels: { ...k.meta(k.ns).labels, [NAMESPACE_NAME_LABEL]: k.ns } },
    }),
    new Namespace({
      metadata: {
        name: k.workerNs,
        labels: {
          ...k.meta(k.workerNs).labels,
          "callplane.io/role": "workers",
          [NAMESPACE_NAME_LABEL]: k.workerNs,
        },
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
  if (k.proxyOn)
    out.push(
      new ConfigMap({
        metadata: k.meta(HAPROXY.configMap, WORKLOADS.proxy),
        data: haproxyConfigData(k),
      }),
    );
  return out;
}
