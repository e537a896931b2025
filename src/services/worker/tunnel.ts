// The worker's end of a gRPC session's tunnel (contract §4.3): dial the connect URL the work
// message names (directly, or TLS through the callback proxy, verifying its certificate with the
// system roots plus NVCF_PROXY_CA_PEM), send `CONNECT` with the single-use token and the request
// id, and hand back the socket once the proxy answered 200. A dial that fails is retried a few
// times with backoff; 401 and 403 are final (the token is spent or wrong; retrying cannot help).
import { connect as netConnect, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { connect as tlsConnect, type SecureContext } from "node:tls";
import { SOCKET_BUFFER_BYTES, widenSocketBuffers } from "../../lib/net/index.js";
import type { LookupFunction } from "../../lib/net/index.js";

export interface TunnelTarget {
  /** http://<pod>:10086/v1/proxy, or https://<dashed-ip>.<workerDomain>:10084/v1/proxy through the proxy. */
  proxyUri: string;
  token: string;
  requestId: string;
  /** The W3C traceparent of the worker's span for the tunnel, sent on the CONNECT. */
  traceparent?: string | undefined;
}

export class TunnelError extends Error {
  constructor(
    message: string,
    /** true: do not retry (401, 403) */
    readonly final: boolean,
  ) {
    super(message);
    this.name = "TunnelError";
  }
}

export interface DialOptions {
  lookup: LookupFunction;
  secureContext: SecureContext | undefined;
  connectTimeoutMs?: number;
  signal?: AbortSignal;
}

const MAX_HEAD = 16 * 1024;

function dial(t: TunnelTarget, opts: DialOptions): Promise<Socket> {
  const u = new URL(t.proxyUri);
  const secure = u.protocol === "https:";
  const port = Number(u.port || (secure ? 443 : 80));
  const host = u.hostname.replace(/^\[|\]$/g, "");
  return new Promise((resolve, reject) => {
    const common = { host, port, lookup: opts.lookup, ...({ highWaterMark: SOCKET_BUFFER_BYTES } as object) };
    const socket: Socket = secure
      ? tlsConnect({
          ...common,
          servername: host,
          ALPNProtocols: ["http/1.1"],
          ...(opts.secureContext ? { secureContext: opts.secureContext } : {}),
        })
      : netConnect(common);
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new TunnelError(`connecting to ${u.host} timed out`, false));
    }, opts.connectTimeoutMs ?? 3000);
    const onAbort = () => socket.destroy(new Error("aborted"));
    opts.signal?.addEventListener("abort", onAbort, { once: true });
    socket.once("error", (err) => {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
      reject(new TunnelError(`dialing ${u.host} failed: ${err.message}`, false));
    });
    socket.once(secure ? "secureConnect" : "connect", () => {
      clearTimeout(timer);
      opts.signal?.removeEventListener("abort", onAbort);
      if (secure) widenSocketBuffers(socket);
      socket.setNoDelay(true);
      resolve(socket);
    });
  });
}

/** Sends the CONNECT and reads the answer's head; the socket is the tunnel once it said 200. */
function handshake(socket: Socket, t: TunnelTarget): Promise<Socket> {
  const u = new URL(t.proxyUri);
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const fail = (err: TunnelError) => {
      cleanup();
      socket.destroy();
      reject(err);
    };
    const onData = (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const end = buf.indexOf("\r\n\r\n");
      if (end === -1) {
        if (buf.length > MAX_HEAD)
          fail(new TunnelError("the proxy's answer to CONNECT has no end of head", false));
        return;
      }
      const head = buf.subarray(0, end).toString("latin1");
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(head)?.[1] ?? 0);
      const rest = buf.subarray(end + 4);
      if (status === 200) {
        cleanup();
        socket.pause();
        if (rest.length) socket.unshift(rest);
        resolve(socket);
        return;
      }
      // the body says why (a problem+json); read what came with the head
      let detail = rest.toString("utf8").slice(0, 500);
      try {
        detail = (JSON.parse(detail) as { detail?: string }).detail ?? detail;
      } catch {
        // not JSON (or cut): keep the text
      }
      fail(
        new TunnelError(
          `the proxy refused the tunnel with ${status || "an unreadable answer"}${detail ? `: ${detail}` : ""}`,
          status === 401 || status === 403,
        ),
      );
    };
    const onClose = () =>
      fail(new TunnelError("the proxy closed the connection before answering CONNECT", false));
    const cleanup = () => {
      socket.off("data", onData);
      socket.off("close", onClose);
    };
    socket.on("data", onData);
    socket.once("close", onClose);
    socket.write(
      `CONNECT ${t.proxyUri} HTTP/1.1\r\nHost: ${u.host}\r\nAuthorization: Bearer ${t.token}\r\nX-Request-ID: ${t.requestId}\r\n${t.traceparent ? `traceparent: ${t.traceparent}\r\n` : ""}\r\n`,
    );
  });
}

/** Opens the tunnel, retrying a failed dial (at most `attempts`, backoff from 10 ms); 401/403 are final. */
export async function openTunnel(t: TunnelTarget, opts: DialOptions, attempts = 5): Promise<Socket> {
  let delay = 10;
  for (let i = 1; ; i++) {
    try {
      return await handshake(await dial(t, opts), t);
    } catch (err) {
      const e = err instanceof TunnelError ? err : new TunnelError((err as Error).message, false);
      if (e.final || i >= attempts || opts.signal?.aborted) throw e;
      await sleep(delay, undefined, opts.signal ? { signal: opts.signal } : {}).catch(() => undefined);
      delay *= 4;
    }
  }
}
