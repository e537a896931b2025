// A bound on each API key's requests in flight on one replica (invocation.maxInFlightPerKey,
// grpcproxy.maxInFlightPerKey, which grpc-proxy applies to its calls and, in a second bound, to its
// sessions): one key cannot take every connection, timer and worker slot a replica has. A request takes a slot once its key is accepted and gives it back exactly once,
// however it ends (the slot's release is idempotent, so every exit path may call it).
import { CallplaneError } from "../lib/errors.js";

export interface KeySlot {
  /** Gives the slot back; later calls do nothing (a function, so it may be passed on alone). */
  readonly release: () => void;
}

export class KeyInFlight {
  private readonly counts = new Map<string, number>();

  constructor(
    private readonly max: number,
    /** The setting that sets `max`, named in the refusal. */
    private readonly setting: string,
    /** What is counted, for the refusal: "requests in flight", "sessions", ... */
    private readonly what = "requests in flight",
  ) {}

  /** A slot for one more request of `keyId`, or TOO_MANY_IN_FLIGHT when it has `max` already. */
  acquire(keyId: string): KeySlot {
    const n = this.counts.get(keyId) ?? 0;
    if (n >= this.max) {
      throw new CallplaneError(
        "TOO_MANY_IN_FLIGHT",
        `this API key already has ${this.max} ${this.what} on this replica (${this.setting}); wait for some to finish, or spread the load over more keys`,
      );
    }
    this.counts.set(keyId, n + 1);
    let held = true;
    return {
      release: () => {
        if (!held) return;
        held = false;
        const left = (this.counts.get(keyId) ?? 1) - 1;
        if (left <= 0) this.counts.delete(keyId);
        else this.counts.set(keyId, left);
      },
    };
  }

  /** Requests of `keyId` in flight now. */
  count(keyId: string): number {
    return this.counts.get(keyId) ?? 0;
  }
}
