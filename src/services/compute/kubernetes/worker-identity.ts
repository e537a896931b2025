// A pod's worker identity and everything it needs, made as one transaction: ServiceAccount, Role,
// RoleBinding, the two Secrets, then the pod, last, so that no pod ever exists without its identity
// (upstream created the pod anyway when the account failed, and never rolled back). Any failure,
// or an abort (the instance was stopped meanwhile), deletes what was made, in reverse order,
// tolerating NotFound. Once the pod exists, the other objects get an owner reference to it, so the
// cluster's garbage collector removes them with the pod even if the agent never gets to. Purging
// deletes binding, role, account and Secrets (after the pod), tolerating NotFound.
import type { IServiceAccount } from "kubernetes-models/v1";
import { isAlreadyExists, kubePaths, type KubeClient, type KubeObject } from "../../../lib/kube/index.js";
import type { Logger } from "../../../lib/log.js";
import {
  identityNameOf,
  ownerReferenceTo,
  secretsSecretOf,
  workerSecretOf,
  type InstanceObjects,
  type KubePod,
} from "./pod-spec.js";

/** The kinds an instance's identity is made of, in the order they are made. */
const STEPS = ["serviceAccount", "role", "roleBinding", "workerSecret", "secretsSecret", "pod"] as const;
type Step = (typeof STEPS)[number];

/** Where each kind lives in namespace `ns` (its collection, or one object by name). */
export const PATHS: Record<Step, (ns: string, name?: string) => string> = {
  serviceAccount: kubePaths.serviceAccounts,
  role: kubePaths.roles,
  roleBinding: kubePaths.roleBindings,
  workerSecret: kubePaths.secrets,
  secretsSecret: kubePaths.secrets,
  pod: kubePaths.pods,
};

/** The order identity objects are deleted in: binding, role, account, then the Secrets. */
export const PURGE_ORDER = [
  "roleBinding",
  "role",
  "serviceAccount",
  "workerSecret",
  "secretsSecret",
] as const;

/** The step a provisioning failed at, and why. */
export class ProvisionError extends Error {
  constructor(
    readonly step: Step,
    cause: unknown,
    readonly leftBehind: string[],
  ) {
    super(
      `${step === "pod" ? "creating the pod" : `creating the ${step}`} failed: ${(cause as Error).message}${
        leftBehind.length
          ? `; could not remove ${leftBehind.join(", ")} (removed at the agent's next start)`
          : ""
      }`,
      { cause },
    );
    this.name = "ProvisionError";
  }
}

export interface Provisioned {
  pod: KubePod;
  serviceAccount: IServiceAccount & { metadata: { uid: string } };
}

export class WorkerIdentity {
  readonly name: string;

  constructor(
    private readonly client: KubeClient,
    private readonly namespace: string,
    readonly podName: string,
    private readonly logger: Logger,
  ) {
    this.name = identityNameOf(podName);
  }

  /** The name of each object of this instance. */
  nameOf(step: Step): string {
    if (step === "pod") return this.podName;
    if (step === "workerSecret") return workerSecretOf(this.podName);
    if (step === "secretsSecret") return secretsSecretOf(this.podName);
    return this.name;
  }

  private path(step: Step): string {
    return PATHS[step](this.namespace, this.nameOf(step));
  }

  /**
   * Creates every object, the pod last; on a failure or an abort, deletes what it made (reverse
   * order) and throws. Then points the others at the pod (a failure there is logged: the agent's
   * purge removes them all the same).
   */
  async provision(objects: InstanceObjects, signal: AbortSignal): Promise<Provisioned> {
    const made: Step[] = [];
    const created: Partial<Record<Step, KubeObject>> = {};
    for (const step of STEPS) {
      try {
        if (signal.aborted) throw new Error("the instance was stopped while it was being created");
        created[step] = await this.client.create(PATHS[step](this.namespace), objects[step] as KubeObject);
        made.push(step);
      } catch (err) {
        // a request that failed late (a timeout) may have made the object all the same: the names
        // are this instance's own, so whatever has one is ours to delete
        const left = await this.undo([...(isAlreadyExists(err) ? [] : [step]), ...made.reverse()]);
        throw new ProvisionError(step, err, left);
      }
    }
    const pod = created.pod as Provisioned["pod"];
    const serviceAccount = created.serviceAccount as Provisioned["serviceAccount"];
    await this.ownBy(pod.metadata);
    return { pod, serviceAccount };
  }

  /** Points the SA, Role, RoleBinding and Secrets at their pod (the garbage collector's owner). */
  private async ownBy(pod: { name: string; uid: string }): Promise<void> {
    const patch = { metadata: { ownerReferences: [ownerReferenceTo(pod)] } };
    const failed: string[] = [];
    await Promise.all(
      PURGE_ORDER.map(async (step) => {
        try {
          await this.client.patch(this.path(step), patch, "merge");
        } catch (err) {
          failed.push(`${step} (${(err as Error).message})`);
        }
      }),
    );
    if (failed.length)
      this.logger.warn(
        { pod: this.podName, failed },
        "could not point the pod's identity objects at it; the agent still deletes them when it stops the pod",
      );
  }

  /** Deletes the steps given, in that order; answers what could not be deleted. */
  private async undo(steps: readonly Step[]): Promise<string[]> {
    const left: string[] = [];
    for (const step of steps) {
      try {
        // a pod made by a request that failed late goes at once: it never ran
        await this.client.delete(this.path(step), step === "pod" ? { gracePeriodSeconds: 0 } : {});
      } catch (err) {
        left.push(`${step} ${this.nameOf(step)}`);
        this.logger.warn(
          { pod: this.podName, object: step, err: (err as Error).message },
          "could not remove an object of a failed provisioning",
        );
      }
    }
    return left;
  }

  /**
   * Deletes the pod's identity objects: binding, role, account, then the Secrets (the pod is gone
   * or going; NotFound counts as deleted). Throws when one could not be deleted (after trying all).
   */
  async purge(): Promise<void> {
    const left = await this.undo(PURGE_ORDER);
    if (left.length) throw new Error(`could not delete ${left.join(", ")}`);
  }
}
