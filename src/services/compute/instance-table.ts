// The agent's instance bookkeeping: the instances of each deployment, the ones still stopping (they
// hold their address until their processes exit), and the terminated ones not yet reported once.
import type { ComputeInstance } from "./backend.js";

export class InstanceTable<I extends ComputeInstance> {
  private readonly byDeployment = new Map<string, I[]>();
  private readonly stopping = new Set<I>();
  private readonly terminated: I[] = [];

  /** The instances of every desired deployment. */
  all(): I[] {
    return [...this.byDeployment.values()].flat();
  }

  /** Every instance that still holds what it runs on: the desired ones and the ones stopping. */
  inUse(): I[] {
    return [...this.all(), ...this.stopping];
  }

  /** The deployment's list, created empty at its first sync; the reconciler grows and shrinks it. */
  listOf(deploymentId: string): I[] {
    const list = this.byDeployment.get(deploymentId) ?? [];
    this.byDeployment.set(deploymentId, list);
    return list;
  }

  /** Takes the deployments no longer wanted out of the table, with their instances. */
  removeUnwanted(wanted: ReadonlySet<string>): Array<[string, I[]]> {
    const gone: Array<[string, I[]]> = [];
    for (const [id, list] of this.byDeployment) {
      if (wanted.has(id)) continue;
      this.byDeployment.delete(id);
      gone.push([id, list]);
    }
    return gone;
  }

  /** Stops one instance taken out of the table; it is reported TERMINATED once stopped. */
  stop(i: I): Promise<void> {
    this.stopping.add(i);
    return i.stop().then(() => {
      this.stopping.delete(i);
      this.terminated.push(i);
    });
  }

  /** The agent closes: stops every instance of the table. */
  async stopAll(): Promise<void> {
    const all = this.all();
    this.byDeployment.clear();
    await Promise.all(all.map((i) => i.stop()));
    this.terminated.push(...all);
  }

  /** The agent is destroyed: instances still draining after a scale-down are killed too, not left to their grace timer. */
  killAll(): void {
    for (const i of this.inUse()) i.killNow();
  }

  /** What the next report says: every instance, and the terminated ones once. */
  takeSnapshot(): I[] {
    return [...this.all(), ...this.terminated.splice(0)];
  }
}
