// Integration tests of the admin token issuer over HTTP, and of its tokens against a real API.
import assert from "node:assert/strict";
import { test } from "node:test";
import { decodeJwt, decodeProtectedHeader } from "jose";
import { call, sampleFunction, startApi, startIssuer, type JsonResponse } from "../../testkit/index.js";

interface AdminKey {
  id: string;
  value: string;
  status: string;
  owner_type: string;
  owner_id: string;
  issuer_service_id: string;
  audience_service_ids: string[];
  description: string;
  created_at: string;
  expires_at: string;
  authorizations: {
    policies: Array<{
      aud: string;
      auds: string[];
      product: string;
      resources: Array<{ id: string; type: string }>;
      scopes: string[];
    }>;
  };
}

interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: string;
}

function assertProblem(r: JsonResponse<unknown>, status: number, code: string): Problem {
  assert.equal(r.status, status, r.text);
  assert.match(r.headers.get("content-type") ?? "", /^application\/problem\+json/);
  const p = r.body as Problem;
  assert.equal(p.code, code);
  assert.equal(p.status, status);
  assert.ok(p.title.length > 0);
  assert.ok(p.detail.length > 0);
  return p;
}

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

test("POST /v1/admin/keys returns an admin key in the contract's shape", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const r = await call<AdminKey>(`${issuer.url}/v1/admin/keys`, { body: {}, token: issuer.credential });
  assert.equal(r.status, 200, r.text);
  assert.match(r.headers.get("content-type") ?? "", /^application\/json/);
  const k = r.body;
  assert.match(k.id, UUID_RE);
  assert.equal(k.status, "ACTIVE");
  assert.equal(k.owner_type, "SYSTEM");
  assert.equal(k.owner_id, "admin-issuer-proxy");
  assert.equal(typeof k.issuer_service_id, "string");
  assert.ok(Array.isArray(k.audience_service_ids));
  assert.equal(typeof k.description, "string");

  const created = Date.parse(k.created_at);
  const expires = Date.parse(k.expires_at);
  assert.ok(!Number.isNaN(created) && !Number.isNaN(expires));
  assert.equal(expires - created, 12 * 3600 * 1000, "expires_at is 12 h after created_at");

  const policy = k.authorizations.policies[0];
  assert.equal(policy.product, "nv-cloud-functions");
  // plane-wide: "every account", then the NVCF resources
  assert.deepEqual(policy.resources, [
    { id: "*", type: "accounts" },
    { id: "*", type: "account-functions" },
    { id: "*", type: "authorized-functions" },
  ]);
  for (const scope of [
    "register_function",
    "list_functions",
    "list_functions_details",
    "deploy_function",
    "update_function",
    "update_secrets",
    "delete_function",
    "manage_telemetries",
    "manage_registry_credentials",
    "cluster-management",
  ]) {
    assert.ok(policy.scopes.includes(scope), `the admin key carries ${scope}`);
  }

  // the value is an ES256 JWT whose claims agree with the envelope
  assert.equal(decodeProtectedHeader(k.value).alg, "ES256");
  const claims = decodeJwt(k.value);
  assert.equal(claims.jti, k.id);
  assert.equal(claims.exp, expires / 1000);
  assert.equal(claims.iat, created / 1000);
  assert.deepEqual(claims.scopes, policy.scopes);
  assert.equal(claims.account, "*", "the issuer's tokens are plane-wide");

  // each call mints a new token
  const again = await call<AdminKey>(`${issuer.url}/v1/admin/keys`, { body: {}, token: issuer.credential });
  assert.equal(again.status, 200);
  assert.notEqual(again.body.id, k.id);
  assert.notEqual(again.body.value, k.value);
});

