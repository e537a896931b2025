// The store behaves the same on SQLite and on a real PostgreSQL server (one suite, run on both),
// a failed multi-row write leaves nothing behind on PostgreSQL too, two API replicas (processes)
// sharing one PostgreSQL database lose nothing under concurrent writes, and an API replica killed
// with SIGKILL in the middle of writes leaves no partial row.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { after, test, type TestContext } from "node:test";
import pg from "pg";
import { request } from "undici";
import { ensureKeyringFile } from "../../../src/lib/secrets/index.js";
import { openPostgresStore } from "../../../src/services/api/store/postgres.js";
import { openSqliteStore } from "../../../src/services/api/store/sqlite.js";
import type { ApiKeyRecord } from "../../../src/services/api/store/types.js";
import {
  NameTakenError,
  type FunctionVersionRecord,
  type InstanceRecord,
  type Store,
} from "../../../src/services/api/store/types.js";
import { distRoot, sampleFunction, startApi, startNats, tmpDir } from "../../testkit/index.js";
import { startPostgres, type Postgres } from "../../testkit/postgres.js";
import { reverseScope, startService } from "../../testkit/processes.js";

function record(name: string, functionId: string = randomUUID()): FunctionVersionRecord {
  return {
    functionId,
    versionId: randomUUID(),
    name,
    ncaId: "callplane",
    createdAt: new Date().toISOString(),
    spec: {
      inferenceUrl: "/echo",
      inferencePort: 8000,
      health: { protocol: "HTTP", uri: "/health", port: 8000, timeout: "PT10S", expectedStatusCode: 200 },
      containerImage: "local/echo",
      containerEnvironment: [],
      tags: [],
      functionType: "DEFAULT",
      apiBodyFormat: "CUSTOM",
    },
  };
}

function instance(
  v: FunctionVersionRecord,
  instanceId: string,
  status: InstanceRecord["status"] = "ACTIVE",
): InstanceRecord {
  const now = new Date().toISOString();
  return {
    instanceId,
    deploymentId: randomUUID(),
    functionId: v.functionId,
    versionId: v.versionId,
    status,
    instanceType: "local.cpu",
    gpu: "local",
    backend: "local",
    location: "here",
    createdAt: now,
    updatedAt: now,
  };
}

// One PostgreSQL server for the file, started by the first test that needs it and stopped after
// the last; each test gets a database of its own.
let server: Promise<Postgres> | undefined;
const serverCleanup: Array<() => unknown> = [];
after(async () => {
  for (const f of serverCleanup) await f();
});
function postgres(): Promise<Postgres> {
  server ??= startPostgres({ after: (fn) => void serverCleanup.push(fn as () => unknown) });
  return server;
}

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
      const url = await (await postgres()).createDatabase(`t_${randomUUID().replaceAll("-", "")}`);
      const s = await openPostgresStore({ url });
      t.after(() => s.close());
      return s;
    },
  ],
];

