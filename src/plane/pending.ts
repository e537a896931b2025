// The requests a replica holds while it waits for a worker: each with a window after which it is
// given up (the caller says how), counted in an in-flight gauge. Releasing one stops its window;
// a request is released once, however many paths end it.
import type { Gauge } from "../lib/metrics.js";

export class PendingTable<T extends object> {
  private readonly timers = new Map<T, NodeJS.Timeout | undefined>();

  constructor(private readonly gauge?: Gauge) {}

  /** Holds `item`; `onTimeout` runs if it is still held (and its window not stopped) after `windowMs`. */
  add(item: T, windowMs: number, onTimeout: (item: T) => void): void {
    const timer = setTimeout(() => {
      if (!this.timers.has(item)) return;
      this.timers.set(item, undefined);
      onTimeout(item);
    }, windowMs);
    this.timers.set(item, timer);
    this.gauge?.inc();
  }

  /** Stops the window of a held item (a worker has it now); it stays held. */
  stopWindow(item: T): void {
    const t = this.timers.get(item);
    if (t) clearTimeout(t);
    if (this.timers.has(item)) this.timers.set(item, undefined);
  }

  /** Lets go of `item`; false when it was not held (released already). */
  release(item: T): boolean {
    if (!this.timers.has(item)) return false;
    const t = this.timers.get(item);
    if (t) clearTimeout(t);
    this.timers.delete(item);
    this.gauge?.dec();
    return true;
  }

  has(item: T): boolean {
    return this.timers.has(item);
  }

  values(): T[] {
    return [...this.timers.keys()];
  }

  get size(): number {
    return this.timers.size;
  }
}
