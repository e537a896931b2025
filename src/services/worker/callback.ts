// How the worker reaches the replica that holds a request: the two request-attach calls, either
// straight to the target (resolving pod-address names itself where no cluster DNS does) or, when
// the message names a callback proxy, as forward-proxy requests inside TLS to that proxy.
import type { Readable } from "node:stream";
import type { SecureContext } from "node:tls";
import { Agent, type Dispatcher } from "undici";
import { H1_CONTENT_TYPE } from "../../lib/http/index.js";
import { SOCKET_BUFFER_BYTES } from "../../lib/net/index.js";
import type { LookupFunction } from "../../lib/net/index.js";
import { ATTACH_PATH, WORKER_INSTANCE_HEADER } from "../../lib/contract.js";
import { traceCallback, type TraceSpan } from "../../lib/tracing/index.js";

export interface CallbackTarget {
  /** http://<dashed-ip>.invocation.<domain>:<port> */
  targetUri: string;
  token: string;
  /** https://invocation.<workerDomain>:10084 when callbacks go through the proxy. */
  proxyUri?: string | undefined;
}

interface Route {
  origin: string;
  path: string;
  /** Extra request options: the Host header naming the pod, the TLS name of the proxy. */
  extra: { headers: Record<string, string>; servername?: string };
}

export class CallbackClient {
  readonly agent: Agent;

  /** WORKER_INSTANCE_HEADER on every callback, when the worker knows its instance id. */
  private readonly named: Record<string, string>;

  constructor(opts: {
    lookup: LookupFunction;
    secureContext: SecureContext | undefined;
    /** INSTANCE_ID: the replica shows it in the operator console as the worker that has the request. */
    instanceId?: string | undefined;
  }) {
    this.named = opts.instanceId ? { [WORKER_INSTANCE_HEADER]: opts.instanceId } : {};
    this.agent = new Agent({
      keepAliveTimeout: 30_000,
      connections: 256,
      connect: {
        lookup: opts.lookup,
        ...(opts.secureContext ? { secureContext: opts.secureContext } : {}),
        // 256 KiB socket buffers (undici's default for TLS is 16 KiB): fewer pauses per MiB streamed
        ...({ highWaterMark: SOCKET_BUFFER_BYTES } as object),
      },
    });
  }

  private route(t: CallbackTarget): Route {
    const target = new URL(t.targetUri);
    if (t.proxyUri) {
      // A forward-proxy request: absolute-form target inside the TLS session to the proxy (not a
      // CONNECT tunnel). The Host header names the pod, as the target does; the TLS session is with
      // the proxy, so its name is given explicitly (undici would otherwise take it from Host).
      const proxy = new URL(t.proxyUri);
      return {
        origin: proxy.origin,
        path: `${t.targetUri.replace(/\/+$/, "")}${ATTACH_PATH}`,
        extra: { headers: { host: target.host }, servername: proxy.hostname },
      };
    }
    return { origin: target.origin, path: ATTACH_PATH, extra: { headers: {} } };
  }

  /** GET request-attach: the rest of the request body. Headers must arrive within 5 s (contract §3.6). */
  fetchBody(t: CallbackTarget, signal: AbortSignal, trace?: TraceSpan): Promise<Dispatcher.ResponseData> {
    const { origin, path, extra } = this.route(t);
    const headers = {
      authorization: `Bearer ${t.token}`,
      accept: "application/octet-stream",
      ...this.named,
      ...extra.headers,
    };
    const span = trace && traceCallback(trace, "GET", t, headers);
    const call = this.agent.request({
      origin,
      path,
      method: "GET",
      headers,
      signal,
      headersTimeout: 5_000,
      bodyTimeout: 0,
      ...(extra.servername ? ({ servername: extra.servername } as object) : {}),
    });
    return span ? span.settle(call, true) : call;
  }

  /** POST request-attach: the framed response, streamed. The replica answers once the client has it all. */
  postResponse(
    t: CallbackTarget,
    body: Readable | Buffer,
    length: number | undefined,
    signal: AbortSignal,
    trace?: TraceSpan,
  ): Promise<Dispatcher.ResponseData> {
    const { origin, path, extra } = this.route(t);
    const headers: Record<string, string> = {
      authorization: `Bearer ${t.token}`,
      "content-type": H1_CONTENT_TYPE,
      ...(length !== undefined ? { "content-length": String(length) } : {}),
      ...this.named,
      ...extra.headers,
    };
    const span = trace && traceCallback(trace, "POST", t, headers);
    const call = this.agent.request({
      origin,
      path,
      method: "POST",
      headers,
      body,
      signal,
      headersTimeout: 0,
      bodyTimeout: 0,
      ...(extra.servername ? ({ servername: extra.servername } as object) : {}),
    });
    return span ? span.settle(call) : call;
  }

  close(): Promise<void> {
    return this.agent.close();
  }
}
