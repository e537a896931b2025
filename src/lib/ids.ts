// Request ids are UUIDs (clients expect them) that also name the replica holding the request:
// version 8 (RFC 9562, custom layout) with the holder's 32-bit id in the first four bytes and
// random bits elsewhere. Any replica can read the holder from an id without a lookup table.
import { randomBytes, randomFillSync } from "node:crypto";

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export function newHolderId(): number {
  return randomBytes(4).readUInt32BE(0);
}

export function holderHex(holder: number): string {
  return holder.toString(16).padStart(8, "0");
}

const TOKEN_HOLDER_RE = /^([0-9a-f]{8})\./;

/**
 * The holder an attach or tunnel token names (`<holder hex>.<random>`, plane/tokens.ts), in hex,
 * or undefined for a token of another form.
 */
export function tokenHolderHex(token: string): string | undefined {
  return TOKEN_HOLDER_RE.exec(token)?.[1];
}

const pool = Buffer.alloc(16 * 256);
let poolOffset = pool.length;

export function newRequestId(holder: number): string {
  if (poolOffset >= pool.length) {
    randomFillSync(pool);
    poolOffset = 0;
  }
  const b = pool.subarray(poolOffset, poolOffset + 16);
  poolOffset += 16;
  b.writeUInt32BE(holder >>> 0, 0);
  b[6] = (b[6] & 0x0f) | 0x80; // version 8
  b[8] = (b[8] & 0x3f) | 0x80; // RFC 9562 variant
  const h = b.toString("hex");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

export function isUuid(id: string): boolean {
  return UUID_RE.test(id);
}

/** The holder of a callplane request id, or undefined for ids callplane did not mint. */
export function holderOf(requestId: string): number | undefined {
  if (!UUID_RE.test(requestId) || requestId[14] !== "8") return undefined;
  return Number.parseInt(requestId.slice(0, 8), 16);
}

const tokenPool = Buffer.alloc(24 * 256);
let tokenOffset = tokenPool.length;

/** A single-use attach token: 192 random bits, URL-safe. */
export function newToken(): string {
  if (tokenOffset >= tokenPool.length) {
    randomFillSync(tokenPool);
    tokenOffset = 0;
  }
  const t = tokenPool.toString("base64url", tokenOffset, tokenOffset + 24);
  tokenOffset += 24;
  return t;
}
