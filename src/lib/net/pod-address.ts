// Pod addresses, as cluster DNS names each pod behind a headless Service:
// `<dashed-ip>.<service>.<service domain>` (10.0.1.5 is 10-0-1-5.invocation.nvcf.svc.cluster.local).
// A replica builds its own from the IPv4 it listens on; the callback proxy reads one back into an
// IP it may connect to; the stack CA issues each pod a certificate for its name. One place for the
// form, so a name one part builds is a name the others accept.
import { isIPv4 } from "node:net";
import { dashIp, undashIp } from "./address.js";

/** The headless Services whose pods are addressed by name (deploy/layout.ts renders them). */
export const POD_SERVICES = { invocation: "invocation", grpc: "grpc-headless" } as const;
export type PodService = keyof typeof POD_SERVICES;

/** The DNS name of the pod with IPv4 `ip` behind a headless Service. */
export function podHost(ip: string, service: PodService, serviceDomain: string): string {
  return `${dashIp(ip)}.${POD_SERVICES[service]}.${serviceDomain}`;
}

/** The IPv4 that a pod host name of `service` names, or undefined when `host` is not one. */
export function podIpOf(host: string, service: PodService, serviceDomain: string): string | undefined {
  const suffix = `.${POD_SERVICES[service]}.${serviceDomain}`;
  if (!host.endsWith(suffix)) return undefined;
  const label = host.slice(0, -suffix.length);
  return label.includes(".") ? undefined : undashIp(label);
}

/**
 * The pod's own IPv4 address, from the host it listens on: a pod address cannot be built from a
 * wildcard or a name, so that is refused with the setting that gives the address instead.
 */
export function ownPodIp(listenHost: string, instead: string): string {
  if (!isIPv4(listenHost) || listenHost === "0.0.0.0")
    throw new Error(
      `cannot build the pod address from listen host ${listenHost}: listen on the pod's IPv4 address (POD_IP) or set ${instead}`,
    );
  return listenHost;
}
