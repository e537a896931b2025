// Integration tests of the control-plane API over HTTP: a real API on 127.0.0.1:0 with a fresh
// SQLite store per test, driven the way a client (or callplane's own services) would drive it.
import assert from "node:assert/strict";
import { generateKeyPairSync, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { request } from "node:http";
import { connect as netConnect } from "node:net";
import { describe, test } from "node:test";
import { SignJWT, importPKCS8 } from "jose";
import { sha256Hex } from "../../../src/lib/identity/index.js";
import { Router, createHttpService, readJson } from "../../../src/lib/http/index.js";
import { silentLogger } from "../../../src/lib/log.js";
import { createRegistry } from "../../../src/lib/metrics.js";
import { waitFor } from "../../testkit/client.js";
import {
  call,
  sampleDeployment,
  sampleFunction,
  startApi,
  type ApiFixture,
  type JsonResponse,
} from "../../testkit/index.js";

interface Problem {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: string;
  requiredScope?: string;
  errors?: Array<{ field: string; message: string }>;
}

interface InstanceDto {
  instanceId: string;
  functionId: string;
  functionVersionId: string;
  instanceType: string;
  instanceStatus: string;
  gpu: string;
  backend: string;
  location: string;
  message?: string;
}

interface FunctionDto {
  id: string;
  versionId: string;
  ncaId: string;
  name: string;
  status: string;
  inferenceUrl: string;
  inferencePort: number;
  health: { protocol: string; uri: string; port: number; timeout: string; expectedStatusCode: number };
  healthUri: string;
  containerImage: string;
  containerArgs?: string;
  containerEnvironment: Array<{ key: string; value: string }>;
  apiBodyFormat: string;
  functionType: string;
  tags: string[];
  description?: string;
  createdAt: string;
  activeInstances: InstanceDto[];
}

interface DeploymentDto {
  deploymentId: string;
  functionId: string;
  functionVersionId: string;
  functionName: string;
  ncaId: string;
  functionStatus: string;
  healthInfo: Array<{ gpu: string; backend: string; instanceType: string; error: string }>;
  deploymentSpecifications: Array<Record<string, unknown>>;
  instances: InstanceDto[];
  createdAt: string;
  lastUpdatedAt: string;
}

interface KeyDto {
  id: string;
  value?: string;
  status: string;
  owner_type: string;
  owner_id: string;
  description: string;
  created_at: string;
  expires_at: string;
  revoked_at?: string;
  authorizations: { policies: Array<{ product: string; scopes: string[] }> };
}

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const API_KEY_DEFAULT_SCOPES = [
  "invoke_function",
  "list_functions",
  "queue_details",
  "list_functions_details",
];

/** Asserts an RFC 7807 answer with callplane's stable code, and returns it for further checks. */
function assertProblem(r: JsonResponse<unknown>, status: number, code: string): Problem {
  assert.equal(r.status, status, `expected ${status} ${code}, got ${r.status}: ${r.text}`);
  assert.match(r.headers.get("content-type") ?? "", /^application\/problem\+json/);
  const p = r.body as Problem;
  assert.equal(p.code, code, r.text);
  assert.equal(p.status, status);
  assert.equal(typeof p.title, "string");
  assert.ok(p.title.length > 0, "title is not empty");
  assert.equal(typeof p.detail, "string");
  assert.ok(p.detail.length > 0, "detail is not empty");
  assert.equal(p.type, `urn:callplane:problem:${code.toLowerCase().replaceAll("_", "-")}`);
  return p;
}

function fields(p: Problem): string[] {
  assert.ok(Array.isArray(p.errors), `the problem lists its fields in errors: ${JSON.stringify(p)}`);
  return p.errors.map((e) => e.field);
}

async function createFunction(
  api: ApiFixture,
  token: string,
  name: string,
  extra: Record<string, unknown> = {},
): Promise<FunctionDto> {
  const r = await call<{ function: FunctionDto }>(`${api.url}/v2/nvcf/functions`, {
    token,
    body: sampleFunction(name, extra),
  });
  assert.equal(r.status, 200, r.text);
  return r.body.function;
}

async function deploy(api: ApiFixture, token: string, f: FunctionDto, body: unknown = sampleDeployment()) {
  const r = await call<{ deployment: DeploymentDto }>(
    `${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`,
    { token, body },
  );
  assert.equal(r.status, 200, r.text);
  return r.body.deployment;
}

async function createKey(
  api: ApiFixture,
  token: string,
  body: unknown = {},
  headers: Record<string, string> = {},
): Promise<KeyDto & { value: string }> {
  const r = await call<KeyDto & { value: string }>(`${api.url}/v1/keys`, { token, body, headers });
  assert.equal(r.status, 200, r.text);
  return r.body;
}

function instance(
  d: DeploymentDto,
  instanceId: string,
  status: "STARTING" | "ACTIVE" | "ERRORED" | "TERMINATED",
  message?: string,
) {
  const now = new Date().toISOString();
  return {
    instanceId,
    deploymentId: d.deploymentId,
    functionId: d.functionId,
    versionId: d.functionVersionId,
    status,
    instanceType: "local.cpu",
    gpu: "local",
    backend: "local",
    location: "test-host",
    ...(message !== undefined ? { message } : {}),
    createdAt: now,
    updatedAt: now,
  };
}

async function reportInstances(api: ApiFixture, instances: unknown[], reporter = "compute-test") {
  const r = await call(`${api.url}/v1/internal/instances`, {
    method: "PUT",
    token: api.serviceToken("compute"),
    body: { reporter, instances },
  });
  assert.equal(r.status, 204, r.text);
}

/** POSTs `total` bytes with chunked transfer encoding, honouring backpressure. */
function postChunked(url: string, token: string, total: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      { method: "POST", headers: { authorization: `Bearer ${token}`, "content-type": "application/json" } },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (c: string) => (body += c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    const chunk = "x".repeat(16 * 1024);
    let sent = 0;
    const pump = () => {
      while (sent < total) {
        sent += chunk.length;
        if (!req.write(chunk)) {
          req.once("drain", pump);
          return;
        }
      }
      req.end();
    };
    pump();
  });
}

const b64url = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");

