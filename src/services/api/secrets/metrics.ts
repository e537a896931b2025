// The secret store's metrics, made once per store and counted into by keys.ts, rotation.ts and
// store.ts alike. None of them counts anything about a plaintext value.
import { Counter, Gauge, type Registry } from "../../../lib/metrics.js";

/** The secret store's metrics, registered in this order (the order /metrics lists them in). */
export function createSecretMetrics(registry: Registry) {
  return {
    encryptions: new Counter({
      name: "callplane_secret_encryptions_total",
      help: "Secret values and NEKs encrypted, by what",
      labelNames: ["what"],
      registers: [registry],
    }),
    decryptions: new Counter({
      name: "callplane_secret_decryptions_total",
      help: "Secret values decrypted, by result",
      labelNames: ["result"],
      registers: [registry],
    }),
    cacheLookups: new Counter({
      name: "callplane_secret_nek_cache_lookups_total",
      help: "Unwrapped-NEK cache lookups, by result (stale: used past its TTL because the MEK provider failed)",
      labelNames: ["result"],
      registers: [registry],
    }),
    providerErrors: new Counter({
      name: "callplane_secret_mek_provider_errors_total",
      help: "MEK provider failures, by operation",
      labelNames: ["op"],
      registers: [registry],
    }),
    providerUp: new Gauge({
      name: "callplane_secret_mek_provider_up",
      help: "1 when the last MEK provider refresh succeeded",
      registers: [registry],
    }),
    mekGauge: new Gauge({
      name: "callplane_secret_meks",
      help: "MEKs by state",
      labelNames: ["state"],
      registers: [registry],
    }),
    toRewrap: new Gauge({
      name: "callplane_secret_neks_not_under_primary",
      help: "NEKs wrapped with a MEK other than the primary (what a rotation still has to re-wrap)",
      registers: [registry],
    }),
    rewrapped: new Counter({
      name: "callplane_secret_neks_rewrapped_total",
      help: "NEKs re-wrapped under the primary MEK by this replica",
      registers: [registry],
    }),
    reencrypted: new Counter({
      name: "callplane_secret_values_reencrypted_total",
      help: "Secret values moved to a namespace's new NEK by this replica",
      registers: [registry],
    }),
  };
}
export type SecretMetrics = ReturnType<typeof createSecretMetrics>;
