// The public face of lib/net/: Addresses and sockets: host:port, dashed pod IPs, CIDRs, pod-aware name lookup, and the socket splice.
// The rest of the code imports these names from here; files inside the folder import each other directly.
// (generated list)
export * from "./address.js";
export * from "./peer-uid.js";
export * from "./pod-address.js";
export * from "./pod-lookup.js";
export * from "./splice.js";