describe("functions and versions", () => {
  test("creating a function answers 200 with an INACTIVE FunctionDto", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const r = await call<{ function: FunctionDto }>(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction("echo", {
        containerEnvironment: [{ key: "MODE", value: "fast" }],
        tags: ["demo"],
        description: "echoes",
      }),
    });
    assert.equal(r.status, 200, r.text);
    assert.match(r.headers.get("content-type") ?? "", /^application\/json/);
    const f = r.body.function;
    assert.match(f.id, UUID_RE);
    assert.match(f.versionId, UUID_RE);
    assert.notEqual(f.id, f.versionId);
    assert.equal(f.name, "echo");
    assert.equal(f.status, "INACTIVE");
    assert.equal(f.ncaId, "callplane");
    assert.equal(f.inferenceUrl, "/echo");
    assert.equal(f.inferencePort, 8000);
    assert.equal(f.containerImage, "local/echo");
    assert.deepEqual(f.health, {
      protocol: "HTTP",
      uri: "/health",
      port: 8000,
      timeout: "PT10S",
      expectedStatusCode: 200,
    });
    assert.equal(f.healthUri, "/health");
    assert.deepEqual(f.containerEnvironment, [{ key: "MODE", value: "fast" }]);
    assert.deepEqual(f.tags, ["demo"]);
    assert.equal(f.description, "echoes");
    assert.equal(f.apiBodyFormat, "CUSTOM");
    assert.equal(f.functionType, "DEFAULT");
    assert.deepEqual(f.activeInstances, []);
    assert.ok(!Number.isNaN(Date.parse(f.createdAt)), "createdAt is a time");
  });

  test("defaults fill what the request leaves out", async (t) => {
    const api = await startApi(t);
    const r = await call<{ function: FunctionDto }>(`${api.url}/v2/nvcf/functions`, {
      token: await api.adminToken(),
      body: { name: "minimal", inferenceUrl: "/infer", containerImage: "local/echo", inferencePort: 9000 },
    });
    assert.equal(r.status, 200, r.text);
    const f = r.body.function;
    assert.equal(f.inferencePort, 9000);
    assert.deepEqual(f.health, {
      protocol: "HTTP",
      uri: "/v2/health/ready",
      port: 9000,
      timeout: "PT10S",
      expectedStatusCode: 200,
    });
    assert.deepEqual(f.containerEnvironment, []);
    assert.deepEqual(f.tags, []);
  });

  test("a second function with the same name is 409 FUNCTION_NAME_TAKEN", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    await createFunction(api, admin, "echo");
    const r = await call(`${api.url}/v2/nvcf/functions`, { token: admin, body: sampleFunction("echo") });
    const p = assertProblem(r, 409, "FUNCTION_NAME_TAKEN");
    assert.match(p.detail, /echo/);
  });

  test("versions: add, list, ids, list versions, get", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f1 = await createFunction(api, admin, "echo");
    const other = await createFunction(api, admin, "other");

    const add = await call<{ function: FunctionDto }>(`${api.url}/v2/nvcf/functions/${f1.id}/versions`, {
      token: admin,
      body: sampleFunction("echo", { containerImage: "local/echo:v2" }),
    });
    assert.equal(add.status, 200, add.text);
    const f2 = add.body.function;
    assert.equal(f2.id, f1.id);
    assert.notEqual(f2.versionId, f1.versionId);
    assert.equal(f2.name, "echo");
    assert.equal(f2.status, "INACTIVE");
    assert.equal(f2.containerImage, "local/echo:v2");

    const list = await call<{ functions: FunctionDto[] }>(`${api.url}/v2/nvcf/functions`, { token: admin });
    assert.equal(list.status, 200);
    assert.deepEqual(
      list.body.functions.map((f) => f.versionId).sort(),
      [f1.versionId, f2.versionId, other.versionId].sort(),
    );

    const ids = await call<{ functionIds: string[] }>(`${api.url}/v2/nvcf/functions/ids`, { token: admin });
    assert.equal(ids.status, 200);
    assert.deepEqual(ids.body.functionIds.sort(), [f1.id, other.id].sort());

    const versions = await call<{ functions: FunctionDto[] }>(
      `${api.url}/v2/nvcf/functions/${f1.id}/versions`,
      {
        token: admin,
      },
    );
    assert.equal(versions.status, 200);
    assert.deepEqual(
      versions.body.functions.map((f) => f.versionId).sort(),
      [f1.versionId, f2.versionId].sort(),
    );
    assert.ok(versions.body.functions.every((f) => f.id === f1.id && f.name === "echo"));

    const get = await call<{ function: FunctionDto }>(
      `${api.url}/v2/nvcf/functions/${f1.id}/versions/${f2.versionId}`,
      { token: admin },
    );
    assert.equal(get.status, 200);
    assert.deepEqual(get.body.function, f2);
  });

  test("a new version must keep its function's name, and needs an existing function", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const renamed = await call(`${api.url}/v2/nvcf/functions/${f.id}/versions`, {
      token: admin,
      body: sampleFunction("not-echo"),
    });
    const p = assertProblem(renamed, 400, "VALIDATION_FAILED");
    assert.deepEqual(fields(p), ["name"]);

    const unknown = await call(`${api.url}/v2/nvcf/functions/${randomUUID()}/versions`, {
      token: admin,
      body: sampleFunction("echo"),
    });
    assertProblem(unknown, 404, "FUNCTION_NOT_FOUND");
  });

  test("PUT changes only the fields it names", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo", {
      containerEnvironment: [{ key: "MODE", value: "fast" }],
      tags: ["a"],
    });
    const path = `${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`;
    const put = await call<{ function: FunctionDto }>(path, {
      method: "PUT",
      token: admin,
      body: { description: "now described", inferenceUrl: "/v2/echo" },
    });
    assert.equal(put.status, 200, put.text);
    assert.equal(put.body.function.description, "now described");
    assert.equal(put.body.function.inferenceUrl, "/v2/echo");
    assert.deepEqual(put.body.function.containerEnvironment, [{ key: "MODE", value: "fast" }]);
    assert.deepEqual(put.body.function.tags, ["a"]);
    assert.equal(put.body.function.containerImage, "local/echo");

    const get = await call<{ function: FunctionDto }>(path, { token: admin });
    assert.deepEqual(get.body.function, put.body.function);

    const health = await call<{ function: FunctionDto }>(path, {
      method: "PUT",
      token: admin,
      body: { health: { uri: "/ready" } },
    });
    assert.equal(health.status, 200, health.text);
    assert.deepEqual(health.body.function.health, {
      protocol: "HTTP",
      uri: "/ready",
      port: 8000,
      timeout: "PT10S",
      expectedStatusCode: 200,
    });
    assert.equal(health.body.function.healthUri, "/ready");
    assert.deepEqual(health.body.function.containerEnvironment, [{ key: "MODE", value: "fast" }]);

    const env = await call<{ function: FunctionDto }>(path, {
      method: "PUT",
      token: admin,
      body: { containerEnvironment: [{ key: "MODE", value: "slow" }] },
    });
    assert.equal(env.status, 200, env.text);
    assert.deepEqual(env.body.function.containerEnvironment, [{ key: "MODE", value: "slow" }]);
    assert.equal(env.body.function.description, "now described");
  });

  test("PUT refuses a new name, unknown fields and unknown ids", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const path = `${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`;
    const renamed = await call(path, { method: "PUT", token: admin, body: { name: "other" } });
    assert.deepEqual(fields(assertProblem(renamed, 400, "VALIDATION_FAILED")), ["name"]);
    const same = await call(path, { method: "PUT", token: admin, body: { name: "echo" } });
    assert.equal(same.status, 200, same.text);
    const unknown = await call(path, { method: "PUT", token: admin, body: { colour: "red" } });
    assert.deepEqual(fields(assertProblem(unknown, 400, "VALIDATION_FAILED")), ["colour"]);
    const missing = await call(`${api.url}/v2/nvcf/functions/${f.id}/versions/${randomUUID()}`, {
      method: "PUT",
      token: admin,
      body: { description: "x" },
    });
    assertProblem(missing, 404, "VERSION_NOT_FOUND");
  });

  test("DELETE removes a version, and the function with its last version", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f1 = await createFunction(api, admin, "echo");
    const add = await call<{ function: FunctionDto }>(`${api.url}/v2/nvcf/functions/${f1.id}/versions`, {
      token: admin,
      body: sampleFunction("echo"),
    });
    const f2 = add.body.function;

    const del1 = await call(`${api.url}/v2/nvcf/functions/${f1.id}/versions/${f1.versionId}`, {
      method: "DELETE",
      token: admin,
    });
    assert.equal(del1.status, 204);
    assert.equal(del1.text, "");
    const gone = await call(`${api.url}/v2/nvcf/functions/${f1.id}/versions/${f1.versionId}`, {
      token: admin,
    });
    assertProblem(gone, 404, "VERSION_NOT_FOUND");
    const left = await call<{ functions: FunctionDto[] }>(`${api.url}/v2/nvcf/functions/${f1.id}/versions`, {
      token: admin,
    });
    assert.deepEqual(
      left.body.functions.map((f) => f.versionId),
      [f2.versionId],
    );

    const del2 = await call(`${api.url}/v2/nvcf/functions/${f1.id}/versions/${f2.versionId}`, {
      method: "DELETE",
      token: admin,
    });
    assert.equal(del2.status, 204);
    assertProblem(
      await call(`${api.url}/v2/nvcf/functions/${f1.id}/versions`, { token: admin }),
      404,
      "FUNCTION_NOT_FOUND",
    );
    const ids = await call<{ functionIds: string[] }>(`${api.url}/v2/nvcf/functions/ids`, { token: admin });
    assert.deepEqual(ids.body, { functionIds: [] });
    const again = await call(`${api.url}/v2/nvcf/functions/${f1.id}/versions/${f2.versionId}`, {
      method: "DELETE",
      token: admin,
    });
    assertProblem(again, 404, "FUNCTION_NOT_FOUND");

    // the name is free again
    await createFunction(api, admin, "echo");
  });

  test("a deployed version cannot be deleted (409 VERSION_DEPLOYED) until it is undeployed", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    await deploy(api, admin, f);
    const path = `${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`;
    const refused = await call(path, { method: "DELETE", token: admin });
    const p = assertProblem(refused, 409, "VERSION_DEPLOYED");
    assert.match(
      p.detail,
      new RegExp(`DELETE /v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`),
    );
    assert.equal((await call(path, { token: admin })).status, 200);

    const undeploy = await call(`${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`, {
      method: "DELETE",
      token: admin,
    });
    assert.equal(undeploy.status, 200, undeploy.text);
    assert.equal((await call(path, { method: "DELETE", token: admin })).status, 204);
  });
});

