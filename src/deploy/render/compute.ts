// 40-compute.yaml: the compute agent, one pod, and the Role in the workers' namespace that lets it
// start and stop function instances there.
import { Role, RoleBinding } from "kubernetes-models/rbac.authorization.k8s.io/v1";
import { MOUNTS, TLS_SECRETS, WORKLOADS } from "../layout.js";
import type { RenderContext } from "./context.js";
import { baseVolumes, caVolume, container, podSpec, tlsVolume, tokenVolume } from "./pod.js";
import type { K8sObject } from "./types.js";
import { deployment, serviceAccount } from "./workload.js";

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
  const role = new Role({
    metadata: k.meta(w.name, w, k.workerNs),
    rules: [
      {
        apiGroups: [""],
        resources: ["pods"],
        verbs: ["get", "list", "watch", "create", "delete", "patch"],
      },
      { apiGroups: [""], resources: ["pods/log"], verbs: ["get"] },
      {
        apiGroups: [""],
        resources: ["secrets"],
        verbs: ["get", "list", "watch", "create", "update", "patch", "delete"],
      },
      { apiGroups: [""], resources: ["events"], verbs: ["create", "patch"] },
    ],
  });
  const binding = new RoleBinding({
    metadata: k.meta(w.name, w, k.workerNs),
    roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: w.name },
    subjects: [{ kind: "ServiceAccount", name: w.name, namespace: k.ns }],
  });
  return [
    serviceAccount(k, w),
    role,
    binding,
    // one agent: two would both start instances for the same deployments
    deployment(k, w, spec, { replicas: 1, recreate: true }),
  ];
}
