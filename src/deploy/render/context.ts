// The facts every component's manifests are made from, worked out once per render: the checked
// plan, the namespaces, the image, the pods' copy of the environment file and its hash, which
// optional parts are on, the Secrets referenced so far, and the names and labels objects carry.
// Each component module is a function of this context (see index.ts for the order they run in).
import { createHash } from "node:crypto";
import { stringify } from "yaml";
import type { Config } from "../../lib/config/index.js";
import type { ClusterPlan } from "../cluster-config.js";
import { MANAGED_BY, PART_OF, type Workload } from "../layout.js";
import { SecretRegistry } from "./secrets.js";

export const sha256 = (text: string) => createHash("sha256").update(text).digest("hex");

export type Labels = Record<string, string>;

export class RenderContext {
  readonly ns: string;
  readonly workerNs: string;
  readonly image: string;
  readonly configText: string;
  readonly configHash: string;
  readonly secrets = new SecretRegistry();
  readonly proxyOn: boolean;
  readonly upstreamTls: boolean;
  readonly grpcOn: boolean;
  /** compute.backend kubernetes: instances run as pods, guarded by the admission webhook. */
  readonly kubeBackend: boolean;

  constructor(
    readonly c: Config,
    readonly plan: ClusterPlan,
    readonly version: string,
  ) {
    this.ns = plan.names.namespace;
    this.workerNs = c.kubernetes.workerNamespace;
    this.image = c.kubernetes.image || `callplane:${version}`;
    this.configText = [
      "# The environment file as callplane's pods read it (rendered by `callplane render`): the file you",
      "# rendered from, with listen addresses, URLs and file paths set for the cluster, and without the",
      "# keys only the manifests read. Edit the source file and render again; do not edit this copy.",
      stringify(plan.document, { sortMapEntries: true }).trimEnd(),
      "",
    ].join("\n");
    this.configHash = sha256(this.configText);
    this.proxyOn = c.workerCallbackProxy.enabled;
    this.upstreamTls = this.proxyOn && c.workerCallbackProxy.invocation.upstreamTls.enabled;
    this.grpcOn = c.grpcproxy.replicaCount > 0;
    this.kubeBackend = c.compute.backend === "kubernetes";
  }

  labels(w: Workload): Labels {
    return {
      "app.kubernetes.io/name": w.name,
      "app.kubernetes.io/instance": w.name,
      "app.kubernetes.io/component": w.component,
      "app.kubernetes.io/part-of": PART_OF,
      "app.kubernetes.io/managed-by": MANAGED_BY,
      "app.kubernetes.io/version": this.version,
    };
  }

  selector(w: Workload): Labels {
    return { "app.kubernetes.io/name": w.name, "app.kubernetes.io/instance": w.name };
  }

  meta(name: string, w?: Workload, namespace = this.ns) {
    return {
      name,
      namespace,
      labels: w
        ? this.labels(w)
        : {
            "app.kubernetes.io/part-of": PART_OF,
            "app.kubernetes.io/managed-by": MANAGED_BY,
            "app.kubernetes.io/version": this.version,
          },
    };
  }
}