for (const [kind, open] of stores) {
  test(`store (${kind}): functions and versions`, async (t) => {
    const s = await open(t);
    const a = record("alpha");
    await s.createFunction(a);
    await assert.rejects(s.createFunction(record("alpha")), NameTakenError);
    assert.deepEqual(await s.getFunctionByName("alpha"), { functionId: a.functionId });
    assert.equal(await s.functionExists(a.functionId), true);
    assert.equal(await s.functionExists(randomUUID()), false);
    const a2 = { ...record("alpha", a.functionId), createdAt: new Date(Date.now() + 1000).toISOString() };
    await s.createVersion(a2);
    assert.deepEqual(
      (await s.listVersions(a.functionId)).map((v) => v.versionId),
      [a.versionId, a2.versionId],
    );
    assert.equal((await s.getVersion(a.functionId, a.versionId))?.spec.inferenceUrl, "/echo");
    assert.equal(await s.updateVersion(a.functionId, a.versionId, { ...a.spec, inferenceUrl: "/x" }), true);
    assert.equal((await s.getVersion(a.functionId, a.versionId))?.spec.inferenceUrl, "/x");
    assert.equal(await s.updateVersion(a.functionId, randomUUID(), a.spec), false);
    await s.createFunction(record("beta"));
    assert.deepEqual(
      (await s.listVersions()).map((v) => v.name),
      ["alpha", "alpha", "beta"],
    );
    // deleting: a deployed version is refused; the last version takes its function with it
    const now = new Date().toISOString();
    const d = {
      deploymentId: randomUUID(),
      functionId: a.functionId,
      versionId: a.versionId,
      specs: [],
      createdAt: now,
      updatedAt: now,
    };
    assert.equal(await s.createDeployment(d), "created");
    assert.equal(await s.deleteVersion(a.functionId, a.versionId), "deployed");
    assert.equal(await s.deleteVersion(a.functionId, randomUUID()), "not-found");
    assert.equal(await s.deleteVersion(a.functionId, a2.versionId), "deleted");
    assert.equal(await s.functionExists(a.functionId), true);
    assert.equal(await s.deleteDeployment(a.functionId, a.versionId), true);
    assert.equal(await s.deleteVersion(a.functionId, a.versionId), "deleted");
    assert.equal(await s.functionExists(a.functionId), false);
    assert.equal(await s.getFunctionByName("alpha"), undefined);
  });

  test(`store (${kind}): deployments and instances`, async (t) => {
    const s = await open(t);
    const v = record("gamma");
    await s.createFunction(v);
    const now = new Date().toISOString();
    const d = {
      deploymentId: randomUUID(),
      functionId: v.functionId,
      versionId: v.versionId,
      specs: [],
      createdAt: now,
      updatedAt: now,
    };
    assert.equal(await s.createDeployment(d), "created");
    assert.equal(await s.createDeployment({ ...d, deploymentId: randomUUID() }), "exists");
    assert.equal((await s.getDeployment(v.functionId, v.versionId))?.deploymentId, d.deploymentId);
    assert.equal((await s.getDeploymentById(d.deploymentId))?.versionId, v.versionId);
    const spec = {
      gpu: "local",
      instanceType: "local.cpu",
      minInstances: 1,
      maxInstances: 2,
      maxRequestConcurrency: 1,
    };
    assert.equal(await s.updateDeployment(v.functionId, v.versionId, [spec], now), true);
    assert.deepEqual((await s.getDeployment(v.functionId, v.versionId))?.specs, [spec]);
    assert.equal((await s.listDeployments()).length, 1);
    // a reporter's report replaces what it said before, and leaves other reporters' rows alone
    // (and says which of its instances ended: live before, not live now, whatever this process saw)
    assert.deepEqual(await s.reportInstances("agent-1", [instance(v, "i1"), instance(v, "i2")]), {
      refused: [],
      ended: [],
    });
    await s.reportInstances("agent-2", [instance(v, "j1")]);
    const r = await s.reportInstances("agent-1", [instance(v, "i2", "TERMINATED")]);
    assert.deepEqual(r.ended.sort(), ["i1", "i2"]);
    assert.deepEqual((await s.reportInstances("agent-1", [instance(v, "i2", "TERMINATED")])).ended, []);
    const list = await s.listInstances(v.versionId);
    assert.deepEqual(list.map((i) => [i.instanceId, i.status]).sort(), [
      ["i2", "TERMINATED"],
      ["j1", "ACTIVE"],
    ]);
    // undeploying removes the version's instances
    assert.equal(await s.deleteDeployment(v.functionId, v.versionId), true);
    assert.equal(await s.deleteDeployment(v.functionId, v.versionId), false);
    assert.deepEqual(await s.listInstances(v.versionId), []);
  });

  test(`store (${kind}): pod identities and cluster keys`, async (t) => {
    const s = await open(t);
    const v = record("delta");
    await s.createFunction(v);
    const sub = "system:serviceaccount:nvcf-workers:nvcf-worker-cp-p1";
    const pod = (i: InstanceRecord, uid = "sa-1"): InstanceRecord => ({
      ...i,
      workerAuth: { sub, saUid: uid, workerIdentifiers: [{ name: "cp-p1", uid: "pod-1" }] },
    });
    assert.deepEqual(await s.reportInstances("kubernetes-a", [pod(instance(v, "p1"))]), {
      refused: [],
      ended: [],
    });
    // another reporter cannot rewrite the instance (nor its worker identity); its own rows are taken
    assert.deepEqual(
      await s.reportInstances("kubernetes-b", [
        pod(instance(v, "p1"), "sa-evil"),
        pod(instance(v, "p2"), "b"),
      ]),
      { refused: ["p1"], ended: [] },
    );
    assert.equal(((await s.workerAuthOf("p1"))?.workerAuth as { saUid: string }).saUid, "sa-1");
    // two live instances name the subject: the asked reporter's comes back, whichever was written last
    await s.reportInstances("kubernetes-a", [pod(instance(v, "p1"))]);
    for (const reporter of ["kubernetes-a", "kubernetes-b"])
      assert.equal((await s.workerAuthBySubject(sub, reporter))?.reporter, reporter);
    assert.equal((await s.workerAuthBySubject(sub, "kubernetes-c"))?.workerAuth !== undefined, true);
    // a terminated instance is no one's worker
    await s.reportInstances("kubernetes-a", [pod(instance(v, "p1", "TERMINATED"))]);
    assert.equal((await s.workerAuthBySubject(sub, "kubernetes-a"))?.reporter, "kubernetes-b");
    await s.reportInstances("kubernetes-b", []);
    assert.equal(await s.workerAuthBySubject(sub, "kubernetes-a"), undefined);

    assert.equal(await s.clusterKeys("c1"), undefined);
    const keys = {
      clusterId: "c1",
      issuer: "https://kube.example",
      jwks: { keys: [{ kty: "EC" as const, kid: "k1", crv: "P-256" as const, x: "x", y: "y" }] },
      jwksHash: "h1",
      updatedBy: "admin:me",
      updatedAt: new Date().toISOString(),
    };
    await s.setClusterKeys(keys);
    // no agent pinned yet: the field reads back as absent
    assert.deepEqual(await s.clusterKeys("c1"), { ...keys, agentSubject: undefined });
    const replaced = {
      ...keys,
      issuer: "https://other.example",
      jwksHash: "h2",
      agentSubject: "system:serviceaccount:nvcf:compute-agent",
      updatedBy: "agent:x",
    };
    await s.setClusterKeys(replaced);
    assert.deepEqual(await s.clusterKeys("c1"), replaced);
  });

  test(`store (${kind}): API keys`, async (t) => {
    const s = await open(t);
    const k: ApiKeyRecord = {
      keyId: randomUUID(),
      hash: randomUUID(),
      description: "k",
      ownerId: "me",
      ncaId: "callplane",
      scopes: ["invoke_function"],
      policies: [{ scopes: ["invoke_function"], resources: [{ id: "*", type: "account-functions" }] }],
      expiresAt: new Date(Date.now() + 3600_000).toISOString(),
      createdAt: new Date().toISOString(),
    };
    await s.createApiKey(k);
    assert.deepEqual((await s.getApiKeyByHash(k.hash))?.scopes, ["invoke_function"]);
    assert.equal((await s.getApiKey(k.keyId))?.revokedAt, undefined);
    assert.equal((await s.listApiKeys()).length, 1);
    assert.equal(await s.revokeApiKey(k.keyId, new Date().toISOString()), true);
    assert.equal(await s.revokeApiKey(k.keyId, new Date().toISOString()), false, "a key is revoked once");
    assert.ok((await s.getApiKey(k.keyId))?.revokedAt);
  });

  test(`store (${kind}): the console's audit log, newest first and paged`, async (t) => {
    const s = await open(t);
    assert.deepEqual(await s.listAudit({ limit: 10, offset: 0 }), []);
    const at = new Date().toISOString();
    // three in the same millisecond: the insertion order tells them apart
    for (const [i, action] of (["scale", "undeploy", "revoke-identity"] as const).entries())
      await s.appendAudit({
        id: randomUUID(),
        at,
        subject: "ops@example.com",
        tokenId: i === 0 ? undefined : `jti-${i}`,
        action,
        target: `t-${i}`,
        detail: { n: i, nested: { ok: true } },
      });
    const all = await s.listAudit({ limit: 10, offset: 0 });
    assert.deepEqual(
      all.map((e) => e.action),
      ["revoke-identity", "undeploy", "scale"],
    );
    assert.deepEqual(all[2].detail, { n: 0, nested: { ok: true } });
    assert.equal(all[0].at, at);
    assert.deepEqual(
      (await s.listAudit({ limit: 1, offset: 1 })).map((e) => e.target),
      ["t-1"],
    );
    assert.deepEqual(
      all.map((e) => [e.subject, e.tokenId]),
      [
        ["ops@example.com", "jti-2"],
        ["ops@example.com", "jti-1"],
        ["ops@example.com", undefined],
      ],
      "who: the token's subject, and its id when it has one",
    );
  });

  test(`store (${kind}): the audit log is pruned past its age, then past its row count`, async (t) => {
    const s = await open(t);
    const day = 86_400_000;
    const now = Date.parse("2030-06-01T00:00:00.000Z");
    // five actions a day apart, the oldest first
    for (let i = 0; i < 5; i++)
      await s.appendAudit({
        id: randomUUID(),
        at: new Date(now - (4 - i) * day).toISOString(),
        subject: "ops",
        tokenId: undefined,
        action: "scale",
        target: `t-${i}`,
        detail: {},
      });
    const targets = async () => (await s.listAudit({ limit: 10, offset: 0 })).map((e) => e.target);
    assert.equal(await s.pruneAudit({ keepRows: 10, before: new Date(now - 10 * day).toISOString() }), 0);
    assert.deepEqual(await targets(), ["t-4", "t-3", "t-2", "t-1", "t-0"], "nothing past either bound");
    // older than 3 days: t-0 (4 days old) goes
    assert.equal(await s.pruneAudit({ keepRows: 10, before: new Date(now - 3.5 * day).toISOString() }), 1);
    assert.deepEqual(await targets(), ["t-4", "t-3", "t-2", "t-1"]);
    // the newest 2 are kept
    assert.equal(await s.pruneAudit({ keepRows: 2, before: new Date(now - 10 * day).toISOString() }), 2);
    assert.deepEqual(await targets(), ["t-4", "t-3"]);
  });
}

