// Single-use tokens held in this replica's memory: the HTTP attach tokens (request and response)
// and the gRPC CONNECT tokens. A token names the replica that minted it (the holder, in hex, before
// a dot), so that a callback carrying it that lands on another replica can be relayed to the
// holder without a lookup table. Taking a token removes it; a token with a time to live is refused
// once it has expired, and a sweep drops expired tokens nobody came for.
import { holderHex, newToken, tokenHolderHex } from "../lib/ids.js";

interface Entry<T> {
  value: T;
  expires: number;
}

/** The holder a token names, or undefined for a token of another form. */
export function tokenHolder(token: string): number | undefined {
  const hex = tokenHolderHex(token);
  return hex === undefined ? undefined : Number.parseInt(hex, 16);
}

export class TokenTable<T> {
  private readonly entries = new Map<string, Entry<T>>();
  private readonly prefix: string;
  private sweeper: NodeJS.Timeout | undefined;

  /** `ttlMs`: how long a token stays valid (Infinity: until taken or deleted). */
  constructor(
    holder: number,
    private readonly ttlMs = Infinity,
  ) {
    this.prefix = `${holderHex(holder)}.`;
    if (Number.isFinite(ttlMs)) {
      this.sweeper = setInterval(() => this.sweep(), Math.max(1000, ttlMs));
      this.sweeper.unref();
    }
  }

  /** A new token for `value`: `<holder hex>.<192 random bits>`. */
  mint(value: T): string {
    const token = this.prefix + newToken();
    this.entries.set(token, { value, expires: Date.now() + this.ttlMs });
    return token;
  }

  /** The value of a live token, without using it up. */
  peek(token: string): T | undefined {
    const e = this.entries.get(token);
    if (!e) return undefined;
    if (e.expires <= Date.now()) {
      this.entries.delete(token);
      return undefined;
    }
    return e.value;
  }

  /** Uses a token up: its value when it was live and `accept` (if given) takes it, else undefined. */
  take(token: string, accept?: (value: T) => boolean): T | undefined {
    const value = this.peek(token);
    if (value === undefined || (accept && !accept(value))) return undefined;
    this.entries.delete(token);
    return value;
  }

  delete(token: string | undefined): void {
    if (token !== undefined) this.entries.delete(token);
  }

  /** True for a token this replica minted (live or not). */
  isOwn(token: string): boolean {
    return token.startsWith(this.prefix);
  }

  get size(): number {
    return this.entries.size;
  }

  private sweep(): void {
    const now = Date.now();
    for (const [token, e] of this.entries) if (e.expires <= now) this.entries.delete(token);
  }

  close(): void {
    if (this.sweeper) clearInterval(this.sweeper);
    this.sweeper = undefined;
    this.entries.clear();
  }
}
