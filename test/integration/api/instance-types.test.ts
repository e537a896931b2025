// The clusters' instance types, over HTTP against a real API: a compute agent registers its
// cluster's list with its service token (PUT /v1/internal/clusters/{clusterId}/instance-types),
// clients read them as NVCF's cluster groups (GET /v2/nvcf/clusterGroups), and a deployment naming a
// (gpu, instanceType) no cluster offers is refused (INSTANCE_TYPE_UNAVAILABLE). With the local
// backend, local/local.cpu is always offered. Then the worker identity an instance report carries
// (NVCA's WorkerAuth): stored with the instance, shown in the deployment, queryable by instance id,
// dropped when the instance ends. Last, the store's part on SQLite and on a real PostgreSQL.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { after, describe, test, type TestContext } from "node:test";
import { openPostgresStore } from "../../../src/services/api/store/postgres.js";
import { openSqliteStore } from "../../../src/services/api/store/sqlite.js";
import type { InstanceRecord, Store } from "../../../src/services/api/store/types.js";
import {
  call,
  sampleDeployment,
  sampleFunction,
  startApi,
  tmpDir,
  type ApiFixture,
  type JsonResponse,
} from "../../testkit/index.js";
import { startPostgres, type Postgres } from "../../testkit/postgres.js";

interface Problem {
  code: string;
  status: number;
  title: string;
  detail: string;
  type: string;
  requiredScope?: string;
  errors?: Array<{ field: string; message: string }>;
}

interface ClusterGroup {
  id: string;
  name: string;
  ncaId: string;
  backend: string;
  gpus: Array<{
    name: string;
    instanceTypes: Array<{ name: string; description: string; default: boolean; gpuCount: number }>;
  }>;
  clusters: Array<{ id: string; name: string; k8sVersion?: string }>;
}

interface InstanceDto {
  instanceId: string;
  instanceStatus: string;
  workerAuth?: Record<string, unknown>;
}

interface DeploymentDto {
  deploymentId: string;
  functionId: string;
  functionVersionId: string;
  deploymentSpecifications: Array<Record<string, unknown>>;
  instances: InstanceDto[];
}

function assertProblem(r: JsonResponse<unknown>, status: number, code: string): Problem {
  assert.equal(r.status, status, `expected ${status} ${code}, got ${r.status}: ${r.text}`);
  assert.match(r.headers.get("content-type") ?? "", /^application\/problem\+json/);
  const p = r.body as Problem;
  assert.equal(p.code, code, r.text);
  assert.equal(p.type, `urn:callplane:problem:${code.toLowerCase().replaceAll("_", "-")}`);
  assert.ok(p.detail.length > 0);
  return p;
}

function fields(p: Problem): string[] {
  assert.ok(Array.isArray(p.errors), `the problem lists its fields in errors: ${JSON.stringify(p)}`);
  return p.errors.map((e) => e.field).sort();
}

const typesPath = (api: ApiFixture, clusterId: string) =>
  `${api.url}/v1/internal/clusters/${clusterId}/instance-types`;

function register(api: ApiFixture, clusterId: string, body: unknown, token = api.serviceToken("compute")) {
  return call(typesPath(api, clusterId), { method: "PUT", token, body });
}

async function registered(api: ApiFixture, clusterId: string, body: unknown): Promise<void> {
  const r = await register(api, clusterId, body);
  assert.equal(r.status, 204, r.text);
  assert.equal(r.text, "");
}

async function clusterGroups(api: ApiFixture, token: string): Promise<ClusterGroup[]> {
  const r = await call<{ clusterGroups: ClusterGroup[] }>(`${api.url}/v2/nvcf/clusterGroups`, { token });
  assert.equal(r.status, 200, r.text);
  return r.body.clusterGroups;
}

async function createFunction(api: ApiFixture, token: string, name: string) {
  const r = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
    token,
    body: sampleFunction(name),
  });
  assert.equal(r.status, 200, r.text);
  return `${api.url}/v2/nvcf/deployments/functions/${r.body.function.id}/versions/${r.body.function.versionId}`;
}

const spec = (gpu: string, instanceType: string, extra: Record<string, unknown> = {}) => ({
  deploymentSpecifications: [{ gpu, instanceType, minInstances: 1, maxInstances: 1, ...extra }],
});

