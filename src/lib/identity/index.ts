// The public face of lib/identity/: Who a caller is: scopes and principals, admin tokens, API keys and service tokens, worker identities, and the pod tokens of Kubernetes workers.
// The rest of the code imports these names from here; files inside the folder import each other directly.
// (generated list)
export * from "./admin-token.js";
export * from "./credentials.js";
export * from "./pod-token.js";
export * from "./scopes.js";
export * from "./worker-identity.js";
