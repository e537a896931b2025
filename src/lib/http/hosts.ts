// Which `Host` names a listener serves. A name a listener does not serve is refused (HOST_NOT_SERVED)
// before anything else: a web page that rebinds its own DNS name to 127.0.0.1 still sends its own
// name, so checking it is what keeps browsers out of loopback services. IP literals and localhost
// are always served (a page cannot make the browser send them for its own origin).
import { isIP } from "node:net";
import { CallplaneError } from "../errors.js";

/** Names a listener serves besides IP literals and localhost: exact names, or `*.suffix` for any name under suffix. */
export type HostNames = readonly string[];

/** The host part of a Host header or :authority (no port, no brackets, lower case, no trailing dot). */
export function hostName(header: string): string {
  let h = header.trim().toLowerCase();
  if (h.startsWith("[")) {
    const end = h.indexOf("]");
    return end === -1 ? h : h.slice(1, end);
  }
  const colon = h.lastIndexOf(":");
  if (colon !== -1 && h.indexOf(":") === colon) h = h.slice(0, colon);
  return h.endsWith(".") ? h.slice(0, -1) : h;
}

/** Whether a listener that serves `names` serves the host in this Host header. */
export function hostServed(header: string | undefined, names: HostNames): boolean {
  if (header === undefined) return false;
  const h = hostName(header);
  if (h === "") return false;
  if (isIP(h) !== 0) return true;
  if (h === "localhost" || h.endsWith(".localhost")) return true;
  for (const n of names) {
    const name = n.toLowerCase();
    if (name.startsWith("*.")) {
      if (h.endsWith(name.slice(1)) && h.length > name.length - 1) return true;
    } else if (h === name) return true;
  }
  return false;
}

/** Refuses a Host this listener does not serve, naming what it does serve. */
export function requireHostServed(header: string | undefined, names: HostNames, service: string): void {
  if (hostServed(header, names)) return;
  const served = ["an IP address", "localhost", ...names].join(", ");
  throw new CallplaneError(
    "HOST_NOT_SERVED",
    header === undefined
      ? `the request names no host; ${service} serves ${served}`
      : `${service} does not serve the host "${hostName(header).slice(0, 253)}"; it serves ${served} (add a name to global.hosts to serve it)`,
  );
}