describe("deployments", () => {
  test("create, read (by version and by id), update and delete a deployment", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const path = `${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`;

    const created = await call<{ deployment: DeploymentDto }>(path, {
      token: admin,
      body: {
        deploymentSpecifications: [
          { gpu: "local", instanceType: "local.cpu", minInstances: 1, maxInstances: 2 },
        ],
      },
    });
    assert.equal(created.status, 200, created.text);
    const d = created.body.deployment;
    assert.match(d.deploymentId, UUID_RE);
    assert.equal(d.functionId, f.id);
    assert.equal(d.functionVersionId, f.versionId);
    assert.equal(d.functionName, "echo");
    assert.equal(d.ncaId, "callplane");
    assert.equal(d.functionStatus, "DEPLOYING");
    assert.deepEqual(d.healthInfo, []);
    assert.deepEqual(d.deploymentSpecifications, [
      { gpu: "local", instanceType: "local.cpu", minInstances: 1, maxInstances: 2, maxRequestConcurrency: 1 },
    ]);
    assert.ok(!Number.isNaN(Date.parse(d.createdAt)));
    assert.ok(!Number.isNaN(Date.parse(d.lastUpdatedAt)));

    const second = await call(path, { token: admin, body: sampleDeployment() });
    assertProblem(second, 409, "DEPLOYMENT_EXISTS");

    const byPath = await call<{ deployment: DeploymentDto }>(path, { token: admin });
    assert.equal(byPath.status, 200);
    assert.deepEqual(byPath.body.deployment, d);
    const byId = await call<{ deployment: DeploymentDto }>(
      `${api.url}/v2/nvcf/deployments/${d.deploymentId}`,
      {
        token: admin,
      },
    );
    assert.equal(byId.status, 200);
    assert.deepEqual(byId.body.deployment, d);

    const fn = await call<{ function: FunctionDto }>(
      `${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`,
      {
        token: admin,
      },
    );
    assert.equal(fn.body.function.status, "DEPLOYING");

    const updated = await call<{ deployment: DeploymentDto }>(path, {
      method: "PUT",
      token: admin,
      body: sampleDeployment(0, 3, 8),
    });
    assert.equal(updated.status, 200, updated.text);
    assert.equal(updated.body.deployment.deploymentId, d.deploymentId);
    assert.deepEqual(
      updated.body.deployment.deploymentSpecifications,
      sampleDeployment(0, 3, 8).deploymentSpecifications,
    );
    const reread = await call<{ deployment: DeploymentDto }>(path, { token: admin });
    assert.deepEqual(
      reread.body.deployment.deploymentSpecifications,
      sampleDeployment(0, 3, 8).deploymentSpecifications,
    );
    assert.equal(reread.body.deployment.createdAt, d.createdAt);

    const deleted = await call<{ deployment: DeploymentDto }>(path, { method: "DELETE", token: admin });
    assert.equal(deleted.status, 200, deleted.text);
    assert.equal(deleted.body.deployment.deploymentId, d.deploymentId);
    assert.equal(deleted.body.deployment.functionStatus, "INACTIVE");

    assertProblem(await call(path, { token: admin }), 404, "DEPLOYMENT_NOT_FOUND");
    assertProblem(
      await call(`${api.url}/v2/nvcf/deployments/${d.deploymentId}`, { token: admin }),
      404,
      "DEPLOYMENT_NOT_FOUND",
    );
    assertProblem(await call(path, { method: "DELETE", token: admin }), 404, "DEPLOYMENT_NOT_FOUND");
    assertProblem(
      await call(path, { method: "PUT", token: admin, body: sampleDeployment() }),
      404,
      "DEPLOYMENT_NOT_FOUND",
    );
    const after = await call<{ function: FunctionDto }>(
      `${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`,
      { token: admin },
    );
    assert.equal(after.body.function.status, "INACTIVE");

    // once undeployed, it can be deployed again
    await deploy(api, admin, f);
  });

  test("reading the deployment of an undeployed version is 404 DEPLOYMENT_NOT_FOUND", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const r = await call(`${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`, {
      token: admin,
    });
    const p = assertProblem(r, 404, "DEPLOYMENT_NOT_FOUND");
    assert.match(p.detail, /not deployed/);
    assertProblem(
      await call(`${api.url}/v2/nvcf/deployments/${randomUUID()}`, { token: admin }),
      404,
      "DEPLOYMENT_NOT_FOUND",
    );
    assertProblem(
      await call(`${api.url}/v2/nvcf/deployments/not-a-uuid`, { token: admin }),
      404,
      "DEPLOYMENT_NOT_FOUND",
    );
    assertProblem(
      await call(`${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${randomUUID()}`, {
        token: admin,
        body: sampleDeployment(),
      }),
      404,
      "VERSION_NOT_FOUND",
    );
  });

  test("functionStatus follows the instances that compute reports", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const d = await deploy(api, admin, f);
    const depPath = `${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`;
    const fnPath = `${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`;
    const status = async () => {
      const dep = await call<{ deployment: DeploymentDto }>(depPath, { token: admin });
      const fn = await call<{ function: FunctionDto }>(fnPath, { token: admin });
      assert.equal(dep.status, 200, dep.text);
      assert.equal(fn.status, 200, fn.text);
      assert.equal(dep.body.deployment.functionStatus, fn.body.function.status);
      return { deployment: dep.body.deployment, fn: fn.body.function };
    };

    assert.equal((await status()).fn.status, "DEPLOYING");

    await reportInstances(api, [instance(d, "i-1", "STARTING")]);
    let s = await status();
    assert.equal(s.fn.status, "DEPLOYING");
    assert.equal(s.fn.activeInstances.length, 1);
    assert.equal(s.fn.activeInstances[0].instanceId, "i-1");
    assert.equal(s.fn.activeInstances[0].instanceStatus, "STARTING");
    assert.equal(s.fn.activeInstances[0].functionVersionId, f.versionId);

    await reportInstances(api, [instance(d, "i-1", "STARTING"), instance(d, "i-2", "ACTIVE")]);
    s = await status();
    assert.equal(s.fn.status, "ACTIVE");
    assert.deepEqual(s.fn.activeInstances.map((i) => i.instanceStatus).sort(), ["ACTIVE", "STARTING"]);
    const listed = await call<{ functions: FunctionDto[] }>(`${api.url}/v2/nvcf/functions`, { token: admin });
    assert.equal(listed.body.functions[0].status, "ACTIVE");

    await reportInstances(api, [instance(d, "i-3", "ERRORED", "image pull failed")]);
    s = await status();
    assert.equal(s.fn.status, "ERROR");
    assert.deepEqual(s.deployment.healthInfo, [
      { gpu: "local", backend: "local", instanceType: "local.cpu", error: "image pull failed" },
    ]);

    await reportInstances(api, [instance(d, "i-3", "TERMINATED")]);
    s = await status();
    assert.equal(s.fn.status, "DEPLOYING");
    assert.deepEqual(s.fn.activeInstances, []);
  });

  test("only the compute service token reaches the internal deployment endpoints", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const d = await deploy(api, admin, f);

    const desired = await call<{ deployments: Array<Record<string, unknown>> }>(
      `${api.url}/v1/internal/deployments`,
      { token: api.serviceToken("compute") },
    );
    assert.equal(desired.status, 200, desired.text);
    assert.equal(desired.body.deployments.length, 1);
    assert.equal(desired.body.deployments[0].deploymentId, d.deploymentId);
    assert.equal(desired.body.deployments[0].name, "echo");

    const body = { reporter: "x", instances: [] };
    const asAdmin = await call(`${api.url}/v1/internal/instances`, { method: "PUT", token: admin, body });
    assert.equal(assertProblem(asAdmin, 403, "FORBIDDEN_SCOPE").requiredScope, "internal:instances");
    const asInvocation = await call(`${api.url}/v1/internal/instances`, {
      method: "PUT",
      token: api.serviceToken("invocation"),
      body,
    });
    assert.equal(assertProblem(asInvocation, 403, "FORBIDDEN_SCOPE").requiredScope, "internal:instances");
    const unknownService = await call(`${api.url}/v1/internal/deployments`, {
      token: "cps-not-a-real-token",
    });
    assertProblem(unknownService, 401, "TOKEN_INVALID");
    const asCompute = await call(`${api.url}/v2/nvcf/functions`, { token: api.serviceToken("compute") });
    assert.equal(assertProblem(asCompute, 403, "FORBIDDEN_SCOPE").requiredScope, "list_functions");
  });
});

