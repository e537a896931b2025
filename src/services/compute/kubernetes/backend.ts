// The Kubernetes backend: each instance is a pod in kubernetes.workerNamespace with its own worker
// identity (pod-spec.ts, worker-identity.ts, pod-instance.ts). The desired state still comes from
// the API's sync; the cluster is watched, never polled: one list-then-watch over this agent's pods
// (managed-by and cluster labels) hands each change to its instance by the instance-id label. Pods
// outlive the agent: at start it adopts the pods it finds (the first sync keeps the wanted ones)
// and deletes identity objects whose pod never came (an agent killed mid-provisioning). While it
// runs it keeps the cluster's service-account keys registered with the API (cluster-keys.ts), which
// verifies its pods' tokens against them.
import {
  isNotFound,
  kubePaths,
  watchCollection,
  type CollectionWatch,
  type KubeClient,
  type KubeObject,
} from "../../../lib/kube/index.js";
import type { Logger } from "../../../lib/log.js";
import type { ComputeApiClient } from "../api-client.js";
import { defaultInstanceCount, type ComputeBackend, type DeploymentSpec } from "../backend.js";
import type { DesiredDeployment } from "../deployment.js";
import type { InstanceTypeOffer } from "../instance-types.js";
import type { WorkerSettings } from "../worker-env.js";
import { deploymentOfPod } from "./adopted-pod.js";
import { ClusterKeysPublisher, type ClusterKeysSettings } from "./cluster-keys.js";
import { FirstList } from "./first-list.js";
import { ClusterInstanceTypes, type ClusterInstanceType } from "./instance-types.js";
import { PodInstance, type PodContext } from "./pod-instance.js";
import { ANNOTATIONS, LABELS, managedSelector, podNameOf, type KubePod } from "./pod-spec.js";
import { PATHS } from "./worker-identity.js";

export interface KubernetesBackendOptions {
  client: KubeClient;
  /** kubernetes.workerNamespace */
  namespace: string;
  /** compute.workerIdentity.clusterId: labels, and the audience of the pods' tokens. */
  clusterId: string;
  /** kubernetes.image: the callplane image the worker sidecar runs. */
  workerImage: string;
  gpuResource: string;
  unschedulableSeconds: number;
  terminationGraceSeconds: number;
  /** compute.kubernetes.instanceTypes; empty: found on the nodes' GPU labels. */
  instanceTypes: readonly ClusterInstanceType[];
  worker: WorkerSettings;
  /** Backoff of a failed provisioning. */
  restart: { initialMs: number; maxMs: number };
  /** How long stopping waits for a deleted pod to go, beyond its grace (30 s by default). */
  deleteWaitMs?: number;
  /**
   * Registration of the cluster's keys (compute.kubernetes.identityTokenFile, keysRefreshSeconds,
   * enrollmentTokenFile). Absent: the cluster is not registered (tests of the pods alone).
   */
  clusterKeys?: ClusterKeysSettings;
  api: ComputeApiClient;
  logger: Logger;
}

export class KubernetesBackend implements ComputeBackend<PodInstance> {
  readonly name = "kubernetes";
  readonly outlivesAgent = true;
  private readonly byId = new Map<string, PodInstance>();
  private readonly types: ClusterInstanceTypes;
  private readonly ctx: PodContext;
  private workerNatsEnv: Record<string, string> = {};
  private watch: CollectionWatch | undefined;
  private publish: ((types: readonly InstanceTypeOffer[]) => void) | undefined;
  private offered: readonly InstanceTypeOffer[] | undefined;
  /** Adoption is done: from now on a managed pod of an id it does not track is a stray. */
  private adopted = false;
  /** The stray pods being deleted (by name). */
  private readonly straysDeleting = new Set<string>();
  /** Keeps the cluster's keys registered with the API (when configured). */
  readonly clusterKeys: ClusterKeysPublisher | undefined;

  constructor(private readonly opts: KubernetesBackendOptions) {
    this.types = new ClusterInstanceTypes(opts.client, opts.instanceTypes, opts.logger);
    this.clusterKeys = opts.clusterKeys
      ? new ClusterKeysPublisher({
          ...opts.clusterKeys,
          clusterId: opts.clusterId,
          kube: opts.client,
          api: opts.api,
          logger: opts.logger,
        })
      : undefined;
    this.ctx = {
      client: opts.client,
      namespace: opts.namespace,
      clusterId: opts.clusterId,
      workerImage: opts.workerImage,
      gpuResource: opts.gpuResource,
      terminationGraceSeconds: opts.terminationGraceSeconds,
      unschedulableMs: opts.unschedulableSeconds * 1000,
      deleteWaitMs: opts.deleteWaitMs ?? 30_000,
      restart: opts.restart,
      worker: opts.worker,
      workerNatsEnv: () => this.workerNatsEnv,
      instanceTypes: this.types,
      api: opts.api,
      logger: opts.logger,
      track: (id, inst) => this.byId.set(id, inst),
      untrack: (id, inst) => {
        if (this.byId.get(id) === inst) this.byId.delete(id);
      },
    };
  }

