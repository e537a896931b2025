// What the health page asks other parts of the plane (the callback proxy's /health, the NATS
// servers, JetStream, the MEK provider) is kept for a few seconds: a page reloaded by several
// operators, or every few seconds, asks each part once per period, and views that arrive while a
// probe runs share it. Every probe has a short deadline, so a part that hangs costs one page at
// most that long.

/** One answer per key, kept `ttlMs` from the moment it was asked for. */
export class ProbeCache {
  private readonly entries = new Map<string, { at: number; value: Promise<unknown> }>();

  constructor(private readonly ttlMs: number) {}

  get<T>(key: string, load: () => Promise<T>): Promise<T> {
    const now = Date.now();
    const hit = this.entries.get(key);
    if (hit && now - hit.at < this.ttlMs) return hit.value as Promise<T>;
    const value = load();
    this.entries.set(key, { at: now, value });
    // a failed probe is not kept: the next view asks again
    value.catch(() => this.entries.delete(key));
    return value;
  }
}

/** `p`, or a rejection naming `what` once `ms` have passed. */
export function withDeadline<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not answer within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}