describe("API keys", () => {
  test("an admin token issues a key that is shown once, listed without secrets, and revocable", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const before = Date.now();
    const key = await createKey(api, admin, { description: "ci key" }, { "Key-Owner-Id": "ci@example.com" });
    assert.match(key.value, /^nvapi-[A-Za-z0-9_-]{20,}$/);
    assert.match(key.id, UUID_RE);
    assert.equal(key.status, "ACTIVE");
    assert.equal(key.owner_type, "USER");
    assert.equal(key.owner_id, "ci@example.com");
    assert.equal(key.description, "ci key");
    assert.deepEqual(key.authorizations.policies[0].scopes, API_KEY_DEFAULT_SCOPES);
    assert.equal(key.authorizations.policies[0].product, "nv-cloud-functions");
    const days = (Date.parse(key.expires_at) - before) / 86_400_000;
    assert.ok(days > 29 && days < 31, `the key expires in about 30 days, not ${days}`);

    const hash = sha256Hex(key.value);
    const list = await call<{ keys: KeyDto[] }>(`${api.url}/v1/keys`, { token: admin });
    assert.equal(list.status, 200);
    assert.equal(list.body.keys.length, 1);
    assert.equal(list.body.keys[0].id, key.id);
    assert.equal(list.body.keys[0].status, "ACTIVE");
    assert.ok(!("value" in list.body.keys[0]), "the list never shows the value");
    assert.ok(!("hash" in list.body.keys[0]), "the list never shows the hash");
    assert.ok(!list.text.includes(key.value) && !list.text.includes(hash));

    const one = await call<KeyDto>(`${api.url}/v1/keys/${key.id}`, { token: admin });
    assert.equal(one.status, 200);
    assert.equal(one.body.id, key.id);
    assert.ok(!one.text.includes(key.value) && !one.text.includes(hash));

    const used = await call(`${api.url}/v2/nvcf/functions`, { token: key.value });
    assert.equal(used.status, 200, used.text);

    const revoked = await call<KeyDto>(`${api.url}/v1/keys/${key.id}`, { method: "DELETE", token: admin });
    assert.equal(revoked.status, 200, revoked.text);
    assert.equal(revoked.body.status, "REVOKED");
    assert.ok(revoked.body.revoked_at && !Number.isNaN(Date.parse(revoked.body.revoked_at)));
    assert.ok(!revoked.text.includes(key.value));

    const refused = await call(`${api.url}/v2/nvcf/functions`, { token: key.value });
    const p = assertProblem(refused, 401, "TOKEN_INVALID");
    assert.match(p.detail, /revoked/);
    const listed = await call<{ keys: KeyDto[] }>(`${api.url}/v1/keys`, { token: admin });
    assert.equal(listed.body.keys[0].status, "REVOKED");
  });

  test("a key carries the scopes it asks for, but only those the admin token has", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const narrow = await createKey(api, admin, {
      authorizations: { policies: [{ scopes: ["list_functions"] }] },
    });
    assert.deepEqual(narrow.authorizations.policies[0].scopes, ["list_functions"]);

    // authorize_clients is a known scope that this admin token does not hold
    const wider = await call(`${api.url}/v1/keys`, {
      token: await api.adminToken({ scopes: ["list_functions", "invoke_function"] }),
      body: { authorizations: { policies: [{ scopes: ["invoke_function", "authorize_clients"] }] } },
    });
    const p = assertProblem(wider, 403, "FORBIDDEN_SCOPE");
    assert.equal(p.requiredScope, "authorize_clients");
    assert.match(p.detail, /authorize_clients/);

    const limitedAdmin = await api.adminToken({ scopes: ["list_functions", "invoke_function"] });
    const defaults = await call(`${api.url}/v1/keys`, { token: limitedAdmin, body: {} });
    assert.equal(assertProblem(defaults, 403, "FORBIDDEN_SCOPE").requiredScope, "queue_details");

    const unknown = await call(`${api.url}/v1/keys`, {
      token: admin,
      body: { authorizations: { policies: [{ scopes: ["root"] }] } },
    });
    assert.ok(
      fields(assertProblem(unknown, 400, "VALIDATION_FAILED"))[0].startsWith("authorizations.policies.0"),
    );
    const keys = await call<{ keys: KeyDto[] }>(`${api.url}/v1/keys`, { token: admin });
    assert.equal(keys.body.keys.length, 1, "refused keys were not stored");
  });

  test("an API key cannot manage keys (403)", async (t) => {
    const api = await startApi(t);
    const key = await createKey(api, await api.adminToken());
    const create = await call(`${api.url}/v1/keys`, { token: key.value, body: {} });
    const p = assertProblem(create, 403, "FORBIDDEN_SCOPE");
    assert.match(p.detail, /admin token/);
    assertProblem(await call(`${api.url}/v1/keys`, { token: key.value }), 403, "FORBIDDEN_SCOPE");
    assertProblem(
      await call(`${api.url}/v1/keys/${key.id}`, { method: "DELETE", token: key.value }),
      403,
      "FORBIDDEN_SCOPE",
    );
  });

  test("bad key requests are 400 naming the field; unknown key ids are 404", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const past = await call(`${api.url}/v1/keys`, {
      token: admin,
      body: { expires_at: new Date(Date.now() - 60_000).toISOString() },
    });
    assert.deepEqual(fields(assertProblem(past, 400, "VALIDATION_FAILED")), ["expires_at"]);
    const notATime = await call(`${api.url}/v1/keys`, { token: admin, body: { expires_at: "tomorrow" } });
    assert.deepEqual(fields(assertProblem(notATime, 400, "VALIDATION_FAILED")), ["expires_at"]);
    const extra = await call(`${api.url}/v1/keys`, { token: admin, body: { owner: "me" } });
    assert.deepEqual(fields(assertProblem(extra, 400, "VALIDATION_FAILED")), ["owner"]);

    const future = new Date(Date.now() + 2 * 86_400_000).toISOString();
    const ok = await createKey(api, admin, { expires_at: future });
    assert.equal(Date.parse(ok.expires_at), Date.parse(future));
    const noBody = await call(`${api.url}/v1/keys`, { method: "POST", token: admin });
    assert.equal(noBody.status, 200, noBody.text);

    assertProblem(await call(`${api.url}/v1/keys/${randomUUID()}`, { token: admin }), 404, "KEY_NOT_FOUND");
    assertProblem(
      await call(`${api.url}/v1/keys/${randomUUID()}`, { method: "DELETE", token: admin }),
      404,
      "KEY_NOT_FOUND",
    );
    assertProblem(await call(`${api.url}/v1/keys/nope`, { token: admin }), 404, "KEY_NOT_FOUND");
  });

  test("an expired API key is 401 TOKEN_EXPIRED; an unknown one 401 TOKEN_INVALID", async (t) => {
    const api = await startApi(t);
    const value = "nvapi-expired-test-key";
    await api.store.createApiKey({
      keyId: randomUUID(),
      hash: sha256Hex(value),
      description: "old",
      ownerId: "test",
      ncaId: "callplane",
      scopes: [...API_KEY_DEFAULT_SCOPES],
      policies: [
        { scopes: [...API_KEY_DEFAULT_SCOPES], resources: [{ id: "*", type: "account-functions" }] },
      ],
      createdAt: new Date(Date.now() - 2 * 86_400_000).toISOString(),
      expiresAt: new Date(Date.now() - 86_400_000).toISOString(),
    });
    assertProblem(await call(`${api.url}/v2/nvcf/functions`, { token: value }), 401, "TOKEN_EXPIRED");
    const keys = await call<{ keys: KeyDto[] }>(`${api.url}/v1/keys`, { token: await api.adminToken() });
    assert.equal(keys.body.keys[0].status, "EXPIRED");
    assertProblem(
      await call(`${api.url}/v2/nvcf/functions`, { token: "nvapi-never-issued" }),
      401,
      "TOKEN_INVALID",
    );
  });
});

