// The agent's instance bookkeeping: the instances of each deployment, the ones still stopping (they
// hold their address until their processes exit), and the terminated ones not yet reported once.
// Instances the backend adopted at start join their deployment's list as if the agent had started
// them; the first sync keeps the wanted ones and stops the rest.
import type { ComputeInstance } from "./backend.js";

export class InstanceTable<I extends ComputeInstance> {
  private readonly byDeployment = new Map<string, I[]>();
  private readonly stopping = new Set<I>();
  private readonly terminated: I[] = [];
  private readonly pending = new Set<Promise<void>>();

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

  /** Instances an earlier run left (the backend adopted them): each joins its deployment's list. */
  adopt(list: readonly I[]): void {
    for (const i of list) this.listOf(i.deployment.deploymentId).push(i);
  }

  /** Some instance went away outside the agent and waits to be replaced. */
  hasEnded(): boolean {
    return this.all().some((i) => i.ended);
  }

  /** Takes the instances that went away outside the agent out of their lists (to be stopped and replaced). */
  takeEnded(): I[] {
    const ended: I[] = [];
    for (const list of this.byDeployment.values()) {
      for (let k = list.length - 1; k >= 0; k--) if (list[k].ended) ended.push(...list.splice(k, 1));
    }
    return ended;
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

  /**
   * Stops one instance taken out of the table; it is reported TERMINATED once stopped (or once its
   * stop failed: it is not the table's any more either way).
   */
  stop(i: I): Promise<void> {
    const done = i.stop().finally(() => {
      this.stopping.delete(i);
      this.pending.delete(done);
      this.terminated.push(i);
    });
    this.stopping.add(i);
    this.pending.add(done);
    return done;
  }

  /** Waits for every stop under way (failed ones included). */
  async settled(): Promise<void> {
    await Promise.allSettled([...this.pending]);
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

  /**
   * What the next report says: every instance, the ones still stopping (a draining worker keeps its
   * row and its identity until it is gone: a report without it would revoke it mid-drain), and the
   * terminated ones once.
   */
  takeSnapshot(): I[] {
    return [...this.all(), ...this.stopping, ...this.terminated.splice(0)];
  }
}
