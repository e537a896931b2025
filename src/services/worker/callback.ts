// How the worker reaches the replica that holds a request: the two request-attach calls, either
// straight to the target (resolving pod-address names itself where no cluster DNS does) or, when
// the message names a callback proxy, as forward-proxy requests inside TLS to that proxy.
import { lookup as dnsLookup, type LookupAddress, type LookupOptions } from "node:dns";
import type { Readable } from "node:stream";
import { Agent, type Dispatcher } from "undici";
import { H1_CONTENT_TYPE } from "../../lib/h1.js";
import { undashIp } from "../../lib/net.js";

export const ATTACH_PATH = "/v2/nvcf/worker/request-attach";

type LookupCallback = (
  err: NodeJS.ErrnoException | null,
  address: string | LookupAddress[],
  family?: number,
) => void;

/**
 * A resolver for names no DNS serves on one machine: the static map first, then
 * `<dashed-ip>.<anything>.<service domain>` as that IP, as cluster DNS would; else the system's DNS.
 */
export function podAwareLookup(hostMap: Map<string, string>, serviceDomain: string) {
  return (hostname: string, options: LookupOptions, callback: LookupCallback): void => {
    const name = hostname.toLowerCase();
    let ip = hostMap.get(name);
    if (!ip && (name === serviceDomain || name.endsWith(`.${serviceDomain}`))) {
      ip = undashIp(name.split(".")[0]);
    }
    if (ip) {
      const family = ip.includes(":") ? 6 : 4;
      if (options.all) callback(null, [{ address: ip, family }]);
      else callback(null, ip, family);
      return;
    }
    dnsLookup(hostname, options, callback as never);
  };
}

export interface CallbackTarget {
  /** http://<dashed-ip>.invocation.<domain>:<port> */
  targetUri: string;
  token: string;
  /** https://invocation.<workerDomain>:10084 when callbacks go through the proxy. */
  proxyUri?: string | undefined;
}

export class CallbackClient {
  readonly agent: Agent;

  constructor(opts: { hostMap: Map<string, string>; serviceDomain: string; caPem?: string | undefined }) {
    this.agent = new Agent({
      keepAliveTimeout: 30_000,
      connections: 256,
      connect: {
        lookup: podAwareLookup(opts.hostMap, opts.serviceDomain),
        ...(opts.caPem ? { ca: opts.caPem } : {}),
      },
    });
  }

  private route(t: CallbackTarget): { origin: string; path: string } {
    if (t.proxyUri) {
      // Forward-proxy request: absolute-form target inside the TLS session to the proxy (not CONNECT).
      return { origin: new URL(t.proxyUri).origin, path: `${t.targetUri.replace(/\/+$/, "")}${ATTACH_PATH}` };
    }
    return { origin: new URL(t.targetUri).origin, path: ATTACH_PATH };
  }

  /** GET request-attach: the rest of the request body. Headers must arrive within 5 s (contract §3.6). */
  fetchBody(t: CallbackTarget, signal: AbortSignal): Promise<Dispatcher.ResponseData> {
    const { origin, path } = this.route(t);
    return this.agent.request({
      origin,
      path,
      method: "GET",
      headers: { authorization: `Bearer ${t.token}`, accept: "application/octet-stream" },
      signal,
      headersTimeout: 5_000,
      bodyTimeout: 0,
    });
  }

  /** POST request-attach: the framed response, streamed. The replica answers once the client has it all. */
  postResponse(
    t: CallbackTarget,
    body: Readable | Buffer,
    length: number | undefined,
    signal: AbortSignal,
  ): Promise<Dispatcher.ResponseData> {
    const { origin, path } = this.route(t);
    return this.agent.request({
      origin,
      path,
      method: "POST",
      headers: {
        authorization: `Bearer ${t.token}`,
        "content-type": H1_CONTENT_TYPE,
        ...(length !== undefined ? { "content-length": String(length) } : {}),
      },
      body,
      signal,
      headersTimeout: 0,
      bodyTimeout: 0,
    });
  }

  close(): Promise<void> {
    return this.agent.close();
  }
}
