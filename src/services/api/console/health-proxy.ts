// The health page's callback proxy row: HAProxy's own /health on its admin listener
// (workerCallbackProxy.metricsListen; haproxy-config.ts), asked with a short deadline: 200 is up,
// 503 is a drain under way (the keeper withdrew readiness), no answer is down. Where the API cannot
// reach that listener (a pod's wildcard address, no healthUrl), the row says so instead of guessing.
import type { ConsoleDeps } from "./context.js";
import type { Row } from "./health-row.js";

async function probe(url: string, timeoutMs: number): Promise<Row> {
  const started = Date.now();
  let status: number;
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(timeoutMs), redirect: "manual" });
    status = r.status;
    await r.body?.cancel();
  } catch (err) {
    const e = err as Error & { cause?: { code?: string } };
    const why = e.name === "TimeoutError" ? `no answer within ${timeoutMs} ms` : (e.cause?.code ?? e.message);
    return { component: "callback-proxy", state: "down", where: url, detail: `/health unreachable: ${why}` };
  }
  const ms = Date.now() - started;
  if (status === 200)
    return {
      component: "callback-proxy",
      state: "up",
      where: url,
      detail: `/health answered 200 in ${ms} ms`,
    };
  if (status === 503)
    return {
      component: "callback-proxy",
      state: "draining",
      where: url,
      detail: "/health answered 503: the proxy is draining (readiness withdrawn; callbacks in flight finish)",
    };
  return { component: "callback-proxy", state: "degraded", where: url, detail: `/health answered ${status}` };
}

/** The callback proxy's row; none while workerCallbackProxy.enabled is false. */
export async function callbackProxyRows(c: ConsoleDeps): Promise<Row[]> {
  const p = c.callbackProxy;
  if (!p) return [];
  if ("why" in p) return [{ component: "callback-proxy", state: "unknown", detail: `not asked: ${p.why}` }];
  return [await c.probes.get(`proxy ${p.url}`, () => probe(p.url, c.probeTimeoutMs))];
}
