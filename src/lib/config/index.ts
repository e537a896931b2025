// One YAML environment file configures a whole stack. It is parsed once, against one schema:
// unknown keys are errors, every bad field is named by its path, defaults live here, and rules that
// relate two fields run right after the schema and name both. Single keys may be overridden from
// the environment as CALLPLANE__<SECTION>__<KEY>=value (SCREAMING_SNAKE per segment, YAML value).
//
// The folder: fields.ts (field types), one module per section with its rules beside it
// (kubernetes.ts holds what only `callplane render` reads), schema.ts (the sections in order),
// rules.ts (the cross-field rules in order), derived.ts (derived values) and loader.ts (loadConfig).
export { RESERVED_ANNOTATIONS, reservedAnnotation } from "./kubernetes.js";
export { ADMISSION_WEBHOOK_STOP, COMPUTE_AGENT_ACCOUNT, computeAgentUsername } from "./admission-webhook.js";
export { configSchema, type Config, type ConfigInput } from "./schema.js";
export { ConfigError, loadConfig, type LoadOptions } from "./loader.js";
export { localNatsClusterProblems } from "./nats.js";
export { callbackProxyHealth, localPodNetworkProblems } from "./callback-proxy.js";
export { databaseProblems } from "./api.js";