describe("scopes", () => {
  test("an API key with the default scopes can list functions but not create, deploy or delete them", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const key = await createKey(api, admin);

    const list = await call<{ functions: FunctionDto[] }>(`${api.url}/v2/nvcf/functions`, {
      token: key.value,
    });
    assert.equal(list.status, 200);
    assert.equal(list.body.functions.length, 1);
    assert.equal(
      (await call(`${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`, { token: key.value }))
        .status,
      200,
    );

    const create = await call(`${api.url}/v2/nvcf/functions`, {
      token: key.value,
      body: sampleFunction("x"),
    });
    const p = assertProblem(create, 403, "FORBIDDEN_SCOPE");
    assert.equal(p.requiredScope, "register_function");
    assert.match(p.detail, /register_function/);
    assert.match(p.detail, /API key/);

    const dep = await call(`${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`, {
      token: key.value,
      body: sampleDeployment(),
    });
    assert.equal(assertProblem(dep, 403, "FORBIDDEN_SCOPE").requiredScope, "deploy_function");
    const del = await call(`${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`, {
      method: "DELETE",
      token: key.value,
    });
    assert.equal(assertProblem(del, 403, "FORBIDDEN_SCOPE").requiredScope, "delete_function");
    const upd = await call(`${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`, {
      method: "PUT",
      token: key.value,
      body: { description: "x" },
    });
    assert.equal(assertProblem(upd, 403, "FORBIDDEN_SCOPE").requiredScope, "update_function");

    const still = await call<{ functions: FunctionDto[] }>(`${api.url}/v2/nvcf/functions`, { token: admin });
    assert.deepEqual(
      still.body.functions.map((x) => x.name),
      ["echo"],
    );
  });

  test("an admin token with limited scopes gets 403 naming the missing scope", async (t) => {
    const api = await startApi(t);
    const reader = await api.adminToken({ scopes: ["list_functions"] });
    assert.equal((await call(`${api.url}/v2/nvcf/functions`, { token: reader })).status, 200);
    const create = await call(`${api.url}/v2/nvcf/functions`, { token: reader, body: sampleFunction("x") });
    const p = assertProblem(create, 403, "FORBIDDEN_SCOPE");
    assert.equal(p.requiredScope, "register_function");
    assert.match(p.detail, /admin token/);

    const nothing = await api.adminToken({ scopes: [] });
    assert.equal(
      assertProblem(await call(`${api.url}/v2/nvcf/functions`, { token: nothing }), 403, "FORBIDDEN_SCOPE")
        .requiredScope,
      "list_functions",
    );

    const registrar = await api.adminToken({ scopes: ["register_function"] });
    const f = await createFunction(api, registrar, "echo");
    const dep = await call(`${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`, {
      token: registrar,
      body: sampleDeployment(),
    });
    assert.equal(assertProblem(dep, 403, "FORBIDDEN_SCOPE").requiredScope, "deploy_function");
  });
});

describe("internal invocation auth", () => {
  const authPath = (api: ApiFixture) => `${api.url}/v1/internal/invocation-auth`;

  test("answers 200 with the deployed versions for a valid key", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const add = await call<{ function: FunctionDto }>(`${api.url}/v2/nvcf/functions/${f.id}/versions`, {
      token: admin,
      body: sampleFunction("echo", { inferenceUrl: "/v2/echo" }),
    });
    const undeployed = add.body.function;
    await deploy(api, admin, f, sampleDeployment(1, 2, 4));
    const key = await createKey(api, admin, {}, { "Key-Owner-Id": "user@example.com" });
    const inv = api.serviceToken("invocation");

    const r = await call<Record<string, unknown>>(authPath(api), {
      token: inv,
      body: { apiKey: key.value, functionId: f.id },
    });
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.body, {
      functionId: f.id,
      functionName: "echo",
      ncaId: "callplane",
      clientNcaId: "callplane",
      subject: "user@example.com",
      keyId: key.id,
      keyExpiresAt: key.expires_at,
      functionVersions: [
        {
          functionVersionId: f.versionId,
          defaultInvocationPath: "/echo",
          functionType: "DEFAULT",
          maxRequestConcurrency: 4,
        },
      ],
    });

    const pinned = await call<{ functionVersions: Array<{ functionVersionId: string }> }>(authPath(api), {
      token: inv,
      body: { apiKey: key.value, functionId: f.id, functionVersionId: f.versionId },
    });
    assert.equal(pinned.status, 200, pinned.text);
    assert.deepEqual(
      pinned.body.functionVersions.map((v) => v.functionVersionId),
      [f.versionId],
    );

    const notDeployedVersion = await call(authPath(api), {
      token: inv,
      body: { apiKey: key.value, functionId: f.id, functionVersionId: undeployed.versionId },
    });
    assertProblem(notDeployedVersion, 404, "FUNCTION_NOT_DEPLOYED");
    const unknownVersion = await call(authPath(api), {
      token: inv,
      body: { apiKey: key.value, functionId: f.id, functionVersionId: randomUUID() },
    });
    assertProblem(unknownVersion, 404, "VERSION_NOT_FOUND");
  });

  test("refuses undeployed and unknown functions, unknown keys and keys without invoke_function", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const key = await createKey(api, admin);
    const inv = api.serviceToken("invocation");

    const notDeployed = await call(authPath(api), {
      token: inv,
      body: { apiKey: key.value, functionId: f.id },
    });
    const p = assertProblem(notDeployed, 404, "FUNCTION_NOT_DEPLOYED");
    assert.match(p.detail, new RegExp(f.id));

    await deploy(api, admin, f);
    assertProblem(
      await call(authPath(api), { token: inv, body: { apiKey: key.value, functionId: randomUUID() } }),
      404,
      "FUNCTION_NOT_FOUND",
    );
    assertProblem(
      await call(authPath(api), { token: inv, body: { apiKey: key.value, functionId: "echo" } }),
      404,
      "FUNCTION_NOT_FOUND",
    );
    assertProblem(
      await call(authPath(api), { token: inv, body: { apiKey: "nvapi-unknown", functionId: f.id } }),
      401,
      "TOKEN_INVALID",
    );

    const listOnly = await createKey(api, admin, {
      authorizations: { policies: [{ scopes: ["list_functions"] }] },
    });
    const noScope = await call(authPath(api), {
      token: inv,
      body: { apiKey: listOnly.value, functionId: f.id },
    });
    assert.equal(assertProblem(noScope, 403, "FORBIDDEN_SCOPE").requiredScope, "invoke_function");

    await call(`${api.url}/v1/keys/${key.id}`, { method: "DELETE", token: admin });
    assertProblem(
      await call(authPath(api), { token: inv, body: { apiKey: key.value, functionId: f.id } }),
      401,
      "TOKEN_INVALID",
    );

    const bad = await call(authPath(api), { token: inv, body: { functionId: f.id } });
    assert.deepEqual(fields(assertProblem(bad, 400, "VALIDATION_FAILED")), ["apiKey"]);
  });

  test("only the invocation service token may call it", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    await deploy(api, admin, f);
    const key = await createKey(api, admin);
    const body = { apiKey: key.value, functionId: f.id };

    const asAdmin = await call(authPath(api), { token: admin, body });
    assert.equal(assertProblem(asAdmin, 403, "FORBIDDEN_SCOPE").requiredScope, "internal:invocation-auth");
    // a correctly signed admin token that claims an internal scope is still not a service
    const claims = await api.adminToken({ scopes: ["internal:invocation-auth", "internal:instances"] });
    assertProblem(await call(authPath(api), { token: claims, body }), 403, "FORBIDDEN_SCOPE");
    assertProblem(
      await call(`${api.url}/v1/internal/instances`, {
        method: "PUT",
        token: claims,
        body: { reporter: "x", instances: [] },
      }),
      403,
      "FORBIDDEN_SCOPE",
    );
    assertProblem(await call(authPath(api), { token: key.value, body }), 403, "FORBIDDEN_SCOPE");
    assertProblem(
      await call(authPath(api), { token: api.serviceToken("compute"), body }),
      403,
      "FORBIDDEN_SCOPE",
    );
    assertProblem(await call(authPath(api), { body }), 401, "UNAUTHENTICATED");
  });
});

