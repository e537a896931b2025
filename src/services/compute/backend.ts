// The seam between the agent and where instances run. The agent (reconciler.ts, status-report.ts)
// decides how many instances each desired deployment has and reports them; a backend starts and
// stops one instance. Today's backend is local-backend.ts (two processes on this machine); a second
// one (Kubernetes) implements the same two interfaces and the agent stays as it is.
import type { InstanceStatus } from "../../lib/instance-status.js";
import type { DesiredDeployment } from "./deployment.js";

/** One spec of a desired deployment (the agent runs the first). */
export type DeploymentSpec = DesiredDeployment["specs"][number];

/** One function instance, as the agent sees it: what it reports, and how it starts and stops it. */
export interface ComputeInstance {
  readonly instanceId: string;
  readonly deployment: DesiredDeployment;
  readonly status: InstanceStatus;
  readonly message: string | undefined;
  /** Where it runs, reported as its location (the local backend: its own loopback address). */
  readonly location: string;
  /** The worker identifier, while the instance holds an identity (reported as WorkerAuth). */
  readonly workerIdentifier: string | undefined;
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
  /** Reported as each instance's backend. */
  readonly name: string;
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
  /** Before the first instance: clears what an earlier run of the agent left. */
  prepare(): void;
  /** After the last instance: removes what the backend keeps beside its instances. */
  dispose(): void;
}
