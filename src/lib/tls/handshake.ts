// The TLS handshake deadline every TLS listener applies. Node's own `handshakeTimeout` (120 s by
// default) is an idle timer, restarted by every byte, and a bare tls.Server only reports it
// (tlsClientError) without closing the socket: a client that connects and never sends a ClientHello,
// or trickles one, held a connection for as long as it liked. Here the deadline runs from the
// moment the TCP connection is accepted and ends it, whatever the client sends.
import type { Socket } from "node:net";
import type { Server, TLSSocket } from "node:tls";

/** How long a client has to finish its TLS handshake, from accepting the TCP connection. */
export const HANDSHAKE_DEADLINE_MS = 5_000;

/** Options to give tls.createServer (and https, http2): Node's own timer, in step with the deadline. */
export const HANDSHAKE_OPTIONS = { handshakeTimeout: HANDSHAKE_DEADLINE_MS } as const;

const key = (s: Socket): string => `${s.remoteAddress ?? ""}|${s.remotePort ?? ""}`;

/**
 * Closes every accepted connection whose handshake has not finished `ms` after it was accepted.
 * Call once, right after creating the server (any tls.Server: tls, https, http2 secure).
 */
export function limitHandshake(server: Server, ms = HANDSHAKE_DEADLINE_MS): void {
  // the raw TCP socket by its peer address: the TLS socket the server makes of it reports the same
  const pending = new Map<string, NodeJS.Timeout>();
  server.on("connection", (raw: Socket) => {
    const k = key(raw);
    const timer = setTimeout(() => {
      pending.delete(k);
      raw.destroy();
    }, ms);
    timer.unref();
    pending.set(k, timer);
    raw.once("close", () => {
      if (pending.get(k) === timer) {
        clearTimeout(timer);
        pending.delete(k);
      }
    });
  });
  server.prependListener("secureConnection", (s: TLSSocket) => {
    const k = key(s);
    const timer = pending.get(k);
    if (timer) {
      clearTimeout(timer);
      pending.delete(k);
    }
  });
  // a failed or timed-out handshake: Node reports it and leaves the socket open on a bare tls.Server
  server.on("tlsClientError", (_err: Error, s: TLSSocket) => s.destroy());
}
