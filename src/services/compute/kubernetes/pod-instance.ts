// One instance on Kubernetes, as the agent sees it: starting provisions its pod and identity
// (pod-provision.ts: one transaction; a failure leaves nothing and is retried with backoff, as a new
// instance with a new id); its status follows its pod (pod-state.ts), which the backend's one watch
// hands it; stopping deletes the pod with its grace (pod-delete.ts), waits (bounded) until the
// watch says it is gone, then purges its identity objects. Its pod going away otherwise (deleted by
// someone, Failed) ends it: the agent reports it TERMINATED and starts another.
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { IPod } from "kubernetes-models/v1";
import type { InstanceStatus } from "../../../lib/instance-status.js";
import { isNotFound, kubePaths } from "../../../lib/kube/index.js";
import type { ComputeInstance, WorkerAuth } from "../backend.js";
import type { DesiredDeployment } from "../deployment.js";
import { deletePod } from "./pod-delete.js";
import { provisionAttempt, type ProvisionContext } from "./pod-provision.js";
import {
  ANNOTATIONS,
  identityNameOf,
  LABELS,
  podNameOf,
  secretsData,
  secretsSecretOf,
  type KubePod,
} from "./pod-spec.js";
import { podVerdict } from "./pod-state.js";
import { WorkerIdentity } from "./worker-identity.js";

/** What every instance of the backend shares. */
export interface PodContext extends ProvisionContext {
  unschedulableMs: number;
  /** How long stop() waits for a deleted pod to go, beyond its grace. */
  deleteWaitMs: number;
  restart: { initialMs: number; maxMs: number };
  /** The backend's dispatch table (the watch finds an instance by its id label). */
  track(id: string, inst: PodInstance): void;
  untrack(id: string, inst: PodInstance): void;
}

export class PodInstance implements ComputeInstance {
  private id: string;
  status: InstanceStatus = "STARTING";
  message: string | undefined;
  readonly createdAt: string;
  updatedAt: string;
  ended = false;
  private endedMessage: string | undefined;
  /** The pod as last seen, and its uid once the agent knows it made (or adopted) it. */
  private pod: IPod | undefined;
  private podUid: string | undefined;
  private saUid: string | undefined;
  private identity: WorkerIdentity | undefined;
  /** A DELETED event for a pod of this instance that came before its create call answered. */
  private deletedEarly: string | undefined;
  private gone = false;
  private onGone: (() => void) | undefined;
  private readonly starting = new AbortController();
  /** The agent closes: a stop under way gives up (the pod stays; the next start adopts it). */
  private readonly releasing = new AbortController();
  private provisioning: Promise<void> | undefined;
  private stopping: Promise<void> | undefined;
  private recheck: NodeJS.Timeout | undefined;
  private secretsRevision = -1;
  private refreshing: Promise<void> | undefined;

  constructor(
    private readonly ctx: PodContext,
    readonly deployment: DesiredDeployment,
    private readonly onChange: () => void,
    adopted?: { pod: KubePod },
  ) {
    const pod = adopted?.pod;
    this.id = pod
      ? (pod.metadata.labels?.[LABELS.instanceId] ?? pod.metadata.name.replace(/^cp-/, ""))
      : randomUUID();
    this.createdAt = pod?.metadata.creationTimestamp ?? new Date().toISOString();
    this.updatedAt = this.createdAt;
    ctx.track(this.id, this);
    if (pod) {
      this.podUid = pod.metadata.uid;
      this.pod = pod;
      this.identity = new WorkerIdentity(ctx.client, ctx.namespace, pod.metadata.name, ctx.logger);
      // its first status is set quietly: the agent reports once it has adopted them all
      this.judge(true);
    }
  }

  get instanceId(): string {
    return this.id;
  }

  get podName(): string {
    return podNameOf(this.id);
  }

  /** namespace/pod, and its node and IP once it has them. */
  get location(): string {
    const node = this.pod?.spec?.nodeName;
    const ip = this.pod?.status?.podIP;
    return `${this.ctx.namespace}/${this.podName}${node ? ` on ${node}` : ""}${ip ? ` at ${ip}` : ""}`;
  }

  /** The pod's account and the pod itself, once it exists (NVCA's WorkerAuth). */
  get workerAuth(): WorkerAuth | undefined {
    if (this.status === "TERMINATED" || !this.podUid || !this.saUid) return undefined;
    return {
      sub: `system:serviceaccount:${this.ctx.namespace}:${identityNameOf(this.podName)}`,
      saUid: this.saUid,
      workerIdentifiers: [{ name: this.podName, uid: this.podUid }],
    };
  }

