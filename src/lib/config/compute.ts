// The compute agent's section, and its rule on the restart backoff.
import { z } from "zod";
import { cidr, hostPort, seconds, section } from "./fields.js";
import { podAnnotations, resources } from "./kubernetes.js";

export const computeSection = section({
  backend: z.enum(["local", "kubernetes"]).default("local"),
  podAnnotations: podAnnotations(),
  resources: resources("100m", "256Mi", "1Gi"),
  local: section({
    // off: a function could run any command line on the agent's machine (see docs/errors.md)
    allowCommand: z.boolean().default(false),
    // "": the system user callplane-fn when the agent runs as root, else the agent's own user
    runAs: z
      .string()
      .regex(/^$|^[a-z_][a-z0-9_-]*[$]?$/i, "must be empty or a user name (letters, digits, _ and -)")
      .max(32)
      .default(""),
  }),
  kubernetes: section({
    // "": in a pod, the cluster's own API server (KUBERNETES_SERVICE_HOST) and service account
    apiServer: z.string().default(""),
    caFile: z.string().default(""),
    tokenFile: z.string().default(""),
    // "": nats.url (workers in pods usually reach NATS by a cluster DNS name instead)
    workerNatsUrl: z.string().default(""),
    gpuResource: z.string().min(1).default("nvidia.com/gpu"),
    unschedulableSeconds: seconds(300, 86_400),
    terminationGraceSeconds: z.number().int().min(1).max(86_400).default(120),
    // the agent's own projected token, audience nvcf-icms:<clusterId>: where the cluster's issuer is
    // read from, and the proof of the cluster with which it pushes the cluster's keys to the API.
    // "": /var/run/secrets/callplane/identity/token (the rendered agent pod mounts it there)
    identityTokenFile: z.string().default(""),
    // how often the agent looks at the cluster's keys (pushed to the API only when they changed)
    keysRefreshSeconds: seconds(60, 3600),
    // an admin token (scope cluster-management) the agent uses only to enroll its cluster, when the
    // API has no keys of it yet or refuses its proof; "": none (enroll with \`callplane cluster enroll\`)
    enrollmentTokenFile: z.string().default(""),
    // empty: the instance types are found on the cluster's nodes (nvidia.com/gpu.product, .count)
    instanceTypes: z
      .array(
        z.strictObject({
          name: z
            .string()
            .regex(
              /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/,
              "must be letters, digits, dots, dashes and underscores",
            ),
          gpu: z.string().min(1).max(128),
          gpuCount: z.number().int().min(0).max(64),
          nodeSelector: z.record(z.string(), z.string()).default({}),
        }),
      )
      .default([]),
  }),
  secrets: section({
    dir: z.string().default(""),
    env: z.boolean().default(false),
  }),
  listen: hostPort.default("127.0.0.1:8082"),
  instanceNetwork: cidr.default("127.0.3.0/24"),
  syncIntervalSeconds: seconds(2, 600),
  stopGraceSeconds: seconds(10, 600),
  restartBackoff: section({
    initialSeconds: seconds(1, 600),
    maxSeconds: seconds(30, 3600),
  }),
  workerIdentity: section({
    // "" is the default source, never "off": no worker starts without an identity
    tokenSource: z
      .enum(["", "api", "psat"], { error: 'must be "" (the default source), api or psat' })
      .default(""),
    clusterId: z
      .string()
      .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, "must be letters, digits, dots, dashes and underscores")
      .default("local"),
    tokenTtlSeconds: z.number().int().min(30).max(3600).default(900),
  }),
});

export type ComputeConfig = z.output<typeof computeSection>;

export function restartBackoffProblems(c: { compute: ComputeConfig }): string[] {
  const p: string[] = [];
  if (c.compute.restartBackoff.initialSeconds > c.compute.restartBackoff.maxSeconds) {
    p.push("compute.restartBackoff.initialSeconds is larger than compute.restartBackoff.maxSeconds");
  }
  return p;
}

/** The token source fits the backend: pod tokens exist only in pods, API-signed files only locally. */
export function tokenSourceProblems(c: { compute: ComputeConfig }): string[] {
  const { backend, workerIdentity } = c.compute;
  if (backend === "local" && workerIdentity.tokenSource === "psat")
    return [
      "compute.workerIdentity.tokenSource is psat, but compute.backend is local: projected pod tokens exist only on the kubernetes backend; leave it empty (or api)",
    ];
  if (backend === "kubernetes" && workerIdentity.tokenSource === "api")
    return [
      "compute.workerIdentity.tokenSource is api, but compute.backend is kubernetes: pods get their cluster's projected token (psat); leave it empty (or psat)",
    ];
  return [];
}
