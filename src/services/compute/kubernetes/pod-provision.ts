// One attempt at making an instance's pod: the version's secrets from the API, the instance type
// the deployment names resolved against what this cluster offers, the objects of the pod contract
// built (pod-spec.ts) and made with the pod's worker identity as one transaction
// (worker-identity.ts: a failure leaves nothing). The instance (pod-instance.ts) retries a failed
// attempt with backoff, as a new instance with a new id once objects were tried.
import type { KubeClient } from "../../../lib/kube/index.js";
import type { Logger } from "../../../lib/log.js";
import type { ComputeApiClient } from "../api-client.js";
import type { DesiredDeployment } from "../deployment.js";
import type { FetchedSecrets } from "../secrets.js";
import type { WorkerSettings } from "../worker-env.js";
import type { ClusterInstanceTypes } from "./instance-types.js";
import { buildInstanceObjects, type KubePod } from "./pod-spec.js";
import { WorkerIdentity } from "./worker-identity.js";

/** What provisioning reads of what every instance of the backend shares. */
export interface ProvisionContext {
  client: KubeClient;
  namespace: string;
  clusterId: string;
  workerImage: string;
  gpuResource: string;
  terminationGraceSeconds: number;
  worker: WorkerSettings;
  workerNatsEnv(): Record<string, string>;
  instanceTypes: ClusterInstanceTypes;
  api: ComputeApiClient;
  logger: Logger;
}

export interface ProvisionTarget {
  instanceId: string;
  podName: string;
  deployment: DesiredDeployment;
}

export type ProvisionAttempt =
  | {
      outcome: "made";
      pod: KubePod;
      identity: WorkerIdentity;
      saUid: string;
      secretsRevision: number;
      instanceType: string;
    }
  | {
      outcome: "waiting";
      status: "STARTING" | "ERRORED";
      message: string;
      /** Objects were tried: the next attempt is a new instance, with a new id. */
      freshId: boolean;
    }
  | { outcome: "aborted" };

async function fetchSecrets(
  ctx: ProvisionContext,
  t: ProvisionTarget,
): Promise<Pick<FetchedSecrets, "revision" | "values">> {
  const d = t.deployment;
  if (!d.secretsRevision) return { revision: 0, values: {} };
  const fetched = await ctx.api.secrets(d.functionId, d.versionId);
  if (fetched.unreadable.length)
    ctx.logger.warn(
      { instanceId: t.instanceId, function: d.name, secrets: fetched.unreadable.map((u) => u.name) },
      "some secrets of this version cannot be decrypted; the instance gets the others (see the API log)",
    );
  return fetched;
}

/** Makes the pod and its identity, or says why not (and what the instance's status is meanwhile). */
export async function provisionAttempt(
  ctx: ProvisionContext,
  t: ProvisionTarget,
  signal: AbortSignal,
): Promise<ProvisionAttempt> {
  const spec = t.deployment.specs[0];
  let secrets: Pick<FetchedSecrets, "revision" | "values">;
  try {
    secrets = await fetchSecrets(ctx, t);
  } catch (err) {
    return {
      outcome: "waiting",
      status: "STARTING",
      message: `waiting for the API to give the instance its secrets: ${(err as Error).message}`,
      freshId: false,
    };
  }
  const type = ctx.instanceTypes.resolve(spec.gpu, spec.instanceType);
  if (!type) {
    const offered = ctx.instanceTypes.current.map((t) => `${t.name} (${t.gpu})`).join(", ") || "none";
    return {
      outcome: "waiting",
      status: "ERRORED",
      message: `this cluster does not offer instance type ${spec.instanceType} with gpu ${spec.gpu} (it offers ${offered}); no pod was created; retrying`,
      freshId: false,
    };
  }
  if (signal.aborted) return { outcome: "aborted" };
  const identity = new WorkerIdentity(ctx.client, ctx.namespace, t.podName, ctx.logger);
  try {
    const objects = buildInstanceObjects({
      instanceId: t.instanceId,
      namespace: ctx.namespace,
      clusterId: ctx.clusterId,
      deployment: t.deployment,
      instanceType: type,
      gpuResource: ctx.gpuResource,
      terminationGraceSeconds: ctx.terminationGraceSeconds,
      workerImage: ctx.workerImage,
      worker: ctx.worker,
      workerNatsEnv: ctx.workerNatsEnv(),
      secrets,
    });
    const made = await identity.provision(objects, signal);
    return {
      outcome: "made",
      pod: made.pod,
      identity,
      saUid: made.serviceAccount.metadata.uid,
      secretsRevision: secrets.revision,
      instanceType: type.name,
    };
  } catch (err) {
    if (signal.aborted) return { outcome: "aborted" };
    ctx.logger.warn(
      {
        instanceId: t.instanceId,
        pod: t.podName,
        function: t.deployment.name,
        err: (err as Error).message,
      },
      "could not create the pod and its identity; nothing of it is left, retrying",
    );
    return {
      outcome: "waiting",
      status: "ERRORED",
      message: `could not create the pod and its worker identity, so nothing runs: ${(err as Error).message}; retrying`,
      freshId: true,
    };
  }
}