describe("bad input", () => {
  test("invalid function names are 400 naming the name field", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    for (const name of ["", "-lead", "_lead", "a".repeat(129), "has space", "dot.ted", "ünï"]) {
      const r = await call(`${api.url}/v2/nvcf/functions`, { token: admin, body: sampleFunction(name) });
      const p = assertProblem(r, 400, "VALIDATION_FAILED");
      assert.deepEqual([...new Set(fields(p))], ["name"], `name ${JSON.stringify(name)}`);
      assert.match(p.detail, /^name: /);
    }
    await createFunction(api, admin, "a".repeat(128));
    await createFunction(api, admin, "0-Ok_name");
    const list = await call<{ functions: FunctionDto[] }>(`${api.url}/v2/nvcf/functions`, { token: admin });
    assert.equal(list.body.functions.length, 2);
  });

  test("unknown fields are refused by name, top-level and nested", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const top = await call(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction("echo", { colour: "red", size: 3 }),
    });
    const p = assertProblem(top, 400, "VALIDATION_FAILED");
    assert.deepEqual(p.errors, [
      { field: "colour", message: "unknown field" },
      { field: "size", message: "unknown field" },
    ]);
    assert.match(p.detail, /colour/);

    const nested = await call(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction("echo", { health: { uri: "/h", retries: 3 } }),
    });
    assert.deepEqual(fields(assertProblem(nested, 400, "VALIDATION_FAILED")), ["health.retries"]);

    const f = await createFunction(api, admin, "echo");
    const dep = await call(`${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`, {
      token: admin,
      body: {
        deploymentSpecifications: [{ ...sampleDeployment().deploymentSpecifications[0], scaling: {} }],
      },
    });
    assert.deepEqual(fields(assertProblem(dep, 400, "VALIDATION_FAILED")), [
      "deploymentSpecifications.0.scaling",
    ]);
  });

  test("wrong types and missing required fields are 400 naming each field", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const types = await call(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction("echo", { inferencePort: "8000", tags: "demo", functionType: "BATCH" }),
    });
    assert.deepEqual(fields(assertProblem(types, 400, "VALIDATION_FAILED")).sort(), [
      "functionType",
      "inferencePort",
      "tags",
    ]);
    const numberName = await call(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction("x", { name: 5 }),
    });
    assert.deepEqual(fields(assertProblem(numberName, 400, "VALIDATION_FAILED")), ["name"]);
    const missing = await call(`${api.url}/v2/nvcf/functions`, { token: admin, body: { name: "echo" } });
    assert.deepEqual(fields(assertProblem(missing, 400, "VALIDATION_FAILED")).sort(), [
      "containerImage",
      "inferenceUrl",
    ]);
    const array = await call(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: [sampleFunction("echo")],
    });
    assert.deepEqual(fields(assertProblem(array, 400, "VALIDATION_FAILED")), ["(body)"]);
    const timeout = await call(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction("echo", { health: { timeout: "10s" } }),
    });
    assert.deepEqual(fields(assertProblem(timeout, 400, "VALIDATION_FAILED")), ["health.timeout"]);
  });

  test("known NVCF fields that callplane does not support are refused by name", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const r = await call(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction("llm", { models: [{ name: "m", version: "1" }] }),
    });
    const p = assertProblem(r, 400, "VALIDATION_FAILED");
    assert.deepEqual(p.errors, [{ field: "models", message: "not supported by callplane" }]);
    assert.match(p.detail, /models/);
    assert.match(p.detail, /not support/);
    const two = await call(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction("helm", { helmChart: "c", telemetries: {} }),
    });
    assert.deepEqual(fields(assertProblem(two, 400, "VALIDATION_FAILED")).sort(), [
      "helmChart",
      "telemetries",
    ]);
  });

  test("inferenceUrl must be a path beginning with /", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    for (const inferenceUrl of ["echo", "http://example.com/echo", ""]) {
      const r = await call(`${api.url}/v2/nvcf/functions`, {
        token: admin,
        body: sampleFunction("echo", { inferenceUrl }),
      });
      const p = assertProblem(r, 400, "VALIDATION_FAILED");
      assert.deepEqual(fields(p), ["inferenceUrl"]);
      assert.match(p.errors![0].message, /beginning with \//);
    }
  });

  test("bodies over the limit are 413 BODY_TOO_LARGE, with or without Content-Length", async (t) => {
    const api = await startApi(t, { maxBodyBytes: 1024 });
    const admin = await api.adminToken();
    const big = sampleFunction("echo", { description: "x".repeat(2000) });
    const r = await call(`${api.url}/v2/nvcf/functions`, { token: admin, body: big });
    const p = assertProblem(r, 413, "BODY_TOO_LARGE");
    assert.match(p.detail, /1024/);

    // chunked, without Content-Length: the limit is counted while the body streams in, and a client
    // that keeps sending long after the limit still reads the 413 (not a connection reset)
    for (const total of [4 * 1024, 8 * 1024 * 1024, 8 * 1024 * 1024, 8 * 1024 * 1024]) {
      const chunked = await postChunked(`${api.url}/v2/nvcf/functions`, admin, total);
      assert.equal(chunked.status, 413, `${total} bytes: ${chunked.body}`);
      assert.equal((JSON.parse(chunked.body) as Problem).code, "BODY_TOO_LARGE");
    }

    const list = await call<{ functions: FunctionDto[] }>(`${api.url}/v2/nvcf/functions`, { token: admin });
    assert.deepEqual(list.body, { functions: [] });
    await createFunction(api, admin, "small");
  });

  test("malformed JSON is 400 MALFORMED_JSON, a missing body 400, and a non-JSON type 415", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const url = `${api.url}/v2/nvcf/functions`;
    const malformed = await call(url, {
      method: "POST",
      token: admin,
      rawBody: '{"name": "echo",',
      headers: { "content-type": "application/json" },
    });
    assertProblem(malformed, 400, "MALFORMED_JSON");
    const empty = await call(url, {
      method: "POST",
      token: admin,
      headers: { "content-type": "application/json" },
    });
    assert.match(assertProblem(empty, 400, "VALIDATION_FAILED").detail, /JSON body/);
    const text = await call(url, {
      method: "POST",
      token: admin,
      rawBody: JSON.stringify(sampleFunction("echo")),
      headers: { "content-type": "text/plain" },
    });
    const p = assertProblem(text, 415, "UNSUPPORTED_MEDIA_TYPE");
    assert.match(p.detail, /text\/plain/);
    const charset = await call(url, {
      method: "POST",
      token: admin,
      rawBody: JSON.stringify(sampleFunction("echo")),
      headers: { "content-type": "application/json; charset=utf-8" },
    });
    assert.equal(charset.status, 200, charset.text);
  });

  test("unknown and malformed ids are 404 FUNCTION_NOT_FOUND or VERSION_NOT_FOUND", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const fn = (fid: string, vid: string) => `${api.url}/v2/nvcf/functions/${fid}/versions/${vid}`;

    assertProblem(await call(fn(randomUUID(), randomUUID()), { token: admin }), 404, "FUNCTION_NOT_FOUND");
    const v = assertProblem(await call(fn(f.id, randomUUID()), { token: admin }), 404, "VERSION_NOT_FOUND");
    assert.match(v.detail, new RegExp(f.id));
    const notUuid = assertProblem(
      await call(fn("echo", f.versionId), { token: admin }),
      404,
      "FUNCTION_NOT_FOUND",
    );
    assert.match(notUuid.detail, /not a UUID/);
    assertProblem(await call(fn(f.id, "v1"), { token: admin }), 404, "VERSION_NOT_FOUND");
    assertProblem(
      await call(`${api.url}/v2/nvcf/functions/not-a-uuid/versions`, { token: admin }),
      404,
      "FUNCTION_NOT_FOUND",
    );
    assertProblem(
      await call(`${api.url}/v2/nvcf/functions/${randomUUID()}/versions`, { token: admin }),
      404,
      "FUNCTION_NOT_FOUND",
    );
    assertProblem(
      await call(fn(randomUUID(), f.versionId), { method: "DELETE", token: admin }),
      404,
      "FUNCTION_NOT_FOUND",
    );
    // a version id only counts under its own function
    const other = await createFunction(api, admin, "other");
    assertProblem(await call(fn(other.id, f.versionId), { token: admin }), 404, "VERSION_NOT_FOUND");
    assertProblem(
      await call(`${api.url}/v2/nvcf/deployments/functions/${other.id}/versions/${f.versionId}`, {
        token: admin,
        body: sampleDeployment(),
      }),
      404,
      "VERSION_NOT_FOUND",
    );
  });

  test("deployment specifications: min > max and an empty list are 400 naming the field", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");
    const path = `${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`;

    const minMax = await call(path, { token: admin, body: sampleDeployment(3, 2) });
    const p = assertProblem(minMax, 400, "VALIDATION_FAILED");
    assert.deepEqual(fields(p), ["deploymentSpecifications.0.minInstances"]);
    assert.match(p.detail, /minInstances/);
    assert.match(p.detail, /maxInstances/);

    const empty = await call(path, { token: admin, body: { deploymentSpecifications: [] } });
    assert.deepEqual(fields(assertProblem(empty, 400, "VALIDATION_FAILED")), ["deploymentSpecifications"]);
    const none = await call(path, { token: admin, body: {} });
    assert.deepEqual(fields(assertProblem(none, 400, "VALIDATION_FAILED")), ["deploymentSpecifications"]);
    const zeroMax = await call(path, { token: admin, body: sampleDeployment(0, 0) });
    assert.deepEqual(fields(assertProblem(zeroMax, 400, "VALIDATION_FAILED")), [
      "deploymentSpecifications.0.maxInstances",
    ]);

    assertProblem(await call(path, { token: admin }), 404, "DEPLOYMENT_NOT_FOUND");
    await deploy(api, admin, f);
    const badUpdate = await call(path, { method: "PUT", token: admin, body: sampleDeployment(5, 1) });
    assert.deepEqual(fields(assertProblem(badUpdate, 400, "VALIDATION_FAILED")), [
      "deploymentSpecifications.0.minInstances",
    ]);
  });

  test("a wrong method is 405 with Allow; an unknown route is 404 NOT_FOUND", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "echo");

    const del = await call(`${api.url}/v2/nvcf/functions`, { method: "DELETE", token: admin });
    assertProblem(del, 405, "METHOD_NOT_ALLOWED");
    assert.deepEqual(del.headers.get("allow")?.split(", ").sort(), ["GET", "POST"]);

    const patch = await call(`${api.url}/v2/nvcf/functions/${f.id}/versions/${f.versionId}`, {
      method: "PATCH",
      token: admin,
      body: {},
    });
    assertProblem(patch, 405, "METHOD_NOT_ALLOWED");
    assert.deepEqual(patch.headers.get("allow")?.split(", ").sort(), ["DELETE", "GET", "PUT"]);

    const ids = await call(`${api.url}/v2/nvcf/functions/ids`, { method: "POST", token: admin, body: {} });
    assertProblem(ids, 405, "METHOD_NOT_ALLOWED");
    assert.equal(ids.headers.get("allow"), "GET");

    for (const path of ["/health", "/metrics"]) {
      const r = await call(`${api.url}${path}`, { method: "POST", body: {} });
      assertProblem(r, 405, "METHOD_NOT_ALLOWED");
      assert.equal(r.headers.get("allow"), "GET, HEAD");
      // a load balancer's HEAD health check is answered like GET, without the body
      const head = await call(`${api.url}${path}`, { method: "HEAD" });
      assert.equal(head.status, 200);
      assert.equal(head.text, "");
    }

    for (const path of ["/v2/nvcf/nothing", "/", "/v2/nvcf/functions/a/b/c/d/e", "/v1/admin/keys"]) {
      const r = await call(`${api.url}${path}`, { token: admin });
      const p = assertProblem(r, 404, "NOT_FOUND");
      assert.match(p.detail, /no route/);
    }
  });
});