  /** What the backend found beside an adopted pod: its account's uid and its secrets' revision. */
  adoptedWith(found: { saUid?: string; secretsRevision?: number }): void {
    if (found.saUid) this.saUid = found.saUid;
    if (found.secretsRevision !== undefined) this.secretsRevision = found.secretsRevision;
  }

  private set(status: InstanceStatus, message?: string, quiet = false): void {
    if (this.status === "TERMINATED") return;
    if (this.status === status && this.message === message) return;
    this.status = status;
    this.message = message;
    this.updatedAt = new Date().toISOString();
    if (quiet) return;
    this.ctx.logger.info(
      { instanceId: this.id, pod: this.podName, function: this.deployment.name, status, message },
      `instance ${status}`,
    );
    this.onChange();
  }

  start(): void {
    this.provisioning = this.provision();
  }

  /** Provisions the pod and its identity; retried with backoff (and a new id) until it is made or the instance stopped. */
  private async provision(): Promise<void> {
    const { ctx } = this;
    const signal = this.starting.signal;
    let delay = ctx.restart.initialMs;
    while (!signal.aborted) {
      const a = await provisionAttempt(
        ctx,
        { instanceId: this.id, podName: this.podName, deployment: this.deployment },
        signal,
      );
      if (a.outcome === "aborted") return;
      if (a.outcome === "made") {
        this.identity = a.identity;
        this.saUid = a.saUid;
        this.secretsRevision = a.secretsRevision;
        ctx.logger.info(
          {
            instanceId: this.id,
            pod: this.podName,
            function: this.deployment.name,
            instanceType: a.instanceType,
          },
          "pod created",
        );
        this.created(a.pod);
        return;
      }
      this.set(a.status, a.message);
      await sleep(delay, undefined, { signal }).catch(() => undefined);
      delay = Math.min(delay * 2, ctx.restart.maxMs);
      if (!a.freshId) continue;
      if (signal.aborted) return;
      // a fresh id for the next attempt: nothing of the failed one can be in its way
      const old = this.id;
      this.id = randomUUID();
      ctx.untrack(old, this);
      ctx.track(this.id, this);
    }
  }

  /** The create call answered: from now on the watch's view of the pod is the instance's status. */
  private created(pod: KubePod): void {
    this.podUid = pod.metadata.uid;
    if (this.deletedEarly === this.podUid) {
      this.podGone();
      return;
    }
    // the watch may have told newer news already
    if (this.pod?.metadata?.uid !== this.podUid) this.pod = pod;
    this.judge();
  }

  /** The backend's watch saw the pod change (or go). */
  observe(type: "ADDED" | "MODIFIED" | "DELETED", pod: IPod): void {
    const uid = pod.metadata?.uid;
    if (this.podUid && uid !== this.podUid) return;
    if (type === "DELETED") {
      if (this.podUid) this.podGone();
      else this.deletedEarly = uid;
      return;
    }
    this.pod = pod;
    if (this.podUid) this.judge();
  }

  /** A re-list lacks the pod and a GET says it is gone: its DELETED event was missed. */
  podMissing(): void {
    if (this.podUid) this.podGone();
  }

  private podGone(): void {
    if (this.gone) return;
    this.gone = true;
    this.onGone?.();
    if (!this.stopping) this.end("TERMINATED", "the pod was deleted, not by the agent");
  }

  /** It went away outside the agent: the agent stops what is left of it and starts another. */
  private end(status: InstanceStatus, message: string): void {
    if (this.ended) return;
    this.ended = true;
    this.endedMessage = message;
    this.ctx.logger.warn(
      { instanceId: this.id, pod: this.podName, function: this.deployment.name, reason: message },
      "the instance's pod went away outside the agent; it will be replaced",
    );
    this.set(status, message);
  }

  private judge(quiet = false): void {
    if (this.recheck) clearTimeout(this.recheck);
    this.recheck = undefined;
    const pod = this.pod;
    if (!pod || this.stopping || this.ended) return;
    if (pod.metadata?.deletionTimestamp) {
      this.end("TERMINATED", "the pod is being deleted, not by the agent");
      return;
    }
    const now = Date.now();
    const v = podVerdict(pod, now, this.ctx.unschedulableMs);
    if ("ended" in v) {
      this.end("ERRORED", v.message);
      return;
    }
    this.set(v.status, v.message, quiet);
    if (v.recheckAt !== undefined) {
      this.recheck = setTimeout(() => this.judge(), Math.max(0, v.recheckAt - now) + 50);
      this.recheck.unref();
    }
  }

