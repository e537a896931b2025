// Deleting an instance's pod with its grace, retried with backoff until the API server takes the
// delete or answers that the pod is gone (the instance stays tracked until then: pod-instance.ts).
// The delete names the pod's uid: a pod of the same name that is not this one is never deleted.
import { setTimeout as sleep } from "node:timers/promises";
import { isConflict, isNotFound, type KubeClient } from "../../../lib/kube/index.js";
import type { Logger } from "../../../lib/log.js";

export interface PodDeletion {
  client: KubeClient;
  logger: Logger;
  restart: { initialMs: number; maxMs: number };
  /** The pod's API path, and its uid when known (a precondition of the delete). */
  path: string;
  uid: string | undefined;
  graceSeconds: number;
  /** What the log lines name. */
  instanceId: string;
  podName: string;
  functionName: string;
  /** Whether the pod is known to be gone already (the watch saw it go): nothing left to delete. */
  isGone(): boolean;
  /** The agent closes: the delete is given up and the pod left to the agent's next start. */
  released: AbortSignal;
}

/**
 * Deletes the pod, retried with backoff until the API server takes the delete ("deleted") or the
 * pod is found gone ("gone"), or the agent closes first ("released").
 */
export async function deletePod(d: PodDeletion): Promise<"deleted" | "gone" | "released"> {
  let delay = d.restart.initialMs;
  for (let attempt = 1; ; attempt++) {
    if (d.isGone()) return "gone";
    if (d.released.aborted) return "released";
    try {
      await d.client.delete(d.path, {
        gracePeriodSeconds: d.graceSeconds,
        tolerateMissing: false,
        ...(d.uid ? { preconditionUid: d.uid } : {}),
      });
      d.logger.info(
        { instanceId: d.instanceId, pod: d.podName, function: d.functionName, graceSeconds: d.graceSeconds },
        "pod deleted",
      );
      return "deleted";
    } catch (err) {
      // gone already; or (a Conflict on the uid precondition) a pod of that name that is not this one
      if (isNotFound(err) || isConflict(err)) return "gone";
      d.logger.warn(
        {
          instanceId: d.instanceId,
          pod: d.podName,
          attempt,
          retryInMs: delay,
          err: (err as Error).message,
        },
        "could not delete the pod; retrying (the instance stays tracked until its pod is deleted)",
      );
    }
    await sleep(delay, undefined, { signal: d.released }).catch(() => undefined);
    delay = Math.min(delay * 2, d.restart.maxMs);
  }
}