describe("tokens", () => {
  const list = (api: ApiFixture, headers: Record<string, string>) =>
    call(`${api.url}/v2/nvcf/functions`, { headers });

  test("a missing Authorization header or a non-Bearer scheme is 401 UNAUTHENTICATED", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    assert.match(assertProblem(await list(api, {}), 401, "UNAUTHENTICATED").detail, /Bearer/);
    assertProblem(await list(api, { authorization: `Basic ${admin}` }), 401, "UNAUTHENTICATED");
    assertProblem(await list(api, { authorization: "Bearer" }), 401, "UNAUTHENTICATED");
    assertProblem(await list(api, { authorization: `Bearer ${admin} extra` }), 401, "UNAUTHENTICATED");
    assert.equal((await list(api, { authorization: `bearer ${admin}` })).status, 200);
  });

  test("an expired admin token is 401 TOKEN_EXPIRED", async (t) => {
    const api = await startApi(t);
    const expired = await api.adminToken({ ttlSeconds: -60 });
    const p = assertProblem(
      await call(`${api.url}/v2/nvcf/functions`, { token: expired }),
      401,
      "TOKEN_EXPIRED",
    );
    assert.match(p.detail, /expired/);
  });

  test("tampered, foreign, unsigned and algorithm-confused tokens are 401 TOKEN_INVALID", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken({ scopes: ["list_functions"] });
    const [header, payload, signature] = admin.split(".");
    const url = `${api.url}/v2/nvcf/functions`;
    const expectInvalid = async (token: string, what: string) => {
      const r = await call(url, { token });
      assert.equal(r.status, 401, `${what}: ${r.text}`);
      assertProblem(r, 401, "TOKEN_INVALID");
    };

    // flip one character of the payload
    const i = 10;
    const flipped = payload.slice(0, i) + (payload[i] === "A" ? "B" : "A") + payload.slice(i + 1);
    await expectInvalid(`${header}.${flipped}.${signature}`, "flipped payload character");

    // re-encode the payload with more scopes, keeping the original signature
    const claims = JSON.parse(Buffer.from(payload, "base64url").toString("utf8")) as Record<string, unknown>;
    const escalated = b64url({ ...claims, scopes: ["register_function", "list_functions"] });
    await expectInvalid(`${header}.${escalated}.${signature}`, "escalated scopes");

    // signed by another P-256 key, with every claim otherwise right
    const other = generateKeyPairSync("ec", { namedCurve: "P-256" });
    const foreign = await new SignJWT({ scopes: ["list_functions"] })
      .setProtectedHeader({ alg: "ES256", typ: "JWT" })
      .setIssuer("callplane-admin")
      .setAudience("callplane-api")
      .setSubject("intruder")
      .setJti(randomUUID())
      .setIssuedAt()
      .setExpirationTime("1h")
      .sign(other.privateKey);
    await expectInvalid(foreign, "foreign key");

    // alg: none, empty signature
    const now = Math.floor(Date.now() / 1000);
    const unsecured = `${b64url({ alg: "none", typ: "JWT" })}.${b64url({ ...claims, exp: now + 3600 })}.`;
    await expectInvalid(unsecured, "alg none");

    // HS256 keyed with the public key PEM (algorithm confusion)
    const pem = readFileSync(api.publicKeyFile, "utf8");
    const confused = await new SignJWT({ scopes: ["list_functions"] })
      .setProtectedHeader({ alg: "HS256", typ: "JWT" })
      .setIssuer("callplane-admin")
      .setAudience("callplane-api")
      .setSubject("intruder")
      .setJti(randomUUID())
      .setIssuedAt()
      .setExpirationTime("1h")
      .sign(new TextEncoder().encode(pem));
    await expectInvalid(confused, "HS256 with the public key");

    // the right key, but the wrong issuer or audience, or no jti
    const key = await importPKCS8(readFileSync(api.privateKeyFile, "utf8"), "ES256");
    const base = () =>
      new SignJWT({ scopes: ["list_functions"] })
        .setProtectedHeader({ alg: "ES256", typ: "JWT" })
        .setSubject("s")
        .setIssuedAt()
        .setExpirationTime("1h");
    await expectInvalid(
      await base().setIssuer("someone-else").setAudience("callplane-api").setJti(randomUUID()).sign(key),
      "wrong issuer",
    );
    await expectInvalid(
      await base().setIssuer("callplane-admin").setAudience("other-api").setJti(randomUUID()).sign(key),
      "wrong audience",
    );
    await expectInvalid(
      await base().setIssuer("callplane-admin").setAudience("callplane-api").sign(key),
      "no jti",
    );
    const good = await base()
      .setIssuer("callplane-admin")
      .setAudience("callplane-api")
      .setJti(randomUUID())
      .sign(key);
    assert.equal((await call(url, { token: good })).status, 200, "the same claims, correctly signed, work");

    await expectInvalid("a.b.c", "garbage JWT");
    await expectInvalid("not-a-token", "garbage opaque token");
    assert.equal((await call(url, { token: admin })).status, 200, "the original token still works");
  });
});

