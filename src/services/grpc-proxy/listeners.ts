// grpc-proxy's listeners and what each hands its connections to. The client listener (HTTP/2,
// cleartext or TLS with ALPN h2): each stream is a call (calls.ts). The CONNECT listener (HTTP/1,
// with /health and /metrics): each CONNECT request is a worker's tunnel (tunnels.ts). The worker
// TLS listener, for workers that come through the callback proxy: TLS with the pod certificate,
// then the same CONNECT inside, so each decrypted connection is handed to the CONNECT listener.
import {
  createSecureServer,
  createServer as createH2Server,
  type Http2SecureServer,
  type Http2Server,
  type IncomingHttpHeaders,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from "node:http2";
import type { Socket } from "node:net";
import { H2_SESSION_OPTIONS, widenWindow } from "../../lib/grpc/index.js";
import { Router, createHttpService, type HttpService } from "../../lib/http/index.js";
import type { Logger } from "../../lib/log.js";
import type { Registry } from "../../lib/metrics.js";
import { dashIp, formatHostPort, ownPodIp, podHost, widenSocketBuffers } from "../../lib/net/index.js";
import {
  HANDSHAKE_OPTIONS,
  createTlsFrontend,
  limitHandshake,
  type TlsFrontend,
  TlsReloader,
  certificateDescriber,
  type CertificateInfo,
} from "../../lib/tls/index.js";
import type { Calls } from "./calls.js";
import type { GrpcProxyOptions } from "./options.js";
import type { ProxyState } from "./state.js";
import { CONNECT_PATH, type Tunnels } from "./tunnels.js";

/** How long calls ended at the grace's end get to send their status before connections are cut. */
const STATUS_FLUSH_MS = 500;

interface ListenerContext {
  logger: Logger;
  registry: Registry;
}

/** The client listener: HTTP/2 sessions of gRPC clients, whose streams are calls. */
export class ClientListener {
  readonly server: Http2Server | Http2SecureServer;
  private readonly reloader: TlsReloader | undefined;
  private readonly sessions = new Set<ServerHttp2Session>();
  private readonly logger: Logger;

  constructor(
    private readonly opts: Pick<GrpcProxyOptions, "listen" | "clientTls">,
    private readonly calls: Calls,
    { logger, registry }: ListenerContext,
  ) {
    this.logger = logger;
    if (opts.clientTls) {
      const reloader = new TlsReloader(
        "grpc-client-listener",
        { certFile: opts.clientTls.certFile, keyFile: opts.clientTls.keyFile },
        (m) =>
          (this.server as Http2SecureServer).setSecureContext({
            cert: m.cert,
            key: m.key,
            minVersion: "TLSv1.2",
          }),
        logger,
        registry,
      );
      this.reloader = reloader;
      const secure = createSecureServer({
        ...H2_SESSION_OPTIONS,
        cert: reloader.material.cert,
        key: reloader.material.key,
        minVersion: "TLSv1.2",
        ALPNProtocols: ["h2"],
        ...HANDSHAKE_OPTIONS,
      });
      limitHandshake(secure);
      this.server = secure;
      this.server.prependListener("secureConnection", widenSocketBuffers);
    } else {
      this.server = createH2Server({ ...H2_SESSION_OPTIONS });
    }
    // small calls one at a time: no Nagle delay on any hop (HTTP/2 sockets cannot be touched once
    // the session has them)
    this.server.on("connection", (sock: Socket) => sock.setNoDelay(true));
    this.server.on("session", (s: ServerHttp2Session) => this.onSession(s));
    this.server.on(
      "stream",
      (stream: ServerHttp2Stream, headers: IncomingHttpHeaders, flags: number, rawHeaders: string[]) =>
        this.onStream(stream, headers, flags, rawHeaders),
    );
  }

  private readonly describe = certificateDescriber("client-tls");

  /** The certificate the client listener serves with now (none in cleartext). */
  certificates(): CertificateInfo[] {
    return this.describe(this.reloader?.material.cert);
  }

  listen(): Promise<URL> {
    return listenOn(
      this.server,
      this.opts.listen.host,
      this.opts.listen.port,
      this.opts.clientTls ? "https" : "http",
    );
  }

  /**
   * No new connections; GOAWAY to every client; their calls get up to graceMs. Past it,
   * `endCalls` ends the calls still running with a status (UNAVAILABLE, as trailers: see
   * service.ts) and they get a moment to send it; only then are the connections cut. Cutting them
   * first would reset every call on them, which a gRPC client reads as INTERNAL.
   */
  async close(graceMs: number, endCalls: () => void = () => undefined): Promise<void> {
    this.server.close();
    for (const s of this.sessions) s.close();
    await this.sessionsGone(graceMs);
    if (this.sessions.size > 0) {
      endCalls();
      await this.sessionsGone(STATUS_FLUSH_MS);
    }
    for (const s of this.sessions) s.destroy();
    this.reloader?.close();
  }

  private async sessionsGone(ms: number): Promise<void> {
    const deadline = Date.now() + ms;
    while (this.sessions.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  }

  destroy(): void {
    this.server.close();
    for (const s of this.sessions) s.destroy();
    this.reloader?.close();
  }

  private onSession(s: ServerHttp2Session): void {
    widenWindow(s);
    this.sessions.add(s);
    s.once("close", () => this.sessions.delete(s));
    s.on("error", () => undefined);
  }

  /**
   * A reset the client sent (CANCEL, its deadline) is its own business. Any other error on a
   * client's stream made Node reset the call with INTERNAL_ERROR, which a gRPC client reads as
   * INTERNAL, not as a status grpc-proxy chose: worth an operator's look, with what caused it.
   */
  private onStreamError(stream: ServerHttp2Stream, err: NodeJS.ErrnoException): void {
    if (err.code === "ERR_HTTP2_STREAM_ERROR" && !err.message.includes("INTERNAL_ERROR")) return;
    this.logger.warn(
      {
        err: err.message,
        code: err.code,
        stream: stream.id,
        headersSent: stream.headersSent,
        sessionClosed: stream.session?.closed,
      },
      "a client's call was reset after an error on its stream",
    );
  }

  private onStream(
    stream: ServerHttp2Stream,
    headers: IncomingHttpHeaders,
    flags: number,
    rawHeaders: string[],
  ): void {
    stream.on("error", (err: NodeJS.ErrnoException) => this.onStreamError(stream, err));
    void this.calls.onStream(stream, headers, flags, rawHeaders);
  }
}

/** The worker listeners: the CONNECT listener and, through the callback proxy, the worker TLS listener. */
export class WorkerListeners {
  readonly connect: HttpService;
  private readonly workerTls: TlsFrontend | undefined;
  private readonly reloader: TlsReloader | undefined;

  constructor(
    private readonly opts: Pick<GrpcProxyOptions, "listen" | "connectPort" | "workerTls">,
    tunnels: Tunnels,
    state: ProxyState,
    { logger, registry }: ListenerContext,
  ) {
    this.connect = createHttpService({
      name: "grpc-proxy-connect",
      listen: { host: opts.listen.host, port: opts.connectPort },
      logger,
      registry,
      router: new Router(),
      ready: () => state.ready,
    });
    this.connect.server.on("connect", (req, socket: Socket, head: Buffer) =>
      tunnels.onConnect(req, socket, head),
    );
    if (opts.workerTls) {
      const reloader = new TlsReloader(
        "grpc-worker-listener",
        { certFile: opts.workerTls.certFile, keyFile: opts.workerTls.keyFile },
        (m) => this.workerTls?.setCertificate(m.cert!, m.key!),
        logger,
        registry,
      );
      this.reloader = reloader;
      // TLS with the pod certificate, then the same CONNECT inside
      this.workerTls = createTlsFrontend({
        tls: { cert: reloader.material.cert, key: reloader.material.key, ALPNProtocols: ["http/1.1"] },
        route: (s) => this.connect.server.emit("connection", s),
        onHandshakeError: (err) => logger.debug({ err: err.message }, "worker TLS handshake failed"),
      });
    }
  }

  private readonly describe = certificateDescriber("worker-tls");

  /** The certificate the worker TLS listener serves with now (none without it). */
  certificates(): CertificateInfo[] {
    return this.describe(this.reloader?.material.cert);
  }

  /** The CONNECT listener's URL, then the worker TLS listener's (if any). */
  async listen(): Promise<{ connect: URL; workerTls: URL | undefined }> {
    const connect = await this.connect.listen();
    const workerTls = this.workerTls
      ? await this.workerTls.listen(this.opts.listen.host, this.opts.workerTls!.port)
      : undefined;
    return { connect, workerTls };
  }

  /** Worker TLS connections are cut (their tunnels are ended by then); the CONNECT listener drains. */
  async close(): Promise<void> {
    this.workerTls?.destroy();
    await this.connect.close(1000);
    this.reloader?.close();
  }

  destroy(): void {
    this.workerTls?.destroy();
    this.connect.destroy();
    this.reloader?.close();
  }
}

/**
 * The URI workers open their tunnels at, put in every work message: the shared connect URL if one
 * is set, else this pod's name, on the callback proxy's worker domain (workers in another network)
 * or on the headless service (in-cluster).
 */
export function connectUriFor(
  opts: Pick<GrpcProxyOptions, "listen" | "sharedConnectUrl" | "callbackProxy" | "serviceDomain">,
  connectPort: string,
): string {
  if (opts.sharedConnectUrl) return opts.sharedConnectUrl;
  const ip = ownPodIp(opts.listen.host, "grpcproxy.workerConnectBaseURL");
  // through the proxy the server name alone routes the tunnel: <dashed-ip>.<workerDomain>
  return opts.callbackProxy
    ? `https://${dashIp(ip)}.${opts.callbackProxy.workerDomain}:${opts.callbackProxy.port}${CONNECT_PATH}`
    : `http://${podHost(ip, "grpc", opts.serviceDomain)}:${connectPort}${CONNECT_PATH}`;
}

function listenOn(
  server: Http2Server | Http2SecureServer,
  host: string,
  port: number,
  scheme: string,
): Promise<URL> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      const a = server.address() as { port: number } | null;
      resolve(new URL(`${scheme}://${formatHostPort({ host, port: a?.port ?? port })}`));
    });
  });
}
