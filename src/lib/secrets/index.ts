// The public face of lib/secrets/: Secret material: envelope encryption, the MEK providers, and where secrets are laid out on disk.
// The rest of the code imports these names from here; files inside the folder import each other directly.
// (generated list)
export * from "./envelope.js";
export * from "./mek.js";
export * from "./paths.js";
