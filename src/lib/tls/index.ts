// The public face of lib/tls/: TLS: the stack CA and certificates, listeners that track their sockets, the handshake deadline, and certificate reloading.
// The rest of the code imports these names from here; files inside the folder import each other directly.
// (generated list)
export * from "./describe.js";
export * from "./handshake.js";
export * from "./listener.js";
export * from "./pki.js";
export * from "./reload.js";
