// The public face of lib/nats/: NATS: connecting, subjects and buckets, the work queues, who may do what, credentials, and running nats-server.
// The rest of the code imports these names from here; files inside the folder import each other directly.
// (generated list)
export * from "./access.js";
export * from "./admin.js";
export * from "./cluster.js";
export * from "./connection.js";
export * from "./credit-pull.js";
export * from "./credentials.js";
export * from "./health.js";
export * from "./permissions.js";
export * from "./replies.js";
export * from "./server-auth.js";
export * from "./server.js";
export * from "./stream-publish.js";
export * from "./subjects.js";
export * from "./work-queues.js";