test("store (postgres): a failed createFunction or instance report leaves nothing behind", async (t) => {
  const url = await (await postgres()).createDatabase(`t_${randomUUID().replaceAll("-", "")}`);
  const s = await openPostgresStore({ url });
  t.after(() => s.close());
  await s.pool.query(`CREATE FUNCTION fail_insert() RETURNS trigger AS $$
      BEGIN RAISE EXCEPTION 'injected'; END $$ LANGUAGE plpgsql`);
  await s.pool.query(
    "CREATE TRIGGER fail_version_insert BEFORE INSERT ON function_versions FOR EACH ROW EXECUTE FUNCTION fail_insert()",
  );
  await assert.rejects(s.createFunction(record("delta")), /injected/);
  assert.equal((await s.pool.query<{ n: number }>("SELECT COUNT(*)::int AS n FROM functions")).rows[0].n, 0);
  await s.pool.query("DROP TRIGGER fail_version_insert ON function_versions");

  const v = record("epsilon");
  await s.createFunction(v);
  await s.reportInstances("agent", [instance(v, "i1")]);
  await s.pool.query(
    "CREATE TRIGGER fail_instance_insert BEFORE INSERT ON instances FOR EACH ROW EXECUTE FUNCTION fail_insert()",
  );
  await assert.rejects(s.reportInstances("agent", [instance(v, "i2")]), /injected/);
  assert.deepEqual(
    (await s.listInstances()).map((i) => i.instanceId),
    ["i1"],
    "the reporter's earlier rows are kept",
  );
});

