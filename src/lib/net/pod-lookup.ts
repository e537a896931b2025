// Name resolution for pod addresses (`<dashed-ip>.<service>.<service domain>`), which cluster DNS
// serves and nothing serves on one machine. The address is read from the name itself. Two users:
// the worker (its callbacks and tunnels: a static map for the proxy's names first, then pod names
// under the service domain, then the system's DNS) and the callback proxy (pod names only, never
// DNS, so a name can never be rebound to an address outside the pod networks).
import { lookup as dnsLookup, type LookupAddress, type LookupOptions } from "node:dns";
import { undashIp } from "./address.js";

export type LookupCallback = (
  err: NodeJS.ErrnoException | null,
  address: string | LookupAddress[],
  family?: number,
) => void;

export type LookupFunction = (hostname: string, options: LookupOptions, callback: LookupCallback) => void;

function answer(ip: string, options: LookupOptions, callback: LookupCallback): void {
  const family = ip.includes(":") ? 6 : 4;
  if (options.all) callback(null, [{ address: ip, family }]);
  else callback(null, ip, family);
}

/**
 * A resolver for names no DNS serves on one machine: the static map first (exact names, then
 * `*.<domain>` wildcards), then
 * `<dashed-ip>.<anything>.<service domain>` as that IP, as cluster DNS would; else the system's DNS.
 */
export function podAwareLookup(hostMap: ReadonlyMap<string, string>, serviceDomain: string): LookupFunction {
  return (hostname, options, callback) => {
    const name = hostname.toLowerCase();
    // `*.<domain>` entries cover every name one label below the domain (the proxy's pod names)
    let ip = hostMap.get(name) ?? hostMap.get(`*${name.slice(name.indexOf("."))}`);
    if (!ip && (name === serviceDomain || name.endsWith(`.${serviceDomain}`))) {
      ip = undashIp(name.split(".")[0]);
    }
    if (ip) answer(ip, options, callback);
    else dnsLookup(hostname, options, callback as never);
  };
}

/** A resolver that knows pod names only: the IP in the first label, or an error; never DNS. */
export function podNameLookup(): LookupFunction {
  return (hostname, options, callback) => {
    const ip = undashIp(hostname.split(".")[0] ?? "");
    if (!ip) callback(new Error(`${hostname} is not a pod address`), "");
    else answer(ip, options, callback);
  };
}
