// The public face of lib/grpc/: gRPC and HTTP/2: status codes and framing, service definitions, and forwarding streams between sessions.
// The rest of the code imports these names from here; files inside the folder import each other directly.
// (generated list)
export * from "./definition.js";
export * from "./h2-forward.js";
export * from "./protocol.js";
