// The instance types this cluster offers: compute.kubernetes.instanceTypes when the operator lists
// them, else found on the nodes, by the labels NVIDIA's GPU feature discovery puts there
// (nvidia.com/gpu.product, nvidia.com/gpu.count): one type `<product>.x<count>` (lower case) per
// distinct pair, whose pods get node affinity on those two labels. Discovery watches the nodes, so
// a GPU node joining or leaving changes the list (and the agent registers it again).
import type { Logger } from "../../../lib/log.js";
import {
  kubePaths,
  watchCollection,
  type CollectionWatch,
  type KubeClient,
  type KubeObject,
} from "../../../lib/kube/index.js";
import type { InstanceTypeOffer } from "../instance-types.js";
import { FirstList } from "./first-list.js";

/** An instance type and the node labels its pods require (node affinity). */
export interface ClusterInstanceType extends InstanceTypeOffer {
  nodeSelector: Record<string, string>;
}

export const GPU_PRODUCT_LABEL = "nvidia.com/gpu.product";
export const GPU_COUNT_LABEL = "nvidia.com/gpu.count";

/** The types the nodes offer (nodes without both labels offer none). */
export function typesFromNodes(nodes: readonly KubeObject[]): ClusterInstanceType[] {
  const found = new Map<string, ClusterInstanceType>();
  for (const n of nodes) {
    const labels = n.metadata?.labels ?? {};
    const product = labels[GPU_PRODUCT_LABEL];
    const count = Number(labels[GPU_COUNT_LABEL]);
    if (!product || !Number.isInteger(count) || count < 1) continue;
    const name = `${product}.x${count}`.toLowerCase();
    found.set(name, {
      name,
      gpu: product,
      gpuCount: count,
      nodeSelector: { [GPU_PRODUCT_LABEL]: product, [GPU_COUNT_LABEL]: String(count) },
    });
  }
  return [...found.values()].sort((a, b) => a.name.localeCompare(b.name));
}

const key = (types: readonly ClusterInstanceType[]) => JSON.stringify(types);

export class ClusterInstanceTypes {
  private types: ClusterInstanceType[];
  private watch: CollectionWatch | undefined;
  /** Resolves once the types are known (the nodes' first list, when discovering). */
  synced: Promise<void> = Promise.resolve();

  constructor(
    private readonly client: KubeClient,
    /** compute.kubernetes.instanceTypes; empty: discovered on the nodes. */
    private readonly configured: readonly ClusterInstanceType[],
    private readonly logger: Logger,
  ) {
    this.types = [...configured];
  }

  get discovering(): boolean {
    return this.configured.length === 0;
  }

  /** The type a deployment names, when this cluster offers it. */
  resolve(gpu: string, name: string): ClusterInstanceType | undefined {
    return this.types.find((t) => t.name === name && t.gpu === gpu);
  }

  get current(): readonly ClusterInstanceType[] {
    return this.types;
  }

  /** Publishes the configured types, or watches the nodes and publishes what they offer, as it changes. */
  start(publish: (types: readonly InstanceTypeOffer[]) => void): void {
    const offer = () => publish(this.types.map(({ name, gpu, gpuCount }) => ({ name, gpu, gpuCount })));
    if (!this.discovering) {
      offer();
      return;
    }
    const nodes = new Map<string, KubeObject>();
    const listed = new FirstList();
    let published: string | undefined;
    const update = () => {
      const next = typesFromNodes([...nodes.values()]);
      if (key(next) === published) return;
      published = key(next);
      this.types = next;
      this.logger.info({ instanceTypes: next.map((t) => t.name) }, "instance types found on the nodes");
      offer();
    };
    this.watch = watchCollection(
      this.client,
      kubePaths.nodes(),
      // only nodes that have a GPU product label (an existence selector)
      { labelSelector: GPU_PRODUCT_LABEL },
      {
        onList: (items) => {
          nodes.clear();
          for (const n of items) nodes.set(n.metadata?.name ?? "", n);
          update();
        },
        onEvent: (type, n) => {
          if (type === "DELETED") nodes.delete(n.metadata?.name ?? "");
          else nodes.set(n.metadata?.name ?? "", n);
          update();
        },
        onError: (err) => {
          if (!listed.error(err))
            this.logger.warn({ err: err.message }, "watching the nodes failed; retrying");
        },
      },
    );
    this.synced = listed.wait(this.watch, "list the nodes (to find the instance types)");
  }

  stop(): void {
    this.watch?.stop();
  }
}
