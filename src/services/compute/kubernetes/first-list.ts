// A watch's first list, or its first error: an agent that cannot list what it watches (a missing
// permission, a wrong namespace) fails its start and says why, instead of waiting for ever while
// the watch retries. After the first list, errors are the watch's to retry.
import type { CollectionWatch } from "../../../lib/kube/index.js";

export class FirstList {
  private fail!: (err: Error) => void;
  private settled = false;
  private readonly failed = new Promise<never>((_, reject) => (this.fail = reject));

  constructor() {
    this.failed.catch(() => undefined);
  }

  /** The watch failed: before its first list this fails wait(); answers whether it did. */
  error(err: Error): boolean {
    if (this.settled) return false;
    this.fail(err);
    return true;
  }

  /** Resolves at the watch's first list; on an error before it, stops the watch and throws. */
  async wait(watch: CollectionWatch, what: string): Promise<void> {
    try {
      await Promise.race([watch.synced, this.failed]);
    } catch (err) {
      watch.stop();
      throw new Error(`cannot ${what}: ${(err as Error).message}`, { cause: err });
    } finally {
      this.settled = true;
    }
  }
}