  instanceCount(spec: DeploymentSpec): number {
    return defaultInstanceCount(spec);
  }

  create(d: DesiredDeployment, _inUse: readonly PodInstance[], onChange: () => void): PodInstance {
    return new PodInstance(this.ctx, d, onChange);
  }

  setWorkerNatsEnv(env: Record<string, string>): void {
    this.workerNatsEnv = env;
  }

  /** The instance types it offers now (configured, or found on the nodes). */
  get instanceTypes(): readonly ClusterInstanceType[] {
    return this.types.current;
  }

  offers(gpu: string, instanceType: string): boolean {
    return this.types.resolve(gpu, instanceType) !== undefined;
  }

  offerInstanceTypes(publish: (types: readonly InstanceTypeOffer[]) => void): void {
    this.publish = publish;
    if (this.offered) publish(this.offered);
  }

  /**
   * Starts the instance types (and the node watch when discovering) and the pod watch; adopts the
   * pods of its first list; deletes identity objects without a pod.
   */
  async prepare(onChange: () => void): Promise<PodInstance[]> {
    const { client, namespace, clusterId, logger } = this.opts;
    // first: the registration runs beside everything else (its first look goes before the first
    // report), and pods adopted now get their tokens verified as soon as it lands
    this.clusterKeys?.start();
    this.types.start((t) => {
      this.offered = t;
      this.publish?.(t);
    });
    // the agent hears of adopted instances' changes once it has them all in its table
    let adopting = true;
    const changed = () => {
      if (!adopting) onChange();
    };
    const adopted: PodInstance[] = [];
    let first = true;
    const listed = new FirstList();
    const selector = managedSelector(clusterId);
    this.watch = watchCollection<KubePod>(
      client,
      kubePaths.pods(namespace),
      { labelSelector: selector },
      {
        onList: (items) => {
          // made here, in the list's own turn, so that no event for them can come first
          if (first) {
            first = false;
            for (const pod of items) {
              if (!pod.metadata.labels?.[LABELS.instanceId]) continue;
              adopted.push(new PodInstance(this.ctx, deploymentOfPod(pod), changed, { pod }));
            }
            return;
          }
          void this.relisted(items);
        },
        onEvent: (type, pod) => {
          const id = pod.metadata?.labels?.[LABELS.instanceId];
          const inst = id ? this.byId.get(id) : undefined;
          if (inst) inst.observe(type, pod);
          else if (type === "ADDED") this.deleteStrays([pod]);
        },
        onError: (err) => {
          if (!listed.error(err)) logger.warn({ err: err.message }, "watching the pods failed; retrying");
        },
      },
    );
    try {
      await Promise.all([listed.wait(this.watch, `list the pods in ${namespace}`), this.types.synced]);
      await this.sweep(adopted);
    } catch (err) {
      this.watch.stop();
      this.types.stop();
      await this.clusterKeys?.stop();
      throw err;
    }
    adopting = false;
    this.adopted = true;
    if (adopted.length)
      logger.info(
        { pods: adopted.map((i) => i.podName) },
        `adopted ${adopted.length} pod(s) an earlier run of the agent left running`,
      );
    return adopted;
  }

