// The health page's MEK provider row: which provider this API holds (file, env or a plugin's own
// name), the key ids it serves and which one is primary, how its last reload went, and a round trip
// (32 random bytes wrapped and unwrapped under the primary MEK, kept a few seconds) that shows the
// provider does its job now. Key material never leaves the secret store.
import type { ConsoleDeps } from "./context.js";
import type { Row } from "./health-row.js";
import { withDeadline } from "./probe-cache.js";

export async function mekRows(c: ConsoleDeps): Promise<Row[]> {
  const secrets = c.api.secrets;
  if (!secrets)
    return [{ component: "mek-provider", state: "unknown", detail: "this API runs without a secret store" }];
  const p = secrets.providerSummary();
  const keys = p.keyIds.map((k) => (k === p.primaryKid ? `${k} (primary)` : k)).join(", ") || "none";
  const reload = p.lastRefresh.ok
    ? `last reload ${p.lastRefresh.at ?? "never"}`
    : `the last reload failed at ${p.lastRefresh.at ?? "start"}: ${p.lastRefresh.error ?? "no reason given"} (the keys read before stay in use)`;
  const check = await c.probes
    .get("mek", async () => {
      const started = Date.now();
      const kid = await withDeadline(secrets.checkPrimaryMek(), c.probeTimeoutMs, "the MEK provider");
      return {
        ok: true as const,
        text: `wrapped and unwrapped a test key under ${kid} in ${Date.now() - started} ms`,
      };
    })
    .catch((err: unknown) => ({ ok: false as const, text: `the check failed: ${(err as Error).message}` }));
  return [
    {
      component: "mek-provider",
      id: p.name,
      state: check.ok ? (p.lastRefresh.ok ? "up" : "degraded") : "down",
      detail: `keys ${keys}; ${check.text}; ${reload}`,
    },
  ];
}
