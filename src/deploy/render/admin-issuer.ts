// 21-admin-issuer.yaml: the admin token issuer proxy, which holds the issuer's private key alone,
// and the operator credential it asks for before it mints (the Secret callplane-issuer-operator,
// which the operator reads with kubectl: docs/kubernetes.md).
import { MOUNTS, SECRETS, SERVICES, WORKLOADS } from "../layout.js";
import type { RenderContext } from "./context.js";
import { baseVolumes, container, podSpec, secretVolume } from "./pod.js";
import type { K8sObject } from "./types.js";
import { deployment, service, serviceAccount } from "./workload.js";

export function renderAdminIssuer(k: RenderContext): K8sObject[] {
  const w = WORKLOADS.issuer;
  const base = baseVolumes();
  const spec = podSpec(
    k,
    w,
    [
      container(k, w, {
        ports: [{ name: "http", containerPort: k.plan.ports.issuer }],
        mounts: [
          ...base.mounts,
          { name: "issuer-key", mountPath: MOUNTS.issuerKey, readOnly: true },
          { name: "issuer-operator", mountPath: MOUNTS.issuerOperator, readOnly: true },
        ],
        probePort: "http",
      }),
    ],
    [
      ...base.volumes,
      secretVolume(
        k,
        "issuer-key",
        SECRETS.issuerKey,
        ["admin-issuer.key.pem"],
        w,
        "the admin issuer's key pair (the issuer reads only the private key)",
      ),
      secretVolume(
        k,
        "issuer-operator",
        SECRETS.issuerOperator,
        ["issuer-operator.secret"],
        w,
        "the operator credential the admin issuer asks for (Authorization: Bearer) before it mints a token; `callplane init --operator-credential <file>` presents it",
      ),
    ],
  );
  return [
    serviceAccount(k, w),
    service(k, SERVICES.issuer, w, [{ name: "http", port: k.plan.ports.issuer }]),
    deployment(k, w, spec, { replicas: 1 }),
  ];
}
