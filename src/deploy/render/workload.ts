// The objects that run and reach a workload: its ServiceAccount, Deployment (with a disruption
// budget and an autoscaler when it runs more than one pod) and Services.
import { Deployment } from "kubernetes-models/apps/v1";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { Service, ServiceAccount, type IPodSpec } from "kubernetes-models/v1";
import type { Config } from "../../lib/config/index.js";
import type { Workload } from "../layout.js";
import type { RenderContext } from "./context.js";
import { podAnnotations } from "./pod.js";
import type { K8sObject } from "./types.js";

export function serviceAccount(k: RenderContext, w: Workload): ServiceAccount {
  return new ServiceAccount({ metadata: k.meta(w.name, w), automountServiceAccountToken: false });
}

export function deployment(
  k: RenderContext,
  w: Workload,
  spec: IPodSpec,
  opts: {
    replicas: number;
    autoscaled?: boolean;
    recreate?: boolean;
    annotations?: Record<string, string>;
  },
): Deployment {
  return new Deployment({
    metadata: k.meta(w.name, w),
    spec: {
      // an autoscaler owns the count: a replica count here would reset it at every apply
      ...(opts.autoscaled ? {} : { replicas: opts.replicas }),
      revisionHistoryLimit: 5,
      selector: { matchLabels: k.selector(w) },
      strategy: opts.recreate
        ? { type: "Recreate" }
        : { type: "RollingUpdate", rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } },
      template: {
        metadata: { labels: k.labels(w), annotations: podAnnotations(k, w, opts.annotations) },
        spec,
      },
    },
  });
}

/** A disruption budget for what runs more than one pod: a drain takes one at a time. */
export function pdb(k: RenderContext, w: Workload): PodDisruptionBudget {
  return new PodDisruptionBudget({
    metadata: k.meta(w.name, w),
    spec: { maxUnavailable: 1, selector: { matchLabels: k.selector(w) } },
  });
}

export function hpa(
  k: RenderContext,
  w: Workload,
  a: Config["invocation"]["autoscaling"],
  kind = "Deployment",
): HorizontalPodAutoscaler {
  return new HorizontalPodAutoscaler({
    metadata: k.meta(w.name, w),
    spec: {
      scaleTargetRef: { apiVersion: "apps/v1", kind, name: w.name },
      minReplicas: a.minReplicas,
      maxReplicas: a.maxReplicas,
      metrics: [
        {
          type: "Resource",
          resource: {
            name: "cpu",
            target: { type: "Utilization", averageUtilization: a.targetCPUUtilizationPercentage },
          },
        },
      ],
    },
  });
}

/** Deployment, and with more than one replica (or an autoscaler) its disruption budget and HPA. */
export function scaled(
  k: RenderContext,
  w: Workload,
  spec: IPodSpec,
  replicas: number,
  autoscaling?: Config["invocation"]["autoscaling"],
  annotations?: Record<string, string>,
): K8sObject[] {
  const auto = autoscaling?.enabled === true;
  const out: K8sObject[] = [deployment(k, w, spec, { replicas, autoscaled: auto, annotations })];
  if (replicas > 1 || (auto && autoscaling.minReplicas > 1)) out.push(pdb(k, w));
  if (auto) out.push(hpa(k, w, autoscaling));
  return out;
}

export function service(
  k: RenderContext,
  name: string,
  w: Workload,
  ports: Array<{ name: string; port: number }>,
  opts: { headless?: boolean; type?: "ClusterIP" | "LoadBalancer" | "NodePort" } = {},
): Service {
  return new Service({
    metadata: k.meta(name, w),
    spec: {
      ...(opts.headless
        ? // pod DNS names stay while a pod drains, so its in-flight callbacks still reach it
          { clusterIP: "None", publishNotReadyAddresses: true }
        : { type: opts.type ?? "ClusterIP" }),
      selector: k.selector(w),
      ports: ports.map((p) => ({ name: p.name, port: p.port, targetPort: p.name, protocol: "TCP" })),
    },
  });
}
