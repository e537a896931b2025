// Peer credentials for a loopback TCP connection: the user id of the process at the other end, as
// the kernel records it in its socket table (/proc/net/tcp and tcp6, Linux). The client's socket is
// the row whose local address is our remote one and whose remote address is our local one; its
// `uid` column is the owner's. Only meaningful on loopback, where both ends are this machine's.
import { readFileSync } from "node:fs";
import { isIP, type Socket } from "node:net";

/** Whether an address is this machine's loopback (127/8, ::1, or IPv4-mapped 127/8). */
export function isLoopbackAddress(address: string | undefined): boolean {
  if (!address) return false;
  const a = address.startsWith("::ffff:") ? address.slice(7) : address;
  return a === "::1" || (isIP(a) === 4 && a.startsWith("127."));
}

/** 16 bytes of an IPv6 address (IPv4 given as IPv4-mapped). */
function ipv6Bytes(address: string): Buffer {
  let a = address;
  const out = Buffer.alloc(16);
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(a);
  if (v4) {
    const b = v4[1].split(".").map(Number);
    a = `${a.slice(0, -v4[1].length)}${((b[0] << 8) | b[1]).toString(16)}:${((b[2] << 8) | b[3]).toString(16)}`;
  }
  const [head, tail] = a.includes("::") ? a.split("::") : [a, undefined];
  const h = head ? head.split(":") : [];
  const t = tail ? tail.split(":") : [];
  const groups = [...h, ...Array<string>(8 - h.length - t.length).fill("0"), ...t];
  groups.forEach((g, i) => out.writeUInt16BE(parseInt(g || "0", 16), i * 2));
  return out;
}

/** How /proc/net/tcp{,6} writes an address and port: 32-bit words in host (little-endian) order. */
function procEndpoint(address: string, port: number, v6: boolean): string {
  const bytes = v6 ? ipv6Bytes(address) : Buffer.from(address.split(".").map(Number));
  let hex = "";
  for (let i = 0; i < bytes.length; i += 4)
    hex += bytes.readUInt32LE(i).toString(16).toUpperCase().padStart(8, "0");
  return `${hex}:${port.toString(16).toUpperCase().padStart(4, "0")}`;
}

/** The uid owning the other end of a loopback connection, or undefined when it cannot be told. */
export function loopbackPeerUid(socket: Socket): number | undefined {
  const { remoteAddress, remotePort, localAddress, localPort } = socket;
  if (!remoteAddress || !remotePort || !localAddress || !localPort) return undefined;
  if (!isLoopbackAddress(remoteAddress)) return undefined;
  const v6 = isIP(remoteAddress) === 6;
  const file = v6 ? "/proc/net/tcp6" : "/proc/net/tcp";
  const peer = procEndpoint(remoteAddress, remotePort, v6);
  const us = procEndpoint(localAddress, localPort, v6);
  let table: string;
  try {
    table = readFileSync(file, "utf8");
  } catch {
    return undefined;
  }
  for (const line of table.split("\n")) {
    const f = line.trim().split(/\s+/);
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid ...; only an established
    // connection (st 01): a closed one's row (TIME_WAIT) shows uid 0 whoever owned it
    if (f[1] === peer && f[2] === us && f[3] === "01") {
      const uid = Number(f[7]);
      return Number.isInteger(uid) ? uid : undefined;
    }
  }
  return undefined;
}
