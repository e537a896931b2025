// The public face of lib/process/: Child processes: the typed control pipe, supervision, and the one way a service's main runs.
// The rest of the code imports these names from here; files inside the folder import each other directly.
// (generated list)
export * from "./control.js";
export * from "./service-main.js";
export * from "./supervise.js";