  /**
   * Reads the identity objects of this cluster id: an adopted pod's account uid and secrets
   * revision; and deletes those whose pod does not exist (binding, role, account, Secrets).
   */
  private async sweep(adopted: readonly PodInstance[]): Promise<void> {
    const { client, namespace, clusterId, logger } = this.opts;
    const selector = managedSelector(clusterId);
    // the purge order (binding, role, account, Secrets); one list holds both Secrets
    const kinds = ["roleBinding", "role", "serviceAccount", "workerSecret"] as const;
    const lists = await Promise.all(
      kinds.map((k) => client.list<KubeObject>(PATHS[k](namespace), { query: { labelSelector: selector } })),
    );
    const byKind = Object.fromEntries(kinds.map((k, n) => [k, lists[n].items])) as Record<
      (typeof kinds)[number],
      KubeObject[]
    >;
    const pods = new Map(adopted.map((i) => [i.instanceId, i]));
    for (const sa of byKind.serviceAccount) {
      const inst = pods.get(sa.metadata?.labels?.[LABELS.instanceId] ?? "");
      if (inst) inst.adoptedWith({ saUid: sa.metadata?.uid });
    }
    // (workerSecret and secretsSecret are both Secrets: one list holds them)
    for (const s of byKind.workerSecret) {
      const inst = pods.get(s.metadata?.labels?.[LABELS.instanceId] ?? "");
      const rev = s.metadata?.annotations?.[ANNOTATIONS.secretsRevision];
      if (inst && rev !== undefined && Number.isInteger(Number(rev)))
        inst.adoptedWith({ secretsRevision: Number(rev) });
    }
    const orphans = new Map<string, Array<{ kind: string; path: string }>>();
    for (const kind of kinds) {
      for (const o of byKind[kind]) {
        const id = o.metadata?.labels?.[LABELS.instanceId] ?? "";
        if (pods.has(id)) continue;
        const list = orphans.get(id) ?? [];
        list.push({ kind, path: PATHS[kind](namespace, o.metadata?.name ?? "") });
        orphans.set(id, list);
      }
    }
    for (const [id, objects] of orphans) {
      try {
        for (const o of objects) await client.delete(o.path);
        logger.info(
          {
            instanceId: id,
            pod: podNameOf(id),
            objects: objects.map((o) => o.path.split("/").slice(-2).join("/")),
          },
          "removed identity objects an earlier run left without their pod",
        );
      } catch (err) {
        logger.warn(
          { instanceId: id, err: (err as Error).message },
          "could not remove identity objects an earlier run left without their pod; retried at the next start",
        );
      }
    }
  }

  /**
   * After a re-list (a 410, or a watch that failed): the instances whose pod is not in it may have
   * missed its DELETED event; a GET says whether it is really gone.
   */
  private async relisted(items: readonly KubePod[]): Promise<void> {
    this.deleteStrays(items);
    const present = new Map(items.map((p) => [p.metadata.labels?.[LABELS.instanceId] ?? "", p]));
    for (const [id, inst] of this.byId) {
      const pod = present.get(id);
      if (pod) {
        inst.observe("MODIFIED", pod);
        continue;
      }
      try {
        const p = await this.opts.client.get<KubePod>(kubePaths.pods(this.opts.namespace, podNameOf(id)));
        inst.observe("MODIFIED", p);
      } catch (err) {
        if (isNotFound(err)) inst.podMissing();
        else
          this.opts.logger.warn(
            { instanceId: id, err: (err as Error).message },
            "could not check whether a pod missing from a re-list still exists",
          );
      }
    }
  }

  /**
   * Deletes the pods (of this agent's labels) whose instance id it does not track: a create that
   * landed after its undo's delete, or one made by hand. Every instance it provisions or stops is
   * tracked by its id until its pod is deleted, so an untracked id is no instance's. Before
   * adoption is done every pod is an instance to adopt; a delete that fails is retried at the next
   * re-list or event.
   */
  private deleteStrays(pods: readonly KubePod[]): void {
    if (!this.adopted) return;
    const { client, namespace, terminationGraceSeconds, logger } = this.opts;
    for (const pod of pods) {
      const id = pod.metadata?.labels?.[LABELS.instanceId];
      const name = pod.metadata?.name;
      if (!name || (id && this.byId.has(id)) || this.straysDeleting.has(name)) continue;
      if (pod.metadata.deletionTimestamp) continue;
      this.straysDeleting.add(name);
      client
        .delete(kubePaths.pods(namespace, name), {
          gracePeriodSeconds: terminationGraceSeconds,
          preconditionUid: pod.metadata.uid,
        })
        .then(
          () =>
            logger.warn(
              { pod: name, instanceId: id },
              "deleted a pod of this cluster's labels that no instance of the agent's has",
            ),
          (err: unknown) =>
            logger.warn(
              { pod: name, instanceId: id, err: (err as Error).message },
              "could not delete a pod of this cluster's labels that no instance of the agent's has; retrying at the next re-list",
            ),
        )
        .finally(() => this.straysDeleting.delete(name));
    }
  }

  /** The agent's own projected tokens (current, and the previous while it lives): its cluster's proof. */
  reportProofs(): string[] {
    return this.clusterKeys?.proofs() ?? [];
  }

  /**
   * Stops watching and registering keys (a push under way is aborted); provisionings under way are
   * undone; the pods stay (the next start adopts them).
   */
  async dispose(): Promise<void> {
    this.watch?.stop();
    this.types.stop();
    await Promise.all([...[...this.byId.values()].map((i) => i.release()), this.clusterKeys?.stop()]);
  }
}
