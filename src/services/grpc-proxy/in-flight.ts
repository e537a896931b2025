// A bound on what one API key holds on this replica (grpcproxy.maxInFlightPerKey): its calls in
// flight, and, in a second budget, its sessions (each a queued work message or a worker's tunnel,
// so a worker slot). One key cannot take a replica's or a function's capacity from every other.
import { CallplaneError } from "../../lib/errors.js";

export class KeyBudget {
  private readonly held = new Map<string, number>();

  constructor(
    private readonly limit: number,
    /** What is counted, for the refusal: "calls in flight", "sessions". */
    private readonly what: string,
  ) {}

  /** Takes one unit for `keyId`, or refuses (TOO_MANY_IN_FLIGHT); the returned function gives it back, once. */
  take(keyId: string): () => void {
    const n = this.held.get(keyId) ?? 0;
    if (n >= this.limit)
      throw new CallplaneError(
        "TOO_MANY_IN_FLIGHT",
        `this API key already has ${this.limit} ${this.what} on this grpc-proxy replica (grpcproxy.maxInFlightPerKey); wait for some to finish, or spread the load over more keys`,
      );
    this.held.set(keyId, n + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (this.held.get(keyId) ?? 1) - 1;
      if (left <= 0) this.held.delete(keyId);
      else this.held.set(keyId, left);
    };
  }

  /** What `keyId` holds now. */
  heldBy(keyId: string): number {
    return this.held.get(keyId) ?? 0;
  }
}
