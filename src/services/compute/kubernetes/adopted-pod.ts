// A pod the agent finds at its start is adopted as an instance again (backend.ts): the deployment
// it belongs to is read back from the labels and annotations pod-spec.ts wrote on it.
import type { IPod } from "kubernetes-models/v1";
import type { DesiredDeployment } from "../deployment.js";
import { ANNOTATIONS, LABELS } from "./pod-spec.js";

/** The deployment an adopted pod belongs to, as far as its labels and annotations say. */
export function deploymentOfPod(pod: IPod): DesiredDeployment {
  const labels = pod.metadata?.labels ?? {};
  const ann = pod.metadata?.annotations ?? {};
  const inference = pod.spec?.containers.find((c) => c.name === "inference");
  const port = inference?.ports?.[0]?.containerPort ?? 0;
  // only what reports and secrets refreshes use is known; the rest is never read for a running pod
  return {
    deploymentId: labels[LABELS.deploymentId] ?? "",
    functionId: labels[LABELS.functionId] ?? "",
    versionId: labels[LABELS.versionId] ?? "",
    name: ann[ANNOTATIONS.functionName] ?? "",
    ncaId: labels[LABELS.ncaId] ?? "",
    specs: [
      {
        gpu: ann[ANNOTATIONS.gpuName] ?? "",
        instanceType: ann[ANNOTATIONS.instanceType] ?? "",
        minInstances: 1,
        maxInstances: 1,
        maxRequestConcurrency: 1,
      },
    ],
    spec: {
      inferenceUrl: "",
      inferencePort: port,
      containerImage: inference?.image ?? "",
      containerEnvironment: [],
      health: { protocol: "HTTP", uri: "", port, timeout: "", expectedStatusCode: 200 },
    },
  };
}
