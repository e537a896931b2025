// 40-compute.yaml: the compute agent, one pod; with compute.backend kubernetes, the Role in the
// workers' namespace that lets it run function instances there as pods (each with its own service
// account, role, binding and Secrets), and the ClusterRole that lets it read the nodes (the
// cluster's instance types); and the agent's own projected token (audience
// nvcf-icms:<clusterId>), from which it finds the cluster's issuer and with which it proves the
// cluster when it registers the cluster's keys with the API. With the local backend the agent never
// calls the API server, so it gets no permission and no token at all.
import {
  ClusterRole,
  ClusterRoleBinding,
  Role,
  RoleBinding,
  type IPolicyRule,
} from "kubernetes-models/rbac.authorization.k8s.io/v1";
import { MOUNTS, TLS_SECRETS, WORKLOADS } from "../layout.js";
import type { RenderContext } from "./context.js";
import { baseVolumes, caVolume, container, podSpec, tlsVolume, tokenVolume } from "./pod.js";
import type { K8sObject } from "./types.js";
import { deployment, serviceAccount } from "./workload.js";

/**
 * Exactly what the agent does in the workers' namespace, and nothing else (the RBAC of upstream's
 * agent is broader): pods it creates, watches and deletes; per pod a service account, an empty role
 * and a binding (created, given an owner reference by patch, deleted on purge) and two Secrets (the
 * worker's credential environment and the function's secrets.json). Creating a RoleBinding needs no
 * `bind` verb here: the role it binds grants nothing, which the agent already holds.
 */
export const COMPUTE_AGENT_RULES = [
  { apiGroups: [""], resources: ["pods"], verbs: ["get", "list", "watch", "create", "delete"] },
  { apiGroups: [""], resources: ["serviceaccounts"], verbs: ["list", "create", "delete", "patch"] },
  {
    apiGroups: ["rbac.authorization.k8s.io"],
    resources: ["roles", "rolebindings"],
    verbs: ["list", "create", "delete", "patch"],
  },
  { apiGroups: [""], resources: ["secrets"], verbs: ["list", "create", "patch", "delete"] },
] as const satisfies readonly IPolicyRule[];

/** Cluster-wide, read only: the nodes' GPU labels, from which the instance types are found. */
export const COMPUTE_AGENT_CLUSTER_RULES = [
  { apiGroups: [""], resources: ["nodes"], verbs: ["list", "watch"] },
] as const satisfies readonly IPolicyRule[];

/**
 * Where the agent's identity token is mounted: compute.kubernetes.identityTokenFile's default is
 * `<this>/token` (services/compute/kubernetes/cluster-keys.ts; a test checks they agree).
 */
export const AGENT_IDENTITY_DIR = "/var/run/secrets/callplane/identity";
/**
 * Its life: the kubelet renews it at 80 %, and the agent keeps the token before as a second proof
 * while it lives, so a key rotation the agent had no look at for up to this long still proves.
 */
export const AGENT_IDENTITY_SECONDS = 3600;

const rules = (list: readonly IPolicyRule[]): IPolicyRule[] =>
  list.map((r) => ({
    apiGroups: [...(r.apiGroups ?? [])],
    resources: [...(r.resources ?? [])],
    verbs: [...r.verbs],
  }));

export function renderCompute(k: RenderContext): K8sObject[] {
  const w = WORKLOADS.compute;
  const c = k.c;
  const base = baseVolumes();
  const tokens = tokenVolume(k, w, ["compute"]);
  const mounts = [...base.mounts, tokens.mount, { name: "stack-ca", mountPath: MOUNTS.ca, readOnly: true }];
  const volumes = [...base.volumes, tokens.volume, caVolume()];
  if (k.proxyOn && k.plan.frontendFromStackCa) {
    // the local backend hands its workers the CA of the proxy's certificate when it is the stack's
    volumes.push(tlsVolume("frontend-ca", TLS_SECRETS.proxyFrontend, ["tls.crt"]));
    mounts.push({ name: "frontend-ca", mountPath: MOUNTS.proxyFrontend, readOnly: true });
  }
  if (k.kubeBackend) {
    volumes.push({
      name: "identity-token",
      projected: {
        sources: [
          {
            serviceAccountToken: {
              audience: `nvcf-icms:${c.compute.workerIdentity.clusterId}`,
              expirationSeconds: AGENT_IDENTITY_SECONDS,
              path: "token",
            },
          },
        ],
      },
    });
    mounts.push({ name: "identity-token", mountPath: AGENT_IDENTITY_DIR, readOnly: true });
  }
  const spec = podSpec(
    k,
    w,
    [
      container(k, w, {
        ports: [{ name: "http", containerPort: k.plan.ports.compute }],
        mounts,
        probePort: "http",
        // readiness follows the last sync with the API; liveness must not kill it for an API outage
        livenessFailures: 30,
      }),
    ],
    volumes,
    { graceSeconds: Math.ceil(c.compute.stopGraceSeconds) + 15 },
  );
  // The kubernetes backend talks to the API server as its own service account: the one pod of the
  // control plane that gets the account's token mounted (compute.kubernetes.tokenFile's default)
  if (k.kubeBackend) spec.automountServiceAccountToken = true;
  // one agent: two would both start instances for the same deployments
  const agent = deployment(k, w, spec, { replicas: 1, recreate: true });
  if (!k.kubeBackend) return [serviceAccount(k, w), agent];
  const subject = { kind: "ServiceAccount", name: w.name, namespace: k.ns };
  // cluster-scoped: one per control plane, so its namespace is in the name
  const clusterName = `callplane-${k.ns}-${w.name}`;
  const clusterMeta = { name: clusterName, labels: k.labels(w) };
  return [
    serviceAccount(k, w),
    new Role({ metadata: k.meta(w.name, w, k.workerNs), rules: rules(COMPUTE_AGENT_RULES) }),
    new RoleBinding({
      metadata: k.meta(w.name, w, k.workerNs),
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: w.name },
      subjects: [subject],
    }),
    new ClusterRole({ metadata: clusterMeta, rules: rules(COMPUTE_AGENT_CLUSTER_RULES) }),
    new ClusterRoleBinding({
      metadata: clusterMeta,
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name: clusterName },
      subjects: [subject],
    }),
    agent,
  ];
}
