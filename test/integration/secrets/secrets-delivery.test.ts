// Secrets reach the inference server: a function with secrets deployed on the local compute
// backend (real instance processes: the example inference server and a worker agent), invoked
// through a real invocation service and NATS; its server reads them from the secrets.json that
// SECRETS_PATH names (and, with compute.secrets.env, from its environment). An update reaches the
// running instance's file, not its environment; the folder lives outside the data folder, is the
// instance's own (0700/0600), and is removed when the instance stops.
// Addresses: agent 127.0.70.1, invocation 127.0.70.2, instances 127.0.71.0/24.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { DEFAULT_QUEUE_LIMITS } from "../../../src/lib/nats/index.js";
import { createComputeAgent } from "../../../src/services/compute/agent.js";
import { secretsRoot } from "../../../src/services/compute/secrets.js";
import { createInvocationService } from "../../../src/services/invocation/service.js";
import { waitFor } from "../../testkit/client.js";
import { lifo } from "../../testkit/proc.js";
import { call, sampleDeployment, startApi, startNats, tmpDir } from "../../testkit/index.js";
import { testInstanceEnv } from "../../testkit/compute.js";

const sha = (v: string) => createHash("sha256").update(v).digest("hex");

interface SecretsAnswer {
  path: string;
  names: string[];
  sha256: Record<string, string>;
  name?: string;
  value?: unknown;
  env?: { name: string; set: boolean; sha256: string | null };
}

test("an instance's inference server reads its function's secrets; an update reaches its file", async (t) => {
  const ctx = lifo(t);
  const nats = await startNats(ctx, { region: "local" });
  const api = await startApi(ctx, { nats, region: "local" });
  const admin = await api.adminToken();
  const dataDir = tmpDir(ctx, "callplane-delivery-");
  const secretsDir = tmpDir(ctx, "callplane-delivery-secrets-");
  const root = secretsRoot(dataDir, secretsDir);
  const agent = createComputeAgent({
    listen: { host: "127.0.70.1", port: 0 },
    apiUrl: api.url,
    serviceToken: api.serviceToken("compute"),
    instanceNetwork: "127.0.71.0/24",
    syncIntervalMs: 300,
    reporter: "delivery-test",
    instanceEnv: testInstanceEnv(
      { natsUrl: nats.url, natsCaPem: nats.pki.ca.certPem, dataDir },
      {
        region: "local",
        ackWaitSeconds: DEFAULT_QUEUE_LIMITS.ackWaitSeconds,
        streamMaxMessages: DEFAULT_QUEUE_LIMITS.maxMessages,
        streamMaxMessageBytes: DEFAULT_QUEUE_LIMITS.maxMessageBytes,
        restart: { initialMs: 500, maxMs: 2000 },
        logLevel: "warn",
      },
    ),
    tokenSource: "api",
    secrets: { root, env: true },
  });
  ctx.after(() => agent.destroy());
  await agent.listen();
  const invocation = createInvocationService({
    listen: { host: "127.0.70.2", port: 0 },
    region: "local",
    serviceDomain: "nvcf.svc.cluster.local",
    nats: nats.access("invocation"),
    apiUrl: api.url,
    serviceToken: api.serviceToken("invocation"),
    queue: DEFAULT_QUEUE_LIMITS,
  });
  ctx.after(() => invocation.destroy());
  const invokeBase = (await invocation.listen()).origin;

  const token = `token-${randomBytes(8).toString("hex")}`;
  const created = await call<{ function: { id: string; versionId: string } }>(
    `${api.url}/v2/nvcf/functions`,
    {
      token: admin,
      body: {
        name: "reads-secrets",
        inferenceUrl: "/secrets",
        containerImage: "local/example",
        health: { uri: "/health" },
        secrets: [
          { name: "API_TOKEN", value: token },
          { name: "registry.example.com", value: { username: "u", password: "p" } },
        ],
      },
    },
  );
  assert.equal(created.status, 200, created.text);
  const { id: fid, versionId: vid } = created.body.function;
  const dep = await call(`${api.url}/v2/nvcf/deployments/functions/${fid}/versions/${vid}`, {
    token: admin,
    body: sampleDeployment(1, 1, 4),
  });
  assert.equal(dep.status, 200, dep.text);
  const key = (await call<{ value: string }>(`${api.url}/v1/keys`, { token: admin, body: {} })).body.value;
  await waitFor(
    "the instance ACTIVE",
    () => agent.instances().find((i) => i.deployment.versionId === vid && i.status === "ACTIVE"),
    60_000,
  );
  const invoke = async (query: string): Promise<SecretsAnswer> => {
    const r = await fetch(`${invokeBase}/v2/nvcf/pexec/functions/${fid}${query}`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: "{}",
    });
    const text = await r.text();
    assert.equal(r.status, 200, text);
    return JSON.parse(text) as SecretsAnswer;
  };

  // an invocation, end to end: the inference server read the file the compute agent wrote
  const first = await invoke("?name=API_TOKEN&env=API_TOKEN");
  assert.deepEqual(first.names, ["API_TOKEN", "registry.example.com"]);
  assert.equal(first.value, token);
  assert.equal(first.sha256.API_TOKEN, sha(token));
  assert.equal(first.sha256["registry.example.com"], sha(JSON.stringify({ username: "u", password: "p" })));
  assert.deepEqual(
    first.env,
    { name: "API_TOKEN", set: true, sha256: sha(token) },
    "compute.secrets.env: in the environment too",
  );
  // where the file lives: the instance's own folder under the secrets root, outside the data folder
  const inst = agent.instances().find((i) => i.deployment.versionId === vid)!;
  assert.equal(first.path, join(root, inst.instanceId, "secrets.json"));
  assert.ok(!first.path.startsWith(dataDir));
  assert.equal(statSync(join(root, inst.instanceId)).mode & 0o777, 0o700);
  assert.equal(statSync(first.path).mode & 0o777, 0o600);

  // an update: the running instance's file is rewritten; its environment keeps the start value
  const next = `token-${randomBytes(8).toString("hex")}`;
  const put = await call(`${api.url}/v2/nvcf/secrets/functions/${fid}/versions/${vid}`, {
    method: "PUT",
    token: admin,
    body: {
      secrets: [
        { name: "API_TOKEN", value: next },
        { name: "ADDED", value: "later" },
      ],
    },
  });
  assert.equal(put.status, 204, put.text);
  const updated = await waitFor(
    "the running instance's file updated",
    async () => {
      const a = await invoke("?env=API_TOKEN");
      return a.sha256.API_TOKEN === sha(next) && a;
    },
    20_000,
  );
  assert.deepEqual(updated.names, ["ADDED", "API_TOKEN", "registry.example.com"]);
  assert.equal(
    updated.env?.sha256,
    sha(token),
    "environment variables keep the values the server started with",
  );
  assert.equal(inst.secretsRevision, 2);

  // undeployed: the instance stops and its secrets folder goes with it
  const undeploy = await call(`${api.url}/v2/nvcf/deployments/functions/${fid}/versions/${vid}`, {
    method: "DELETE",
    token: admin,
  });
  assert.equal(undeploy.status, 200, undeploy.text);
  await waitFor("the secrets folder removed", () => !existsSync(join(root, inst.instanceId)), 30_000);
  assert.deepEqual(readdirSync(root), []);
});
