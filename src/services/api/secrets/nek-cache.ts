// A bounded cache of unwrapped NEKs, so that decrypting a secret costs one AES operation, not a
// MEK-provider call, and so that decrypts keep working through a short provider outage (as the
// Kubernetes KMS v2 DEK cache does). An entry is fresh for `ttlMs`; after that the caller asks the
// provider again, and if the provider fails the entry may still be used for `outageMs` more. Past
// that it is gone. Least recently used entries are evicted first beyond `maxEntries`. Entries
// carry the namespace the NEK belongs to, so that a hit is checked against where it is used.

interface Entry {
  key: Buffer;
  namespace: string;
  loadedAt: number;
}

export type Lookup =
  | { state: "fresh"; key: Buffer; namespace: string }
  | { state: "stale"; key: Buffer; namespace: string; ageMs: number }
  | { state: "miss" };

export class NekCache {
  private readonly entries = new Map<string, Entry>();

  constructor(
    readonly maxEntries: number,
    readonly ttlMs: number,
    readonly outageMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  get size(): number {
    return this.entries.size;
  }

  /** Returns a copy of the key: the cache zeroes its own when it drops an entry. */
  lookup(nekId: string): Lookup {
    const e = this.entries.get(nekId);
    if (!e) return { state: "miss" };
    const age = this.now() - e.loadedAt;
    if (age > this.ttlMs + this.outageMs) {
      this.drop(nekId);
      return { state: "miss" };
    }
    // most recently used last
    this.entries.delete(nekId);
    this.entries.set(nekId, e);
    const key = Buffer.from(e.key);
    return age <= this.ttlMs
      ? { state: "fresh", key, namespace: e.namespace }
      : { state: "stale", key, namespace: e.namespace, ageMs: age };
  }

  put(nekId: string, namespace: string, key: Buffer): void {
    this.drop(nekId);
    this.entries.set(nekId, { key: Buffer.from(key), namespace, loadedAt: this.now() });
    while (this.entries.size > this.maxEntries) {
      const oldest = this.entries.keys().next().value;
      if (oldest === undefined) break;
      this.drop(oldest);
    }
  }

  /** Forgets one NEK and zeroes its bytes. */
  drop(nekId: string): void {
    const e = this.entries.get(nekId);
    if (!e) return;
    this.entries.delete(nekId);
    e.key.fill(0);
  }

  clear(): void {
    for (const id of [...this.entries.keys()]) this.drop(id);
  }
}