  /** A secret of the version changed: the pod's secrets Secret gets the new secrets.json. */
  refreshSecrets(revision: number): void {
    if (this.stopping || !this.podUid || this.refreshing || this.secretsRevision === revision) return;
    const d = this.deployment;
    this.refreshing = (async () => {
      try {
        const fetched = await this.ctx.api.secrets(d.functionId, d.versionId);
        if (this.stopping) return;
        await this.ctx.client.patch(
          kubePaths.secrets(this.ctx.namespace, secretsSecretOf(this.podName)),
          {
            metadata: { annotations: { [ANNOTATIONS.secretsRevision]: String(fetched.revision) } },
            data: secretsData(fetched.values),
          },
          "merge",
        );
        this.secretsRevision = fetched.revision;
        this.ctx.logger.info(
          { instanceId: this.id, pod: this.podName, revision: fetched.revision },
          "secrets refreshed",
        );
      } catch (err) {
        this.ctx.logger.warn(
          { instanceId: this.id, pod: this.podName, err: (err as Error).message },
          "could not refresh the instance's secrets; retrying at the next sync",
        );
      } finally {
        this.refreshing = undefined;
      }
    })();
  }

  /** Deletes the pod with its grace, waits until it is gone (bounded), then purges its identity. */
  stop(): Promise<void> {
    this.stopping ??= this.stopNow();
    return this.stopping;
  }

  private async stopNow(): Promise<void> {
    const { ctx } = this;
    this.starting.abort();
    if (this.recheck) clearTimeout(this.recheck);
    await this.provisioning;
    await this.refreshing;
    const released = this.releasing.signal;
    if (this.podUid && !this.gone) {
      const grace = ctx.terminationGraceSeconds;
      const gone = new Promise<void>((r) => (this.onGone = r));
      const path = kubePaths.pods(ctx.namespace, this.podName);
      // Until the API server says the pod is deleting (or gone), nothing else happens: an identity
      // purged and an instance reported TERMINATED while its pod runs on would leave it untracked.
      const deleted = await deletePod({
        client: ctx.client,
        logger: ctx.logger,
        restart: ctx.restart,
        path,
        uid: this.podUid,
        graceSeconds: grace,
        instanceId: this.id,
        podName: this.podName,
        functionName: this.deployment.name,
        isGone: () => this.gone,
        released,
      });
      if (deleted === "released") return;
      if (deleted === "gone") {
        // already gone (the delete was answered NotFound): nothing to wait for
        this.gone = true;
        this.onGone?.();
      }
      const bound = grace * 1000 + ctx.deleteWaitMs;
      const timer = new AbortController();
      const closed = new Promise<void>((r) => released.addEventListener("abort", () => r(), { once: true }));
      await Promise.race([
        gone,
        closed,
        sleep(bound, undefined, { signal: timer.signal }).catch(() => undefined),
      ]);
      timer.abort();
      // the agent closes: the pod goes with its grace, its identity with it (owner references)
      if (released.aborted && !this.gone) return;
      if (!this.gone) {
        // the watch may have missed it: ask once
        const still = await ctx.client.get(path).then(
          () => true,
          (err: unknown) => !isNotFound(err),
        );
        if (still)
          ctx.logger.warn(
            { instanceId: this.id, pod: this.podName, waitedMs: bound },
            "the pod is still terminating; purging its identity all the same",
          );
      }
      this.gone = true;
    }
    if (this.identity) {
      try {
        await this.identity.purge();
      } catch (err) {
        ctx.logger.warn(
          { instanceId: this.id, pod: this.podName, err: (err as Error).message },
          "could not delete the pod's identity objects; they go with the pod (owner references) or at the agent's next start",
        );
      }
    }
    this.set("TERMINATED", this.endedMessage);
    ctx.untrack(this.id, this);
  }

  /** Deletes the pod at once, without waiting (its identity objects go with it: owner references). */
  killNow(): void {
    this.starting.abort();
    if (this.recheck) clearTimeout(this.recheck);
    if (!this.podUid || this.gone) return;
    this.ctx.client
      .delete(kubePaths.pods(this.ctx.namespace, this.podName), { gracePeriodSeconds: 0 })
      .catch((err: unknown) =>
        this.ctx.logger.warn(
          { instanceId: this.id, pod: this.podName, err: (err as Error).message },
          "could not delete the pod",
        ),
      );
  }

  /** The agent closes and leaves its pods running: stops provisioning (undoing one under way) and timers. */
  async release(): Promise<void> {
    this.starting.abort();
    this.releasing.abort();
    if (this.recheck) clearTimeout(this.recheck);
    await this.provisioning;
  }
}
