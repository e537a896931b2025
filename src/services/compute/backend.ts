// The seam between the agent and where instances run. The agent (reconciler.ts, status-report.ts)
// decides how many instances each desired deployment has and reports them; a backend starts and
// stops one instance. Two backends implement it: local-backend.ts (two processes on this machine)
// and kubernetes/backend.ts (a pod per instance).
import type { InstanceStatus } from "../../lib/instance-status.js";
import type { DesiredDeployment } from "./deployment.js";
import type { InstanceTypeOffer } from "./instance-types.js";

/** One spec of a desired deployment (the agent runs the first). */
export type DeploymentSpec = DesiredDeployment["specs"][number];

/**
 * What a status report says of an instance's worker identity (the seed PR's WorkerAuth): the local
 * backend's API-issued identifier, or a pod's service account and the pod it is bound to.
 */
export type WorkerAuth =
  | { workerIdentifier: string }
  | { sub: string; saUid: string; workerIdentifiers: Array<{ name: string; uid: string }> };

/** One function instance, as the agent sees it: what it reports, and how it starts and stops it. */
export interface ComputeInstance {
  readonly instanceId: string;
  readonly deployment: DesiredDeployment;
  readonly status: InstanceStatus;
  readonly message: string | undefined;
  /** Where it runs, reported as its location (local: its loopback address; a pod: namespace/name). */
  readonly location: string;
  /** Its worker identity while it holds one (reported as workerAuth). */
  readonly workerAuth: WorkerAuth | undefined;
  /**
   * It went away outside the agent (its pod deleted by someone, or Failed): the agent takes it out,
   * stops what is left of it (reported TERMINATED) and starts a replacement.
   */
  readonly ended: boolean;
  readonly createdAt: string;
  readonly updatedAt: string;
  start(): void;
  /** A secret of the version changed (its new revision): running instances get the new values. */
  refreshSecrets(revision: number): void;
  /** Drains the worker (it finishes in-flight requests), then stops the rest; TERMINATED after. */
  stop(): Promise<void>;
  /** Kills it now (the agent is being destroyed or its process exits). */
  killNow(): void;
}

/** Where instances run. */
export interface ComputeBackend<I extends ComputeInstance = ComputeInstance> {
  /** Reported as each instance's backend, and registered with the instance types. */
  readonly name: "local" | "kubernetes";
  /**
   * Instances run on without the agent (pods): closing or destroying the agent leaves them, and its
   * next start adopts them. Local instances are the agent's own processes and go with it.
   */
  readonly outlivesAgent: boolean;
  /** How many instances a deployment's spec runs on this backend. */
  instanceCount(spec: DeploymentSpec): number;
  /**
   * A new instance of the deployment, not yet started. `inUse` are the instances that still hold
   * what an instance runs on (running ones and ones still stopping), so the new one gets none of
   * theirs; `onChange` is called whenever its status changes.
   */
  create(d: DesiredDeployment, inUse: readonly I[], onChange: () => void): I;
  /**
   * What the API said workers get to reach NATS (NKEY_SEED or NVCF_NATS_ACCOUNT), at the last sync.
   * Instances started from now on get it.
   */
  setWorkerNatsEnv(env: Record<string, string>): void;
  /**
   * Before the first sync: clears what an earlier run of the agent left, and answers the instances
   * it left running, adopted (already started; the first sync keeps those still wanted). `onChange`
   * is their status callback.
   */
  prepare(onChange: () => void): Promise<I[]>;
  /** Whether it offers the instance type a deployment's spec names (now). */
  offers(gpu: string, instanceType: string): boolean;
  /** Hands the instance types this backend offers to `publish`, now and whenever they change. */
  offerInstanceTypes(publish: (types: readonly InstanceTypeOffer[]) => void): void;
  /**
   * What proves a status report comes from this backend's cluster (the Kubernetes agent's own
   * projected tokens: the API asks an enrolled cluster's reports for them); none on the local backend.
   */
  reportProofs?(): string[];
  /** After the last instance (or when the agent closes): removes or stops what the backend keeps beside its instances. */
  dispose(): Promise<void>;
}

/** Neither backend scales to zero (nothing here scales on demand): minInstances, at least one. */
export function defaultInstanceCount(spec: DeploymentSpec): number {
  return Math.min(spec.maxInstances, Math.max(spec.minInstances, 1));
}
