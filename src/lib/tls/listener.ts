// A TLS front door that hands each connection, once its handshake is done, to a router that
// decides what it is (by its server name, before any HTTP is parsed, where that matters): the
// callback proxy serves HTTP callbacks (`invocation.<workerDomain>`) with an HTTP server on the
// decrypted socket and pipes gRPC tunnels (`<dashed-ip>.<workerDomain>`) as bytes; grpc-proxy's
// worker TLS listener hands every connection to its CONNECT listener.
// The secure context is built once and replaced only on reload; accepted sockets get 256 KiB
// buffers; every live socket is tracked so that close() can drain them and destroy() cut them.
import { createServer, type Server, type TLSSocket, type TlsOptions } from "node:tls";
import { formatHostPort, widenSocketBuffers } from "../net/index.js";
import { HANDSHAKE_OPTIONS, limitHandshake } from "./handshake.js";

export interface TlsFrontend {
  readonly server: Server;
  readonly sockets: ReadonlySet<TLSSocket>;
  listen(host: string, port: number): Promise<URL>;
  /** New certificate and key: new sessions use them, live ones keep theirs. */
  setCertificate(cert: string, key: string): void;
  /** Stops accepting; waits up to graceMs for live sockets to end, then destroys the rest. */
  close(graceMs: number): Promise<void>;
  destroy(): void;
}

export function createTlsFrontend(opts: {
  tls: TlsOptions;
  /** Takes over each connection once its handshake is done (`socket.servername` is the SNI name). */
  route: (socket: TLSSocket) => void;
  /** A handshake that failed (the server's tlsClientError), for the log; unset, it goes unheard. */
  onHandshakeError?: (err: Error, socket: TLSSocket) => void;
}): TlsFrontend {
  const sockets = new Set<TLSSocket>();
  const server = createServer({ minVersion: "TLSv1.2", ...HANDSHAKE_OPTIONS, ...opts.tls });
  limitHandshake(server);
  server.on("secureConnection", (s: TLSSocket) => {
    widenSocketBuffers(s);
    sockets.add(s);
    s.once("close", () => sockets.delete(s));
    opts.route(s);
  });
  if (opts.onHandshakeError) server.on("tlsClientError", opts.onHandshakeError);
  return {
    server,
    sockets,
    listen(host, port) {
      return new Promise((resolve, reject) => {
        server.once("error", reject);
        server.listen(port, host, () => {
          server.off("error", reject);
          const a = server.address();
          resolve(
            new URL(`https://${formatHostPort({ host, port: typeof a === "object" && a ? a.port : port })}`),
          );
        });
      });
    },
    setCertificate(cert, key) {
      server.setSecureContext({ cert, key, minVersion: "TLSv1.2" });
    },
    async close(graceMs) {
      server.close();
      const deadline = Date.now() + graceMs;
      while (sockets.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
      for (const s of sockets) s.destroy();
    },
    destroy() {
      server.close();
      for (const s of sockets) s.destroy();
    },
  };
}