describe("HTTP edges", () => {
  /** Sends raw bytes and returns what came back before the server closed or went quiet. */
  function raw(
    url: string,
    text: string,
  ): Promise<{ status: number | undefined; head: string; body: string }> {
    const u = new URL(url);
    return new Promise((resolve, reject) => {
      // written, not ended: Node aborts a request whose client half-closes before it is answered
      const s = netConnect(Number(u.port), u.hostname, () => s.write(text));
      const chunks: Buffer[] = [];
      s.on("data", (c: Buffer) => chunks.push(c));
      s.setTimeout(5000, () => s.destroy());
      s.on("error", reject);
      s.on("close", () => {
        const all = Buffer.concat(chunks).toString("latin1");
        const [head = "", body = ""] = all.split("\r\n\r\n");
        const m = /^HTTP\/1\.1 (\d{3})/.exec(head);
        resolve({ status: m ? Number(m[1]) : undefined, head, body });
      });
    });
  }
  const problem = (body: string) => JSON.parse(body) as { code: string; detail: string; status: number };

  test("no Host, two Authorization headers, an unknown Expect or transfer coding get problem answers", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const noHost = await raw(api.url, "GET /v2/nvcf/functions HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert.equal(noHost.status, 400, noHost.head);
    assert.match(noHost.head, /content-type: application\/problem\+json/i);
    assert.match(problem(noHost.body).detail, /Host header/);

    // which of two Authorization headers counts must not depend on their order: both are refused
    for (const order of [
      [`Bearer ${admin}`, "Bearer forged"],
      ["Bearer forged", `Bearer ${admin}`],
    ]) {
      const r = await raw(
        api.url,
        `GET /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\nAuthorization: ${order[0]}\r\nAuthorization: ${order[1]}\r\nConnection: close\r\n\r\n`,
      );
      assert.equal(r.status, 400, r.head);
      assert.equal(problem(r.body).code, "BAD_REQUEST");
      assert.match(problem(r.body).detail, /more than one Authorization/);
    }

    const expect = await raw(
      api.url,
      `POST /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${admin}\r\nExpect: something-else\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
    );
    assert.equal(expect.status, 417, expect.head);
    assert.equal(problem(expect.body).code, "EXPECTATION_FAILED");

    // a transfer coding other than chunked would reach the handler as if it were the body
    const gzip = await raw(
      api.url,
      `POST /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${admin}\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n`,
    );
    assert.equal(gzip.status, 400, gzip.head);
    assert.match(problem(gzip.body).detail, /Transfer-Encoding "gzip, chunked" is not supported/);
  });

  test("header fields past Node's default count are not dropped: Authorization still counts", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const filler = Array.from({ length: 1200 }, (_, i) => `X-${i}: y`).join("\r\n");
    const r = await raw(
      api.url,
      `GET /v2/nvcf/functions HTTP/1.1\r\nHost: x\r\n${filler}\r\nAuthorization: Bearer ${admin}\r\nConnection: close\r\n\r\n`,
    );
    assert.equal(r.status, 200, `${r.head}\n${r.body.slice(0, 300)}`);
  });

  test("ids in paths match regardless of case", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const f = await createFunction(api, admin, "upper");
    const r = await call<{ function: { id: string } }>(
      `${api.url}/v2/nvcf/functions/${f.id.toUpperCase()}/versions/${f.versionId.toUpperCase()}`,
      { token: admin },
    );
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.function.id, f.id);
  });
});

test("a request that stalls mid-body gets 408 and its connection is closed, even by a half-open client", async (t) => {
  const router = new Router();
  let handlerSettled = false;
  router.add("POST", "/slow-body", async ({ req, res }) => {
    try {
      await readJson(req, 1024);
      res.end("read");
    } finally {
      handlerSettled = true;
    }
  });
  const service = createHttpService({
    name: "edge-test",
    listen: { host: "127.0.0.1", port: 0 },
    logger: silentLogger(),
    registry: createRegistry("edge-test"),
    router,
    requestTimeoutMs: 1000,
  });
  const url = await service.listen();
  t.after(() => service.destroy());
  // a client that keeps its own side open after the server's answer
  const socket = netConnect({ port: Number(url.port), host: "127.0.0.1", allowHalfOpen: true });
  t.after(() => socket.destroy());
  let answer = "";
  socket.on("data", (c: Buffer) => (answer += c.toString("latin1")));
  socket.write(
    "POST /slow-body HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{}",
  );
  await waitFor("the 408", () => answer.includes("\r\n\r\n") && answer, { timeoutMs: 15_000 });
  assert.match(answer, /^HTTP\/1\.1 408 /);
  assert.match(answer, /REQUEST_TIMEOUT/);
  const connections = () =>
    new Promise<number>((resolve, reject) =>
      service.server.getConnections((err, n) => (err ? reject(err) : resolve(n))),
    );
  await waitFor("the server to let the connection go", async () => (await connections()) === 0, {
    timeoutMs: 5000,
  });
  await waitFor("the handler waiting on the body to settle", () => handlerSettled, { timeoutMs: 5000 });
});
