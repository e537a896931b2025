// 41-admission-webhook.yaml (compute.backend kubernetes): the webhook that keeps the worker pods'
// service accounts (nvcf-worker-*) to the compute agent, and its registration with the API server.
//
// The registration covers every pod-bearing kind in every version the cluster serves (a Pod, and
// everything with a pod template: a controller would otherwise make the pod the webhook refuses to
// see made directly) on CREATE and UPDATE, pods/ephemeralcontainers, Secrets (legacy token Secrets)
// and TokenRequests. Its failure policy is Fail: with no
// webhook answering, the API server refuses rather than lets a reserved account through. It is
// limited to the workers' namespace: service accounts are namespaced, so an nvcf-worker-* account
// means something only there, and a webhook that is down then blocks nothing elsewhere in the cluster
// (its own pods, in the control plane's namespace, among them).
import { ValidatingWebhookConfiguration } from "kubernetes-models/admissionregistration.k8s.io/v1";
import { ADMISSION_WEBHOOK_STOP } from "../../lib/config/index.js";
import { ADMISSION_WEBHOOK, MOUNTS, TLS_SECRETS, WORKLOADS } from "../layout.js";
import type { RenderContext } from "./context.js";
import { baseVolumes, container, podSpec, stopSeconds, tlsVolume } from "./pod.js";
import type { K8sObject } from "./types.js";
import { scaled, service, serviceAccount } from "./workload.js";

/** The resources the webhook is registered for, by API group: every kind that carries a pod spec. */
export const POD_BEARING_RESOURCES = [
  { apiGroups: [""], resources: ["pods", "replicationcontrollers", "podtemplates"] },
  { apiGroups: ["apps"], resources: ["deployments", "statefulsets", "replicasets", "daemonsets"] },
  { apiGroups: ["batch"], resources: ["jobs", "cronjobs"] },
] as const;

/**
 * The core group's other resources it is registered for, each with the kind the review reads
 * (review.ts's OTHER_REVIEWED: the unit test checks the two agree): TokenRequests, ephemeral
 * containers (1.20 serves pods/ephemeralcontainers behind a feature gate; registered all the same,
 * for the cluster that turns it on) and Secrets (legacy service-account token Secrets).
 */
export const OTHER_RESOURCES = [
  { resource: "serviceaccounts/token", operations: ["CREATE"] },
  { resource: "pods/ephemeralcontainers", operations: ["UPDATE"] },
  { resource: "secrets", operations: ["CREATE", "UPDATE"] },
] as const;

/** The registration's name: cluster-wide, so one per control plane (its namespace in the name). */
export function webhookConfigurationName(k: RenderContext): string {
  return `${ADMISSION_WEBHOOK.service}-${k.ns}`;
}

export function renderAdmissionWebhook(k: RenderContext): K8sObject[] {
  const w = WORKLOADS.webhook;
  const base = baseVolumes();
  const spec = podSpec(
    k,
    w,
    [
      container(k, w, {
        ports: [{ name: "https", containerPort: k.plan.ports.webhook }],
        mounts: [...base.mounts, { name: "webhook-tls", mountPath: MOUNTS.webhookTls, readOnly: true }],
        probePort: "https",
        probeScheme: "HTTPS",
      }),
    ],
    [...base.volumes, tlsVolume("webhook-tls", TLS_SECRETS.webhook)],
    {
      graceSeconds: stopSeconds(
        ADMISSION_WEBHOOK_STOP.drainDelaySeconds,
        ADMISSION_WEBHOOK_STOP.graceSeconds,
      ),
      spread: true,
    },
  );
  const meta = k.meta(webhookConfigurationName(k), w);
  const registration = new ValidatingWebhookConfiguration({
    metadata: {
      name: meta.name,
      labels: meta.labels,
      // cert-manager's CA injector writes the CA of the webhook's Certificate into caBundle
      annotations: { "cert-manager.io/inject-ca-from": `${k.ns}/${ADMISSION_WEBHOOK.certificate}` },
    },
    webhooks: [
      {
        name: ADMISSION_WEBHOOK.webhookName,
        admissionReviewVersions: ["v1"],
        sideEffects: "None",
        failurePolicy: "Fail",
        // an object sent through another version of its API is converted, and reviewed all the same
        matchPolicy: "Equivalent",
        timeoutSeconds: 5,
        clientConfig: {
          service: {
            namespace: k.ns,
            name: ADMISSION_WEBHOOK.service,
            path: ADMISSION_WEBHOOK.path,
            port: ADMISSION_WEBHOOK.servicePort,
          },
        },
        // Kubernetes 1.21 and later label every namespace with its name; render labels the workers'
        // namespace itself, for 1.20 (namespaces.ts)
        namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": k.workerNs } },
        rules: [
          ...POD_BEARING_RESOURCES.map((r) => ({
            apiGroups: [...r.apiGroups],
            apiVersions: ["*"],
            operations: ["CREATE" as const, "UPDATE" as const],
            resources: [...r.resources],
            scope: "Namespaced" as const,
          })),
          ...OTHER_RESOURCES.map((r) => ({
            apiGroups: [""],
            apiVersions: ["v1"],
            operations: [...r.operations],
            resources: [r.resource],
            scope: "Namespaced" as const,
          })),
        ],
      },
    ],
  });
  return [
    serviceAccount(k, w),
    service(k, ADMISSION_WEBHOOK.service, w, [{ name: "https", port: ADMISSION_WEBHOOK.servicePort }]),
    ...scaled(k, w, spec, k.c.admissionWebhook.replicas),
    registration,
  ];
}
