// Where requests come in: the clients' listener (invocations, status polls, and the workers'
// callbacks when they come straight to the pod), the workers' TLS listener when callbacks come
// through the callback proxy (its certificate reloaded when the files change), and the pod address
// that tells workers where to call back.
import type { Server as HttpsServer } from "node:https";
import { isIP } from "node:net";
import { Router, createHttpService, type HttpService } from "../../lib/http/index.js";
import { createRegistry } from "../../lib/metrics.js";
import type { HostPort } from "../../lib/net/index.js";
import { certificateDescriber, TlsReloader, type CertificateInfo } from "../../lib/tls/index.js";
import { attachRequest, attachResponse } from "./attach.js";
import { invoke } from "./invoke.js";
import type { InvocationServiceOptions } from "./options.js";
import { pollStatus } from "./poll.js";
import type { ReplicaState } from "./state.js";
import { ATTACH_PATH } from "../../lib/contract.js";
import { ownPodIp, podHost } from "../../lib/net/index.js";

/**
 * The clients' routes, and (unless invocation.attachOnClientPort is off: every worker calls back
 * through the callback proxy to the worker TLS listener) the workers' attach routes, taken while
 * draining: the contract's plaintext pod port, where in-cluster workers call back.
 */
export function clientRouter(replica: ReplicaState, attach = true): Router {
  const router = new Router()
    .add("POST", "/v2/nvcf/pexec/functions/:fid", (ctx) => invoke(replica, ctx, ctx.params.fid, undefined))
    .add("POST", "/v2/nvcf/pexec/functions/:fid/versions/:vid", (ctx) =>
      invoke(replica, ctx, ctx.params.fid, ctx.params.vid),
    )
    .add("GET", "/v2/nvcf/pexec/status/:requestId", (ctx) => pollStatus(replica, ctx));
  return attach ? addAttachRoutes(router, replica) : router;
}

// With the callback proxy, workers' callbacks arrive on a TLS listener of their own, which serves
// nothing but the attach routes (and /health).
export function workerRouter(replica: ReplicaState): Router {
  return addAttachRoutes(new Router(), replica);
}

function addAttachRoutes(router: Router, replica: ReplicaState): Router {
  return router
    .add("GET", ATTACH_PATH, (ctx) => attachRequest(replica, ctx), { duringDrain: true })
    .add("POST", ATTACH_PATH, (ctx) => attachResponse(replica, ctx), {
      duringDrain: true,
    });
}

/**
 * The clients' listener. It serves the Host names in `hosts` (global.hosts, then the replica's own
 * pod address and callback address once listen() knows them: the array is read per request), IP
 * literals and localhost; any other is refused with HOST_NOT_SERVED, as a page that rebinds its
 * own name to this address still sends that name. /metrics only where the operator says.
 */
export function createClientListener(
  replica: ReplicaState,
  listen: HostPort,
  opts: { hosts: readonly string[]; attach: boolean; metrics: boolean },
): HttpService {
  return createHttpService({
    name: "invocation",
    listen,
    logger: replica.logger,
    registry: replica.registry,
    router: clientRouter(replica, opts.attach),
    metrics: opts.metrics,
    hosts: opts.hosts,
    ready: () => replica.ready(),
    tracing: replica.tracing,
  });
}

/** The host name of a callback address when it is a name (an IP literal is always served). */
export function callbackHostName(address: string): string | undefined {
  const host = new URL(address).hostname.toLowerCase();
  return isIP(host.replace(/^\[|\]$/g, "")) === 0 ? host.replace(/\.$/, "") : undefined;
}

/** The workers' TLS listener, with the pod certificate. */
export class WorkerTlsListener {
  private readonly reloader: TlsReloader;
  private readonly http: HttpService;

  constructor(replica: ReplicaState, host: string, tls: { port: number; certFile: string; keyFile: string }) {
    this.reloader = new TlsReloader(
      "invocation-worker-listener",
      { certFile: tls.certFile, keyFile: tls.keyFile },
      (m) =>
        // (optional: the listener may not exist yet when the reloader calls)
        (this.http?.server as HttpsServer | undefined)?.setSecureContext({
          cert: m.cert,
          key: m.key,
          minVersion: "TLSv1.2",
        }),
      replica.logger,
      replica.registry,
    );
    this.http = createHttpService({
      name: "invocation-worker-tls",
      listen: { host, port: tls.port },
      logger: replica.logger,
      registry: createRegistry("invocation-worker-tls", { defaultMetrics: false }),
      metrics: false,
      router: workerRouter(replica),
      tls: {
        cert: this.reloader.material.cert,
        key: this.reloader.material.key,
        minVersion: "TLSv1.2",
        ALPNProtocols: ["http/1.1"],
      },
      ready: () => replica.ready(),
      tracing: replica.tracing,
    });
  }

  listen(): Promise<URL> {
    return this.http.listen();
  }

  private readonly describe = certificateDescriber("worker-tls");

  /** The certificate it serves with now (after any reload). */
  certificates(): CertificateInfo[] {
    return this.describe(this.reloader.material.cert);
  }

  /** Closes the listener and stops watching the certificate files. */
  async close(graceMs: number): Promise<void> {
    await this.http.close(graceMs);
    this.reloader.close();
  }

  destroy(): void {
    this.http.destroy();
    this.reloader.close();
  }
}

/** The callback target handed to workers: the pod address (or the configured self address). */
export function podAddress(opts: InvocationServiceOptions, url: URL, tlsUrl: URL | undefined): string {
  if (opts.selfAddress) return opts.selfAddress.replace(/\/+$/, "");
  const port = opts.callbackPort ?? (tlsUrl ? tlsUrl.port : url.port);
  // the scheme stays http even with TLS to the pod: the worker never dials the pod itself, it
  // sends a forward-proxy request to the callback proxy, which opens TLS to the pod
  return `http://${podHost(ownPodIp(opts.listen.host, "invocation.selfAddress"), "invocation", opts.serviceDomain)}:${port}`;
}