const A100 = {
  backend: "kubernetes",
  instanceTypes: [
    { name: "a100.x8", gpu: "A100", gpuCount: 8 },
    { name: "a100.x1", gpu: "A100", gpuCount: 1 },
    { name: "cpu.small", gpu: "none", gpuCount: 0 },
  ],
};

describe("registering a cluster's instance types", () => {
  test("only the compute service's token registers; an admin token, even one claiming the scope, does not", async (t) => {
    const api = await startApi(t);
    const body = { backend: "kubernetes", instanceTypes: [] };
    assertProblem(await call(typesPath(api, "c1"), { method: "PUT", body }), 401, "UNAUTHENTICATED");
    assertProblem(await register(api, "c1", body, "cps-not-a-real-token"), 401, "TOKEN_INVALID");
    const admin = await api.adminToken();
    assert.equal(
      assertProblem(await register(api, "c1", body, admin), 403, "FORBIDDEN_SCOPE").requiredScope,
      "internal:instances",
    );
    const claims = await api.adminToken({ scopes: ["internal:instances"] });
    assertProblem(await register(api, "c1", body, claims), 403, "FORBIDDEN_SCOPE");
    assertProblem(await register(api, "c1", body, api.serviceToken("invocation")), 403, "FORBIDDEN_SCOPE");
    // the refused attempts registered nothing; with backend local, only the built-in cluster shows
    assert.deepEqual(
      (await clusterGroups(api, admin)).map((g) => g.id),
      ["test"],
    );
    await registered(api, "c1", body);
    assert.deepEqual(
      (await clusterGroups(api, admin)).map((g) => g.id),
      ["c1", "test"],
    );
  });

  test("a bad body or cluster id is refused, naming each bad field; nothing is stored", async (t) => {
    const api = await startApi(t);
    const bad = async (clusterId: string, body: unknown, want: string[]) => {
      const p = assertProblem(await register(api, clusterId, body), 400, "VALIDATION_FAILED");
      assert.deepEqual(fields(p), want.sort(), p.detail);
    };
    const type = { name: "a100.x8", gpu: "A100", gpuCount: 8 };
    await bad("c1", {}, ["backend", "instanceTypes"]);
    await bad("c1", { backend: "gke", instanceTypes: [] }, ["backend"]);
    await bad("c1", { backend: "kubernetes", instanceTypes: [], region: "x" }, ["region"]);
    await bad("c1", { backend: "kubernetes", instanceTypes: [{ ...type, nodeSelector: {} }] }, [
      "instanceTypes.0.nodeSelector",
    ]);
    await bad("c1", { backend: "kubernetes", instanceTypes: [{ name: "x" }] }, [
      "instanceTypes.0.gpu",
      "instanceTypes.0.gpuCount",
    ]);
    await bad(
      "c1",
      {
        backend: "kubernetes",
        instanceTypes: [
          { name: "n".repeat(129), gpu: "A100", gpuCount: 1 },
          { name: "ok", gpu: "A\u202e100", gpuCount: 1 },
          { name: "neg", gpu: "A100", gpuCount: -1 },
          { name: "many", gpu: "A100", gpuCount: 65 },
          { name: "half", gpu: "A100", gpuCount: 1.5 },
          { name: "", gpu: "", gpuCount: 1 },
        ],
      },
      [
        "instanceTypes.0.name",
        "instanceTypes.1.gpu",
        "instanceTypes.2.gpuCount",
        "instanceTypes.3.gpuCount",
        "instanceTypes.4.gpuCount",
        "instanceTypes.5.name",
        "instanceTypes.5.gpu",
      ],
    );
    await bad("c1", { backend: "kubernetes", instanceTypes: [type, { ...type, gpuCount: 4 }] }, [
      "instanceTypes.1.name",
    ]);
    const tooMany = Array.from({ length: 257 }, (_, i) => ({ name: `t${i}`, gpu: "A100", gpuCount: 1 }));
    await bad("c1", { backend: "kubernetes", instanceTypes: tooMany }, ["instanceTypes"]);
    await bad("-c1", { backend: "kubernetes", instanceTypes: [] }, ["clusterId"]);
    await bad("c%201", { backend: "kubernetes", instanceTypes: [] }, ["clusterId"]);
    await bad(encodeURIComponent("c\u202e1"), { backend: "kubernetes", instanceTypes: [] }, ["clusterId"]);
    await bad("c".repeat(129), { backend: "kubernetes", instanceTypes: [] }, ["clusterId"]);
    assertProblem(
      await call(typesPath(api, "c1"), { method: "PUT", token: api.serviceToken("compute") }),
      400,
      "VALIDATION_FAILED",
    );
    // 256 is the limit, not one less
    await registered(api, "c1", { backend: "kubernetes", instanceTypes: tooMany.slice(0, 256) });
    const groups = await clusterGroups(api, await api.adminToken());
    assert.deepEqual(
      groups.map((g) => g.id),
      ["c1", "test"],
      "only the good registration is stored",
    );
    assert.equal(groups[0].gpus[0].instanceTypes.length, 256);
  });

  test("a new registration replaces the cluster's list; the cluster groups show every cluster as NVCF shapes them", async (t) => {
    const api = await startApi(t, { computeBackend: "kubernetes" });
    const admin = await api.adminToken();
    assert.deepEqual(await clusterGroups(api, admin), [], "backend kubernetes: nothing built in");
    await registered(api, "c1", A100);
    await registered(api, "c2", {
      backend: "kubernetes",
      instanceTypes: [{ name: "l40s.x1", gpu: "L40S", gpuCount: 1 }],
    });
    assert.deepEqual(await clusterGroups(api, admin), [
      {
        id: "c1",
        name: "c1",
        ncaId: "callplane",
        backend: "kubernetes",
        gpus: [
          {
            name: "A100",
            instanceTypes: [
              { name: "a100.x8", description: "8x A100", default: true, gpuCount: 8 },
              { name: "a100.x1", description: "1x A100", default: false, gpuCount: 1 },
            ],
          },
          {
            name: "none",
            instanceTypes: [{ name: "cpu.small", description: "no GPU", default: true, gpuCount: 0 }],
          },
        ],
        clusters: [{ id: "c1", name: "c1" }],
      },
      {
        id: "c2",
        name: "c2",
        ncaId: "callplane",
        backend: "kubernetes",
        gpus: [
          {
            name: "L40S",
            instanceTypes: [{ name: "l40s.x1", description: "1x L40S", default: true, gpuCount: 1 }],
          },
        ],
        clusters: [{ id: "c2", name: "c2" }],
      },
    ]);

    // re-registered: the old list is gone, not merged; another cluster is untouched
    await registered(api, "c1", {
      backend: "kubernetes",
      instanceTypes: [{ name: "h100.x8", gpu: "H100", gpuCount: 8 }],
    });
    let groups = await clusterGroups(api, admin);
    assert.deepEqual(
      groups.map((g) => [g.id, g.gpus.map((x) => [x.name, x.instanceTypes.map((i) => i.name)])]),
      [
        ["c1", [["H100", ["h100.x8"]]]],
        ["c2", [["L40S", ["l40s.x1"]]]],
      ],
    );
    // an empty list: the cluster is known and offers nothing
    await registered(api, "c1", { backend: "kubernetes", instanceTypes: [] });
    groups = await clusterGroups(api, admin);
    assert.deepEqual(groups[0].gpus, []);

    // who may list them: the scope list_cluster_groups (NVCF's), which admin tokens carry and
    // API keys only when asked for
    assertProblem(await call(`${api.url}/v2/nvcf/clusterGroups`), 401, "UNAUTHENTICATED");
    const plain = await call<{ value: string }>(`${api.url}/v1/keys`, { token: admin, body: {} });
    assert.equal(plain.status, 200, plain.text);
    const refused = await call(`${api.url}/v2/nvcf/clusterGroups`, { token: plain.body.value });
    assert.equal(assertProblem(refused, 403, "FORBIDDEN_SCOPE").requiredScope, "list_cluster_groups");
    const lister = await call<{ value: string }>(`${api.url}/v1/keys`, {
      token: admin,
      body: { authorizations: { policies: [{ scopes: ["list_cluster_groups"] }] } },
    });
    assert.equal(lister.status, 200, lister.text);
    assert.equal((await clusterGroups(api, lister.body.value)).length, 2);
    // the compute service itself holds no client scope
    assertProblem(
      await call(`${api.url}/v2/nvcf/clusterGroups`, { token: api.serviceToken("compute") }),
      403,
      "FORBIDDEN_SCOPE",
    );
  });
});

