// What only `callplane render` reads (Kubernetes); the local stack ignores it: the field types every
// service section carries for its pods (annotations, resources, an autoscaler), the ingress and
// kubernetes sections, and the rule on the autoscalers' bounds.
import { z } from "zod";
import { dnsName, section } from "./fields.js";

/** Annotation keys the rendered manifests set themselves: an operator's value would be overwritten. */
export const RESERVED_ANNOTATIONS = {
  exact: ["checksum/config"],
  prefixes: ["nvcf.nvidia.com/nats-worker-auth"],
} as const;

/** Where an annotation key is reserved, the sentence that says why; undefined when it is free. */
export function reservedAnnotation(key: string): string | undefined {
  if ((RESERVED_ANNOTATIONS.exact as readonly string[]).includes(key))
    return "it is the hash of the pod's configuration, which the rendered manifests set so that a configuration change rolls the pods";
  if (RESERVED_ANNOTATIONS.prefixes.some((p) => key.startsWith(p)))
    return "keys starting with nvcf.nvidia.com/nats-worker-auth are reserved for the auth callout's restart on a worker auth change";
  return undefined;
}

const annotationKey =
  /^(?:(?=[^/]{1,253}\/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;

/**
 * A service's pod annotations (the seed's `<service>.podAnnotations`): passed to its pods unchanged;
 * values must be strings, and keys the manifests manage themselves are refused by name.
 */
export const podAnnotations = () =>
  z
    .record(z.string(), z.unknown())
    .superRefine((rec, ctx) => {
      for (const [key, value] of Object.entries(rec)) {
        const reserved = reservedAnnotation(key);
        if (reserved) {
          ctx.addIssue({
            code: "custom",
            path: [key],
            message: `the annotation key "${key}" is reserved: ${reserved}. Remove it`,
          });
        } else if (!annotationKey.test(key)) {
          ctx.addIssue({
            code: "custom",
            path: [key],
            message: `"${key}" is not a Kubernetes annotation key ([prefix/]name: a DNS subdomain prefix, a name of at most 63 letters, digits, "-", "_" and ".")`,
          });
        } else if (typeof value !== "string") {
          ctx.addIssue({
            code: "custom",
            path: [key],
            message: `the value of annotation "${key}" must be a string, not ${value === null ? "null" : typeof value}: quote it (${JSON.stringify(String(value))})`,
          });
        }
      }
    })
    .transform((rec) => rec as Record<string, string>)
    .default({});

const quantity = z
  .string()
  .regex(
    /^(\d+(\.\d+)?|\.\d+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/,
    "must be a Kubernetes quantity, for example 250m, 1, 512Mi or 1Gi",
  );
/** Container resources of a service's pods: requests for scheduling, a memory limit, no CPU limit. */
export const resources = (cpu: string, memory: string, memoryLimit: string) =>
  section({
    requests: section({ cpu: quantity.default(cpu), memory: quantity.default(memory) }),
    limits: section({ memory: quantity.default(memoryLimit) }),
  });
/** A HorizontalPodAutoscaler for a front-door service (off unless asked for). */
export const autoscaling = () =>
  section({
    enabled: z.boolean().default(false),
    minReplicas: z.number().int().min(1).max(250).default(2),
    maxReplicas: z.number().int().min(1).max(250).default(10),
    targetCPUUtilizationPercentage: z.number().int().min(1).max(100).default(80),
  });
export const k8sName = z
  .string()
  .regex(
    /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/,
    "must be a Kubernetes name: lower-case letters, digits and dashes, at most 63",
  );

export const ingressSection = section({
  gatewayApi: section({
    enabled: z.boolean().default(true),
    gatewayClassName: k8sName.default("eg"),
    domain: dnsName.default("callplane.example.com"),
    tls: section({ secretName: k8sName.default("callplane-gateway-tls") }),
    routes: section({
      grpcWorker: section({
        enabled: z.boolean().default(false),
        listenerName: k8sName.default("worker-tcp"),
      }),
      nats: section({ enabled: z.boolean().default(true) }),
    }),
  }),
});

export const kubernetesSection = section({
  image: z.string().default(""),
  imagePullPolicy: z.enum(["IfNotPresent", "Always", "Never"]).default("IfNotPresent"),
  natsImage: z.string().min(1).default("nats:2.10.27-alpine"),
  haproxyImage: z.string().min(1).default("haproxy:2.6"),
  workerNamespace: k8sName.default("callplane-workers"),
  nats: section({
    storageSize: quantity.default("10Gi"),
    storageClassName: z.string().default(""),
  }),
});

/** A front door's autoscaler, as the file gives it. */
export type AutoscalingConfig = z.output<ReturnType<typeof autoscaling>>;

/** Every autoscaler's minimum within its maximum. */
export function autoscalingProblems(c: {
  invocation: { autoscaling: AutoscalingConfig };
  grpcproxy: { deployment: { autoscaling: AutoscalingConfig } };
  workerCallbackProxy: { autoscaling: AutoscalingConfig };
}): string[] {
  const p: string[] = [];
  for (const [key, a] of [
    ["invocation.autoscaling", c.invocation.autoscaling],
    ["grpcproxy.deployment.autoscaling", c.grpcproxy.deployment.autoscaling],
    ["workerCallbackProxy.autoscaling", c.workerCallbackProxy.autoscaling],
  ] as const) {
    if (a.minReplicas > a.maxReplicas)
      p.push(`${key}.minReplicas (${a.minReplicas}) is larger than ${key}.maxReplicas (${a.maxReplicas})`);
  }
  return p;
}
