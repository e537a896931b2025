// The public face of lib/kube/: a thin Kubernetes API client (client.ts) and a list-then-watch loop (watch.ts).
export * from "./client.js";
export * from "./watch.js";
