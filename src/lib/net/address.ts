import { isIPv4 } from "node:net";

export interface HostPort {
  host: string;
  port: number;
}

/** Parses `host:port` (IPv6 as `[::1]:80`); port 0 asks the OS for one. */
export function parseHostPort(value: string): HostPort {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^:[\]]+):(\d{1,5})$/.exec(value);
  if (!m) throw new Error(`"${value}" is not host:port (for example 127.0.0.1:8080)`);
  const port = Number(m[2]);
  if (port > 65535) throw new Error(`port ${port} in "${value}" is above 65535`);
  const host = m[1].startsWith("[") ? m[1].slice(1, -1) : m[1];
  return { host, port };
}

export function formatHostPort({ host, port }: HostPort): string {
  return host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
}

/** `10.0.1.5` → `10-0-1-5`, the pod-address form cluster DNS serves. */
export function dashIp(ip: string): string {
  return ip.replaceAll(".", "-");
}

/** `10-0-1-5` → `10.0.1.5` when it is a canonical dotted IPv4 address, else undefined. */
export function undashIp(label: string): string | undefined {
  if (!/^\d{1,3}(-\d{1,3}){3}$/.test(label)) return undefined;
  const ip = label.replaceAll("-", ".");
  if (!isIPv4(ip)) return undefined;
  // refuse non-canonical forms such as 010-0-0-1, which some resolvers read as octal
  if (ip.split(".").some((o) => o.length > 1 && o.startsWith("0"))) return undefined;
  return ip;
}

function ipv4ToInt(ip: string): number {
  return ip.split(".").reduce((acc, o) => (acc << 8) + Number(o), 0) >>> 0;
}

export interface Cidr {
  base: number;
  bits: number;
  text: string;
}

export function parseCidr(text: string): Cidr {
  const m = /^(\d{1,3}(?:\.\d{1,3}){3})\/(\d{1,2})$/.exec(text);
  if (!m || !isIPv4(m[1]) || Number(m[2]) > 32)
    throw new Error(`"${text}" is not an IPv4 CIDR such as 10.0.0.0/16`);
  const bits = Number(m[2]);
  const mask = bits === 0 ? 0 : (~0 << (32 - bits)) >>> 0;
  return { base: (ipv4ToInt(m[1]) & mask) >>> 0, bits, text };
}

export function cidrContains(cidr: Cidr, ip: string): boolean {
  if (!isIPv4(ip)) return false;
  const mask = cidr.bits === 0 ? 0 : (~0 << (32 - cidr.bits)) >>> 0;
  return (ipv4ToInt(ip) & mask) >>> 0 === cidr.base;
}

/** The n-th host address of a network (n = 1 is the first after the network address). */
export function cidrHost(cidr: Cidr, n: number): string {
  const size = 2 ** (32 - cidr.bits);
  if (n < 1 || n >= size - 1) throw new Error(`host ${n} is outside ${cidr.text}`);
  const v = (cidr.base + n) >>> 0;
  return [v >>> 24, (v >>> 16) & 255, (v >>> 8) & 255, v & 255].join(".");
}

/**
 * Socket buffers for streamed bodies: Node's 16 KiB default makes nearly every write of a streamed
 * body return false, and every hop then pauses and resumes its source once per TLS record.
 */
export const SOCKET_BUFFER_BYTES = 256 * 1024;

interface StreamStates {
  _readableState?: { highWaterMark: number };
  _writableState?: { highWaterMark: number };
}

/**
 * Gives an accepted TLS socket buffers of `bytes` each way. Node 20 creates server-side TLS sockets
 * with 16 KiB buffers whatever `highWaterMark` the server was given (it applies to the TCP socket
 * below only), and offers no public way to change them; streams read their mark on every push and
 * write, so setting it once the session is up takes effect at once. A test checks it holds.
 */
export function widenSocketBuffers(socket: object, bytes = SOCKET_BUFFER_BYTES): void {
  const s = socket as StreamStates;
  if (s._readableState) s._readableState.highWaterMark = bytes;
  if (s._writableState) s._writableState.highWaterMark = bytes;
}