test("the issued token works against the API", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const { body: key } = await call<AdminKey>(`${issuer.url}/v1/admin/keys`, {
    body: {},
    token: issuer.credential,
  });

  const created = await call<{ function: { id: string; versionId: string } }>(
    `${api.url}/v2/nvcf/functions`,
    {
      token: key.value,
      body: sampleFunction("echo"),
    },
  );
  assert.equal(created.status, 200, created.text);
  const list = await call<{ functions: Array<{ name: string }> }>(`${api.url}/v2/nvcf/functions`, {
    token: key.value,
  });
  assert.equal(list.status, 200);
  assert.deepEqual(
    list.body.functions.map((f) => f.name),
    ["echo"],
  );
  const apiKey = await call<{ value: string }>(`${api.url}/v1/keys`, { token: key.value, body: {} });
  assert.equal(apiKey.status, 200, apiKey.text);
  assert.match(apiKey.body.value, /^nvapi-/);

  // an issuer with another signing key is not trusted by this API
  const stranger = await startApi(t);
  const foreignIssuer = await startIssuer(t, stranger.issuerKeyFile);
  const foreign = await call<AdminKey>(`${foreignIssuer.url}/v1/admin/keys`, {
    body: {},
    token: foreignIssuer.credential,
  });
  assertProblem(
    await call(`${api.url}/v2/nvcf/functions`, { token: foreign.body.value }),
    401,
    "TOKEN_INVALID",
  );
});

test("the issuer's ttl sets expires_at; a body is optional", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile, 600);
  const r = await call<AdminKey>(`${issuer.url}/v1/admin/keys`, {
    method: "POST",
    token: issuer.credential,
    headers: { "content-type": "application/json" },
  });
  assert.equal(r.status, 200, r.text);
  assert.equal(Date.parse(r.body.expires_at) - Date.parse(r.body.created_at), 600_000);
  const malformed = await call(`${issuer.url}/v1/admin/keys`, {
    method: "POST",
    token: issuer.credential,
    rawBody: "{",
    headers: { "content-type": "application/json" },
  });
  assertProblem(malformed, 400, "MALFORMED_JSON");
  // the body cannot choose scopes or a longer life: asking is refused, not silently ignored
  const asking = await call(`${issuer.url}/v1/admin/keys`, {
    method: "POST",
    token: issuer.credential,
    body: { scopes: ["everything"], ttlSeconds: 999_999_999 },
  });
  const p = assertProblem(asking, 400, "VALIDATION_FAILED");
  assert.match(p.detail, /empty body.*scopes, ttlSeconds/);
  assert.deepEqual(
    (asking.body as { errors?: Array<{ field: string }> }).errors?.map((e) => e.field),
    ["scopes", "ttlSeconds"],
  );
  assert.equal(
    (await call(`${issuer.url}/v1/admin/keys`, { method: "POST", body: {}, token: issuer.credential }))
      .status,
    200,
  );
});

test("GET /v1/admin/keys is 405 and other paths are 404", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const get = await call(`${issuer.url}/v1/admin/keys`);
  assertProblem(get, 405, "METHOD_NOT_ALLOWED");
  assert.equal(get.headers.get("allow"), "POST");
  for (const path of ["/", "/v1/admin", "/v1/admin/keys/1", "/v1/keys", "/v2/nvcf/functions"]) {
    assertProblem(await call(`${issuer.url}${path}`), 404, "NOT_FOUND");
    assertProblem(await call(`${issuer.url}${path}`, { body: {} }), 404, "NOT_FOUND");
  }
});

test("/health and /metrics answer", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const health = await call(`${issuer.url}/health`);
  assert.equal(health.status, 200);
  assert.deepEqual(health.body, { status: "ok", service: "admin-issuer" });

  await call(`${issuer.url}/v1/admin/keys`, { body: {}, token: issuer.credential });
  await call(`${issuer.url}/v1/admin/keys`, { body: {}, token: issuer.credential });
  const metrics = await fetch(`${issuer.url}/metrics`);
  assert.equal(metrics.status, 200);
  assert.match(metrics.headers.get("content-type") ?? "", /^text\/plain/);
  const text = await metrics.text();
  assert.match(text, /^callplane_admin_tokens_issued_total(\{[^}]*\})? 2$/m);
  assert.match(text, /^# TYPE callplane_http_requests_total counter$/m);

  const apiHealth = await call(`${api.url}/health`);
  assert.deepEqual(apiHealth.body, { status: "ok", service: "api" });
});