describe("a deployment names an instance type some cluster offers", () => {
  test("backend kubernetes: only registered types count, and a refusal says what is offered", async (t) => {
    const api = await startApi(t, { computeBackend: "kubernetes" });
    const admin = await api.adminToken();
    const path = await createFunction(api, admin, "gpu-fn");

    // nothing registered: the agent is probably not running
    let p = assertProblem(
      await call(path, { token: admin, body: spec("A100", "a100.x8") }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    assert.match(p.detail, /gpu "A100" with instance type "a100\.x8"/);
    assert.match(p.detail, /none registered yet: is the compute agent running\?/);
    assert.deepEqual(fields(p), ["deploymentSpecifications.0.gpu"]);
    // the local type is not built in on this backend
    p = assertProblem(
      await call(path, { token: admin, body: sampleDeployment() }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    assert.match(p.detail, /gpu "local" with instance type "local\.cpu"/);

    await registered(api, "c1", A100);
    // a known GPU, an unknown type: the field is instanceType, and the offer is listed
    p = assertProblem(
      await call(path, { token: admin, body: spec("A100", "a100.x4") }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    assert.deepEqual(fields(p), ["deploymentSpecifications.0.instanceType"]);
    assert.match(p.detail, /gpu "A100" instance type "a100\.x8" \(cluster c1\)/);
    assert.match(p.detail, /gpu "none" instance type "cpu\.small" \(cluster c1\)/);
    // an unknown GPU: the field is gpu; the pair must match as a pair
    p = assertProblem(
      await call(path, { token: admin, body: spec("H100", "a100.x8") }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    assert.deepEqual(fields(p), ["deploymentSpecifications.0.gpu"]);
    // names are compared as given
    assertProblem(
      await call(path, { token: admin, body: spec("a100", "a100.x8") }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    // naming clusters: only those count, and one that is not registered is said to be
    p = assertProblem(
      await call(path, { token: admin, body: spec("A100", "a100.x8", { clusters: ["c2", "c3"] }) }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    assert.match(
      p.detail,
      /no cluster of c2, c3 offers gpu "A100" with instance type "a100\.x8" \(not registered: c2, c3\); offered elsewhere: gpu "A100" instance type "a100\.x8" \(cluster c1\)/,
    );
    // several specifications: each refused one is named by its index
    p = assertProblem(
      await call(path, {
        token: admin,
        body: {
          deploymentSpecifications: [
            spec("A100", "a100.x8").deploymentSpecifications[0],
            spec("A100", "a100.x2").deploymentSpecifications[0],
            spec("B200", "b200.x8").deploymentSpecifications[0],
          ],
        },
      }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    assert.deepEqual(fields(p), [
      "deploymentSpecifications.1.instanceType",
      "deploymentSpecifications.2.gpu",
    ]);
    assert.equal((await call(path, { token: admin })).status, 404, "no refused deployment was stored");

    // an offered pair deploys, on any cluster or on the one named
    const ok = await call<{ deployment: DeploymentDto }>(path, {
      token: admin,
      body: spec("A100", "a100.x8", { clusters: ["c1"] }),
    });
    assert.equal(ok.status, 200, ok.text);

    // an update is checked the same way, and a refused one changes nothing
    await registered(api, "c2", {
      backend: "kubernetes",
      instanceTypes: [{ name: "l40s.x1", gpu: "L40S", gpuCount: 1 }],
    });
    p = assertProblem(
      await call(path, { method: "PUT", token: admin, body: spec("L40S", "l40s.x1", { clusters: ["c1"] }) }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    assert.match(
      p.detail,
      /no cluster of c1 offers gpu "L40S" with instance type "l40s\.x1"; offered there: gpu "A100"/,
    );
    const still = await call<{ deployment: DeploymentDto }>(path, { token: admin });
    assert.equal(still.body.deployment.deploymentSpecifications[0].gpu, "A100");
    const moved = await call<{ deployment: DeploymentDto }>(path, {
      method: "PUT",
      token: admin,
      body: spec("L40S", "l40s.x1"),
    });
    assert.equal(moved.status, 200, moved.text);
    assert.equal(moved.body.deployment.deploymentSpecifications[0].gpu, "L40S");

    // a cluster that withdraws the type: new deployments and updates naming it are refused
    await registered(api, "c2", { backend: "kubernetes", instanceTypes: [] });
    assertProblem(
      await call(path, { method: "PUT", token: admin, body: spec("L40S", "l40s.x1") }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
  });

  test("a refusal lists at most 20 offered pairs, then how many more", async (t) => {
    const api = await startApi(t, { computeBackend: "kubernetes" });
    const admin = await api.adminToken();
    const path = await createFunction(api, admin, "many");
    await registered(api, "big", {
      backend: "kubernetes",
      instanceTypes: Array.from({ length: 30 }, (_, i) => ({ name: `t${i}`, gpu: "A100", gpuCount: 1 })),
    });
    const p = assertProblem(
      await call(path, { token: admin, body: spec("A100", "t99") }),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    assert.match(p.detail, /"t19"/);
    assert.doesNotMatch(p.detail, /"t20"/);
    assert.match(p.detail, /and 10 more \(GET \/v2\/nvcf\/clusterGroups lists them all\)/);
  });

  test("backend local: local/local.cpu of the agent's cluster is always offered, registered types beside it", async (t) => {
    const api = await startApi(t, { clusterId: "box" });
    const admin = await api.adminToken();
    // shown before any registration
    assert.deepEqual(await clusterGroups(api, admin), [
      {
        id: "box",
        name: "box",
        ncaId: "callplane",
        backend: "local",
        gpus: [
          {
            name: "local",
            instanceTypes: [{ name: "local.cpu", description: "no GPU", default: true, gpuCount: 0 }],
          },
        ],
        clusters: [{ id: "box", name: "box" }],
      },
    ]);
    const path = await createFunction(api, admin, "cpu-fn");
    assert.equal((await call(path, { token: admin, body: sampleDeployment() })).status, 200);
    const put = (body: unknown) => call(path, { method: "PUT", token: admin, body });
    assert.equal((await put(spec("local", "local.cpu", { clusters: ["box"] }))).status, 200);
    let p = assertProblem(
      await put(spec("local", "local.cpu", { clusters: ["elsewhere"] })),
      400,
      "INSTANCE_TYPE_UNAVAILABLE",
    );
    assert.match(p.detail, /not registered: elsewhere/);
    p = assertProblem(await put(spec("L40S", "l40s.x1")), 400, "INSTANCE_TYPE_UNAVAILABLE");
    assert.match(p.detail, /offered: gpu "local" instance type "local\.cpu" \(cluster box\)/);

    // the agent's own registration cannot take the built-in type away
    await registered(api, "box", { backend: "local", instanceTypes: [] });
    assert.equal((await put(sampleDeployment())).status, 200);
    await registered(api, "box", {
      backend: "local",
      instanceTypes: [{ name: "local.big", gpu: "local", gpuCount: 0 }],
    });
    const groups = await clusterGroups(api, admin);
    assert.deepEqual(
      groups[0].gpus[0].instanceTypes.map((i) => [i.name, i.default]),
      [
        ["local.cpu", true],
        ["local.big", false],
      ],
    );
    // and a GPU cluster registered beside it is offered too
    await registered(api, "gpu-box", {
      backend: "kubernetes",
      instanceTypes: [{ name: "l40s.x1", gpu: "L40S", gpuCount: 1 }],
    });
    assert.equal((await put(spec("L40S", "l40s.x1"))).status, 200);
    assert.equal((await put(spec("local", "local.big"))).status, 200);
  });
});

describe("the worker identity in instance reports", () => {
  const podAuth = {
    sub: "system:serviceaccount:callplane-workers:nvcf-worker-cp-1",
    saUid: "2b7c0f1e-0d0a-4e0b-9a37-3f4c1d5e6a70",
    workerIdentifiers: [{ name: "cp-1", uid: "9e1d2c3b-4a5f-4e6d-8c7b-6a5f4e3d2c1b" }],
  };

  async function deployed(api: ApiFixture): Promise<{ path: string; d: DeploymentDto }> {
    const admin = await api.adminToken();
    const path = await createFunction(api, admin, "identity");
    const r = await call<{ deployment: DeploymentDto }>(path, { token: admin, body: sampleDeployment() });
    assert.equal(r.status, 200, r.text);
    return { path, d: r.body.deployment };
  }

  function instance(d: DeploymentDto, instanceId: string, status: string, workerAuth?: unknown) {
    const now = new Date().toISOString();
    return {
      instanceId,
      deploymentId: d.deploymentId,
      functionId: d.functionId,
      versionId: d.functionVersionId,
      status,
      instanceType: "local.cpu",
      gpu: "local",
      backend: "kubernetes",
      location: "c1",
      ...(workerAuth !== undefined ? { workerAuth } : {}),
      createdAt: now,
      updatedAt: now,
    };
  }

  const report = (api: ApiFixture, instances: unknown[]) =>
    call(`${api.url}/v1/internal/instances`, {
      method: "PUT",
      token: api.serviceToken("compute"),
      body: { reporter: "k8s-agent", instances },
    });

  test("either shape is stored with its instance, shown in the deployment and queryable by instance id", async (t) => {
    const api = await startApi(t);
    const admin = await api.adminToken();
    const { path, d } = await deployed(api);
    const r = await report(api, [
      instance(d, "pod-1", "ACTIVE", podAuth),
      instance(d, "proc-1", "ACTIVE", { workerIdentifier: "wid-1" }),
      instance(d, "bare-1", "STARTING"),
    ]);
    assert.equal(r.status, 204, r.text);

    const got = await call<{ deployment: DeploymentDto }>(path, { token: admin });
    const byId = new Map(got.body.deployment.instances.map((i) => [i.instanceId, i]));
    assert.deepEqual(byId.get("pod-1")?.workerAuth, {
      sub: podAuth.sub,
      serviceAccountUid: podAuth.saUid,
      pods: podAuth.workerIdentifiers,
    });
    assert.deepEqual(byId.get("proc-1")?.workerAuth, { workerIdentifier: "wid-1" });
    assert.equal(byId.get("bare-1")?.workerAuth, undefined);
    assert.doesNotMatch(got.text, /token/i, "no token of any kind in the deployment");

    assert.deepEqual(await api.store.workerAuthOf("pod-1"), {
      instanceId: "pod-1",
      reporter: "k8s-agent",
      status: "ACTIVE",
      functionId: d.functionId,
      versionId: d.functionVersionId,
      deploymentId: d.deploymentId,
      workerAuth: podAuth,
    });
    assert.equal(await api.store.workerAuthOf("bare-1"), undefined);
    assert.equal(await api.store.workerAuthOf("no-such-instance"), undefined);

    // the next report replaces the identity (a replaced pod, same instance id)
    const next = {
      ...podAuth,
      workerIdentifiers: [{ name: "cp-1", uid: "0f0e0d0c-0b0a-4909-8807-060504030201" }],
    };
    assert.equal((await report(api, [instance(d, "pod-1", "ACTIVE", next)])).status, 204);
    assert.deepEqual((await api.store.workerAuthOf("pod-1"))?.workerAuth, next);
    assert.equal(await api.store.workerAuthOf("proc-1"), undefined, "no longer reported");

    // a terminated instance keeps no identity, even if the report carries one
    assert.equal((await report(api, [instance(d, "pod-1", "TERMINATED", next)])).status, 204);
    assert.equal(await api.store.workerAuthOf("pod-1"), undefined);
    const ended = await call<{ deployment: DeploymentDto }>(path, { token: admin });
    assert.equal(ended.body.deployment.instances[0].instanceStatus, "TERMINATED");
    assert.equal(ended.body.deployment.instances[0].workerAuth, undefined);
  });

  test("a bad worker identity is refused, naming its fields; nothing of the report is stored", async (t) => {
    const api = await startApi(t);
    const { d } = await deployed(api);
    const bad = async (workerAuth: unknown, want: string[]) => {
      const p = assertProblem(
        await report(api, [instance(d, "pod-1", "ACTIVE", workerAuth)]),
        400,
        "VALIDATION_FAILED",
      );
      assert.deepEqual(fields(p), want.map((f) => `instances.0.workerAuth.${f}`).sort(), p.detail);
    };
    await bad({ sub: podAuth.sub }, ["saUid", "workerIdentifiers"]);
    await bad({}, ["sub", "saUid", "workerIdentifiers"]);
    await bad({ ...podAuth, workerIdentifier: "wid" }, ["sub", "saUid", "workerIdentifiers"]);
    await bad({ ...podAuth, token: "eyJ..." }, ["token"]);
    await bad({ ...podAuth, workerIdentifiers: [] }, ["workerIdentifiers"]);
    await bad(
      { ...podAuth, workerIdentifiers: Array.from({ length: 17 }, () => podAuth.workerIdentifiers[0]) },
      ["workerIdentifiers"],
    );
    await bad({ ...podAuth, workerIdentifiers: [{ name: "cp-1" }] }, ["workerIdentifiers.0.uid"]);
    await bad({ ...podAuth, workerIdentifiers: [{ name: "cp-1", uid: "u", extra: 1 }] }, [
      "workerIdentifiers.0.extra",
    ]);
    await bad({ ...podAuth, sub: "system:serviceaccount:ns:\nnvcf-worker-x" }, ["sub"]);
    await bad({ ...podAuth, sub: "s".repeat(513) }, ["sub"]);
    await bad({ ...podAuth, saUid: "u".repeat(129) }, ["saUid"]);
    await bad({ ...podAuth, workerIdentifiers: [{ name: "n".repeat(254), uid: "u" }] }, [
      "workerIdentifiers.0.name",
    ]);
    await bad({ workerIdentifier: "w".repeat(257) }, ["workerIdentifier"]);
    assert.deepEqual(await api.store.listInstances(), [], "no refused report was stored");
    assert.equal(await api.store.workerAuthOf("pod-1"), undefined);
  });
});

// ---- the store's part, the same on SQLite and on a real PostgreSQL server

let server: Promise<Postgres> | undefined;
const serverCleanup: Array<() => unknown> = [];
after(async () => {
  for (const f of serverCleanup) await f();
});

const stores: Array<[string, (t: TestContext) => Promise<Store>]> = [
  [
    "sqlite",
    (t) => {
      const s = openSqliteStore(join(tmpDir(t), "callplane.db"));
      t.after(() => s.close());
      return Promise.resolve(s);
    },
  ],
  [
    "postgres",
    async (t) => {
      server ??= startPostgres({ after: (fn) => void serverCleanup.push(fn as () => unknown) });
      const url = await (await server).createDatabase(`t_${randomUUID().replaceAll("-", "")}`);
      const s = await openPostgresStore({ url });
      t.after(() => s.close());
      return s;
    },
  ],
];

for (const [kind, open] of stores) {
  test(`store (${kind}): clusters are replaced whole; a live instance's worker identity is found by id`, async (t) => {
    const s = await open(t);
    assert.deepEqual(await s.listClusters(), []);
    const at = new Date().toISOString();
    await s.registerCluster({ clusterId: "b", backend: "kubernetes", instanceTypes: [], updatedAt: at });
    await s.registerCluster({
      clusterId: "a",
      backend: "kubernetes",
      instanceTypes: [{ name: "x", gpu: "G", gpuCount: 2 }],
      updatedAt: at,
    });
    await s.registerCluster({
      clusterId: "a",
      backend: "local",
      instanceTypes: [{ name: "y", gpu: "H", gpuCount: 0 }],
      updatedAt: at,
    });
    assert.deepEqual(await s.listClusters(), [
      {
        clusterId: "a",
        backend: "local",
        instanceTypes: [{ name: "y", gpu: "H", gpuCount: 0 }],
        updatedAt: at,
      },
      { clusterId: "b", backend: "kubernetes", instanceTypes: [], updatedAt: at },
    ]);

    const base: Omit<InstanceRecord, "instanceId" | "status"> = {
      deploymentId: randomUUID(),
      functionId: randomUUID(),
      versionId: randomUUID(),
      instanceType: "x",
      gpu: "G",
      backend: "kubernetes",
      location: "a",
      createdAt: at,
      updatedAt: at,
    };
    const auth = {
      sub: "system:serviceaccount:w:nvcf-worker-p",
      saUid: "sa",
      workerIdentifiers: [{ name: "p", uid: "u" }],
    };
    await s.reportInstances("agent", [
      { ...base, instanceId: "i1", status: "ACTIVE", workerAuth: auth },
      { ...base, instanceId: "i2", status: "ACTIVE" },
    ]);
    assert.deepEqual(await s.workerAuthOf("i1"), {
      instanceId: "i1",
      reporter: "agent",
      status: "ACTIVE",
      functionId: base.functionId,
      versionId: base.versionId,
      deploymentId: base.deploymentId,
      workerAuth: auth,
    });
    assert.equal(await s.workerAuthOf("i2"), undefined);
    assert.deepEqual(
      (await s.listInstances()).map((i) => [i.instanceId, i.workerAuth]),
      [
        ["i1", auth],
        ["i2", undefined],
      ],
    );
    // the store keeps what it is given; a TERMINATED row is never answered for
    await s.reportInstances("agent", [{ ...base, instanceId: "i1", status: "TERMINATED", workerAuth: auth }]);
    assert.equal(await s.workerAuthOf("i1"), undefined);
  });
}
