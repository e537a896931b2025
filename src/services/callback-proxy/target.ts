// What the worker callback proxy accepts, decided before any connection upstream is opened: a
// forward-proxy request whose absolute-form target is exactly a pod address,
// http://<dashed-ipv4>.invocation.<service domain>:<port>, inside the configured pod networks, and
// whose path is exactly the callback path. The pod's address is parsed out of the name itself; no
// DNS is ever asked, so there is nothing to rebind.
import { CallplaneError } from "../../lib/errors.js";
import { type Cidr, cidrContains, podIpOf } from "../../lib/net/index.js";
import { ATTACH_PATH } from "../../lib/contract.js";

export interface TargetRules {
  serviceDomain: string;
  /** The port pod-addressed targets must name (8443 with upstream TLS, else the plain port). */
  port: number;
  podNetworks: Cidr[];
}

export interface PodTarget {
  /** 10-0-1-5.invocation.nvcf.svc.cluster.local */
  podName: string;
  ip: string;
  port: number;
  /** podName:port, as a Host header would carry it */
  authority: string;
}

/** Checks a pod authority (`name:port`), as found in an absolute URI or a CONNECT request line. */
export function checkAuthority(authority: string, rules: TargetRules): PodTarget {
  const m = /^([a-z0-9.-]+):(\d{1,5})$/i.exec(authority);
  if (!m)
    throw new CallplaneError(
      "PROXY_TARGET_INVALID",
      `the target authority ${JSON.stringify(authority.slice(0, 100))} is not <dashed-ip>.invocation.${rules.serviceDomain}:${rules.port}`,
    );
  const host = m[1].toLowerCase();
  const port = Number(m[2]);
  const ip = podIpOf(host, "invocation", rules.serviceDomain);
  if (!ip) {
    throw new CallplaneError(
      "PROXY_TARGET_INVALID",
      `the target host ${JSON.stringify(host.slice(0, 100))} is not a pod address of the form <dashed-ipv4>.invocation.${rules.serviceDomain}`,
    );
  }
  if (port !== rules.port)
    throw new CallplaneError(
      "PROXY_TARGET_INVALID",
      `the target port ${port} is not the pods' worker port ${rules.port}`,
    );
  if (!rules.podNetworks.some((n) => cidrContains(n, ip))) {
    throw new CallplaneError(
      "PROXY_TARGET_FORBIDDEN",
      `the pod address ${ip} is outside the pod networks (${rules.podNetworks.map((n) => n.text).join(", ")})`,
    );
  }
  return { podName: host, ip, port, authority: `${host}:${port}` };
}

/**
 * Checks a forward-proxy request target. The path is checked first (anything but the callback path
 * is 404, whatever the target), then the form of the target.
 */
export function checkTarget(rawUrl: string, rules: TargetRules): PodTarget & { path: string } {
  const m = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#]*)([^?#]*)(\?[^#]*)?(#.*)?$/.exec(rawUrl);
  if (!m) {
    if (rawUrl.startsWith("/")) {
      if (rawUrl.split("?")[0] !== ATTACH_PATH)
        throw new CallplaneError("NOT_FOUND", `only ${ATTACH_PATH} is forwarded`);
      throw new CallplaneError(
        "PROXY_TARGET_INVALID",
        `send a forward-proxy request with an absolute-form target (POST http://<dashed-ip>.invocation.${rules.serviceDomain}:${rules.port}${ATTACH_PATH}), not an origin-form path`,
      );
    }
    throw new CallplaneError("PROXY_TARGET_INVALID", "the request target is not an absolute URI");
  }
  const [, scheme, authority, path, query, fragment] = m;
  if (path !== ATTACH_PATH)
    throw new CallplaneError(
      "NOT_FOUND",
      `only ${ATTACH_PATH} is forwarded, not ${JSON.stringify(path.slice(0, 100) || "/")}`,
    );
  if (query !== undefined || fragment !== undefined)
    throw new CallplaneError("PROXY_TARGET_INVALID", "the callback target takes no query or fragment");
  if (scheme.toLowerCase() !== "http") {
    throw new CallplaneError(
      "PROXY_TARGET_INVALID",
      `the target scheme must be http (the proxy itself encrypts to the pod), not ${scheme}`,
    );
  }
  if (authority.includes("@"))
    throw new CallplaneError("PROXY_TARGET_INVALID", "the target must not carry user information");
  return { ...checkAuthority(authority, rules), path: path };
}
