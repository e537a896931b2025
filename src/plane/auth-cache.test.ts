import assert from "node:assert/strict";
import { test } from "node:test";
import { startApi } from "../../test/testkit/index.js";
import { deployFunction, metricValue } from "../../test/testkit/plane.js";
import { silentLogger } from "../lib/log.js";
import { createRegistry } from "../lib/metrics.js";
import { AuthCache, MAX_API_KEY_LENGTH } from "./auth-cache.js";

test("grants and refusals come from the API once, then from the cache", async (t) => {
  const api = await startApi(t);
  const fn = await deployFunction(api, "auth-cache-test");
  const registry = createRegistry("t", { defaultMetrics: false });
  const cache = new AuthCache({
    apiUrl: api.url,
    serviceToken: api.serviceToken("invocation"),
    ttlMs: 10_000,
    negativeTtlMs: 10_000,
    maxEntries: 100,
    logger: silentLogger(),
    registry,
  });
  t.after(() => cache.destroy());
  const [a, b] = await Promise.all([
    cache.authorize(fn.apiKey, fn.functionId),
    cache.authorize(fn.apiKey, fn.functionId),
  ]);
  assert.equal(a.functionId, fn.functionId);
  assert.equal(a.functionVersions[0].functionVersionId, fn.versionId);
  assert.strictEqual(a, b, "concurrent misses share one lookup");
  await cache.authorize(fn.apiKey, fn.functionId);
  await assert.rejects(cache.authorize("nvapi-wrong", fn.functionId), { status: 401 });
  await assert.rejects(cache.authorize("nvapi-wrong", fn.functionId), { status: 401 });
  assert.equal(await metricValue(registry, "callplane_invocation_auth_lookups_total", { result: "miss" }), 2);
  assert.equal(await metricValue(registry, "callplane_invocation_auth_lookups_total", { result: "hit" }), 2);
});

test("a bearer value longer than any API key is refused at once, naming the Authorization header, without asking the API", async (t) => {
  const registry = createRegistry("t", { defaultMetrics: false });
  // no API listens here: a lookup would fail with UNAVAILABLE
  const cache = new AuthCache({
    apiUrl: "http://127.0.0.1:9",
    serviceToken: "unused",
    ttlMs: 10_000,
    negativeTtlMs: 10_000,
    maxEntries: 100,
    logger: silentLogger(),
    registry,
  });
  t.after(() => cache.destroy());
  await assert.rejects(
    cache.authorize(`nvapi-${"x".repeat(10_000)}`, "00000000-0000-0000-0000-000000000000"),
    {
      code: "TOKEN_INVALID",
      status: 401,
      message: new RegExp(
        `Authorization header is 10006 characters long, longer than any API key \\(at most ${MAX_API_KEY_LENGTH}\\)`,
      ),
    },
  );
  assert.equal(await metricValue(registry, "callplane_invocation_auth_lookups_total"), 0);
});
