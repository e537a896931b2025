// The public face of lib/http/: HTTP/1.1: the service shell, router, problem+json answers, bodies, header rules, streaming and the h1 framing.
// The rest of the code imports these names from here; files inside the folder import each other directly.
// (generated list)
export * from "./body.js";
export * from "./forward.js";
export * from "./h1.js";
export * from "./headers.js";
export * from "./hosts.js";
export * from "./problem.js";
export * from "./router.js";
export * from "./server.js";
export * from "./stream.js";