/** Two API processes on one PostgreSQL database (keys and tokens from one in-process fixture). */
async function apiReplicas(t: TestContext, n: number) {
  const scope = reverseScope(t);
  const url = await (await postgres()).createDatabase(`t_${randomUUID().replaceAll("-", "")}`);
  const nats = await startNats(scope);
  const fixture = await startApi(scope);
  const dir = tmpDir(scope, "callplane-pg-api-");
  // the secret store's keyring (the stack generates it on first start)
  ensureKeyringFile(join(dir, "keys", "mek.json"));
  const start = (i: number) =>
    startService(scope, `api-${i}`, join(distRoot, "src", "services", "api", "main.js"), {
      CALLPLANE__GLOBAL__DATA_DIR: dir,
      CALLPLANE__LOG__LEVEL: "warn",
      CALLPLANE__API__LISTEN: "127.0.0.1:0",
      CALLPLANE__API__DATABASE__DRIVER: "postgres",
      CALLPLANE__API__DATABASE__URL: url,
      ...nats.serviceEnv(),
      CALLPLANE__ADMIN_ISSUER_PROXY__ENABLED: "false",
      CALLPLANE__AUTH__ADMIN_PUBLIC_KEY_FILE: fixture.publicKeyFile,
      CALLPLANE__AUTH__ADMIN_SIGNING_KEY_FILE: fixture.privateKeyFile,
      CALLPLANE__AUTH__SERVICE_TOKEN_DIR: fixture.serviceTokenDir,
    });
  const replicas = [];
  for (let i = 0; i < n; i++) replicas.push(await start(i));
  const admin = await fixture.adminToken();
  const db = new pg.Pool({ connectionString: url, max: 2 });
  scope.after(() => db.end());
  return { replicas, admin, db, start };
}

async function createFunction(api: string, admin: string, name: string) {
  const r = await request(`${api}/v2/nvcf/functions`, {
    method: "POST",
    headers: { authorization: `Bearer ${admin}`, "content-type": "application/json" },
    body: JSON.stringify(sampleFunction(name)),
  });
  return {
    status: r.statusCode,
    body: (await r.body.json()) as { function?: { id: string }; code?: string },
  };
}

test("two API replicas on one PostgreSQL database: concurrent writes through both, nothing lost or doubled", async (t) => {
  const { replicas, admin, db } = await apiReplicas(t, 2);
  const urls = replicas.map((r) => r.urls.api);
  // 120 distinct names spread over both replicas, and 20 names each sent to both at once
  const distinct = Array.from({ length: 120 }, (_, i) => createFunction(urls[i % 2], admin, `fn-${i}`));
  const contested = Array.from({ length: 20 }, (_, i) =>
    Promise.all(urls.map((u) => createFunction(u, admin, `both-${i}`))),
  );
  const made = await Promise.all(distinct);
  for (const m of made) assert.equal(m.status, 200, JSON.stringify(m.body));
  for (const pair of await Promise.all(contested)) {
    const statuses = pair.map((p) => p.status).sort();
    assert.deepEqual(
      statuses,
      [200, 409],
      `one replica wins a contested name, the other says so: ${JSON.stringify(pair)}`,
    );
    assert.equal(pair.find((p) => p.status === 409)?.body.code, "FUNCTION_NAME_TAKEN");
  }
  const count = async (sql: string) => (await db.query<{ n: number }>(sql)).rows[0].n;
  assert.equal(await count("SELECT COUNT(*)::int AS n FROM functions"), 140);
  assert.equal(await count("SELECT COUNT(*)::int AS n FROM function_versions"), 140);
  // each replica sees the other's writes
  for (const u of urls) {
    const r = await request(`${u}/v2/nvcf/functions`, { headers: { authorization: `Bearer ${admin}` } });
    const list = (await r.body.json()) as { functions: unknown[] };
    assert.equal(list.functions.length, 140);
  }
});

test("an API replica killed with SIGKILL mid-write leaves no function without its version", async (t) => {
  const { replicas, admin, db } = await apiReplicas(t, 1);
  const api = replicas[0].urls.api;
  let sent = 0;
  let stop = false;
  const writers = Array.from({ length: 8 }, async (_, w) => {
    while (!stop) {
      sent++;
      try {
        await createFunction(api, admin, `kill-${w}-${sent}`);
      } catch {
        return; // the connection died with the process
      }
    }
  });
  // kill once some writes are through, while others are in flight
  for (let i = 0; i < 200; i++) {
    const n = (await db.query<{ n: number }>("SELECT COUNT(*)::int AS n FROM functions")).rows[0].n;
    if (n >= 40) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  await replicas[0].kill("SIGKILL");
  stop = true;
  await Promise.all(writers);
  const orphans = await db.query(
    "SELECT f.function_id FROM functions f LEFT JOIN function_versions v ON v.function_id = f.function_id WHERE v.version_id IS NULL",
  );
  const functions = (await db.query<{ n: number }>("SELECT COUNT(*)::int AS n FROM functions")).rows[0].n;
  t.diagnostic(`${sent} writes sent, ${functions} functions stored when the replica was killed`);
  assert.ok(functions >= 40);
  assert.equal(orphans.rowCount, 0, "every stored function has its version");
});
