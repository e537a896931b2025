// Per-worker identity with the real compute agent (local backend: the inference server and the
// worker agent as processes), the API and the auth callout in token mode: the identity is there
// before the worker starts, is the worker's NATS token, is refreshed before it expires, and is
// revoked (token refused, NATS connection closed) when the instance goes. Provisioning is
// transactional: no identity, no worker; a later failure undoes it.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdirSync, readFileSync, statSync, writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { decodeJwt } from "jose";
import { createLogger } from "../../../src/lib/log.js";
import { createComputeAgent } from "../../../src/services/compute/agent.js";
import { apiIdentityProvider, tokenSource } from "../../../src/services/compute/identity.js";
import { resolveInstanceUser } from "../../../src/services/compute/instance-user.js";
import { LocalInstance, type DesiredDeployment } from "../../../src/services/compute/local.js";
import { waitFor } from "../../testkit/client.js";
import { call, tmpDir } from "../../testkit/index.js";
import { startPlane } from "../../testkit/plane.js";
import { lifo } from "../../testkit/proc.js";
import { connectWithToken, startCallout } from "../../testkit/trust.js";
import { testInstanceEnv } from "../../testkit/compute.js";

const INSTANCE_NET = "127.0.33.0/24";
const TTL = 8;

function instanceEnv(plane: { nats: { url: string; pki: { ca: { certPem: string } } } }, dataDir: string) {
  return testInstanceEnv({ natsUrl: plane.nats.url, natsCaPem: plane.nats.pki.ca.certPem, dataDir });
}

test(
  "an instance's identity: its worker's NATS token, refreshed before it expires, revoked with the instance",
  {
    timeout: 120_000,
  },
  async (t) => {
    const ctx = lifo(t);
    const plane = await startPlane(ctx, {
      workers: 0,
      api: { workerAuth: "token", identityTtlSeconds: TTL },
    });
    const callout = await startCallout(ctx, plane.nats, plane.api, "token");
    const dataDir = tmpDir(ctx, "callplane-identity-");
    const agent = createComputeAgent({
      listen: { host: "127.0.33.250", port: 0 },
      apiUrl: plane.api.url,
      serviceToken: plane.api.serviceToken("compute"),
      instanceNetwork: INSTANCE_NET,
      syncIntervalMs: 300,
      reporter: "identity-test",
      instanceEnv: instanceEnv(plane, dataDir),
      tokenSource: tokenSource(""),
      logger: createLogger("compute", { destination: join(dataDir, "compute.log"), sync: true }),
    });
    ctx.after(() => agent.destroy());
    await agent.listen();
    const inst = await waitFor(
      "the instance ACTIVE (its worker logged in to NATS with its token)",
      () => agent.instances().find((i) => i.status === "ACTIVE"),
      { timeoutMs: 60_000, intervalMs: 100 },
    );
    const user = `worker-${plane.fn.versionId}.${inst.instanceId}`;
    assert.equal(
      inst.workerIdentifier,
      `nvcf-worker-${inst.instanceId}`,
      "reported as WorkerAuth while active",
    );
    const logins = () =>
      callout.log().filter((l) => l.msg === "Authentication successful" && l.user === user).length;
    assert.ok(logins() >= 1, "the callout let the worker in as worker-<fvid>.<instance>");
    const invoke = async (body: string) => {
      const r = await fetch(plane.invokeUrl(), {
        method: "POST",
        headers: { authorization: `Bearer ${plane.fn.apiKey}`, "content-type": "text/plain" },
        body,
      });
      return { status: r.status, body: await r.text() };
    };
    assert.deepEqual(await invoke("one"), { status: 200, body: "one" });

    // refresh: the file gets a new token before the old one expires
    const file = inst.tokenFile!;
    const first = readFileSync(file, "utf8");
    const exp1 = decodeJwt(first).exp!;
    assert.equal(decodeJwt(first).aud, "nvcf-icms:test");
    assert.equal(exp1 - decodeJwt(first).iat!, TTL);
    const second = await waitFor(
      "a refreshed token",
      () => {
        const now = readFileSync(file, "utf8");
        return now !== first ? { token: now, mtimeMs: statSync(file).mtimeMs } : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 100 },
    );
    assert.ok(second.mtimeMs < exp1 * 1000, "the new token was written before the old one expired");
    assert.ok(decodeJwt(second.token).exp! > exp1);
    // the worker's first login (its user JWT ends with the token) is over by now; it logged in again
    await waitFor("the first token's end", () => Date.now() > exp1 * 1000 + 1000 || undefined, {
      timeoutMs: 30_000,
      intervalMs: 200,
    });
    await waitFor("the worker to log in again with the refreshed token", () => logins() >= 2 || undefined, {
      timeoutMs: 30_000,
    });
    assert.deepEqual(await invoke("two"), { status: 200, body: "two" });

    // someone who copied the token connects with it; the instance then goes away
    const stolen = readFileSync(file, "utf8");
    const thief = await connectWithToken(ctx, plane.nats, stolen, { instanceId: inst.instanceId });
    const admin = await plane.api.adminToken();
    const del = await call(
      `${plane.api.url}/v2/nvcf/deployments/functions/${plane.fn.functionId}/versions/${plane.fn.versionId}`,
      { method: "DELETE", token: admin },
    );
    assert.equal(del.status, 200, del.text);
    await waitFor("the instance TERMINATED", () => inst.status === "TERMINATED" || undefined, {
      timeoutMs: 30_000,
    });
    assert.equal(inst.workerIdentifier, undefined, "no WorkerAuth once terminated");
    await waitFor("the copied token's NATS connection closed", () => thief.closed || undefined, {
      timeoutMs: 10_000,
    });
    await assert.rejects(
      connectWithToken(ctx, plane.nats, stolen, { instanceId: inst.instanceId }),
      /Authorization Violation/,
    );
    const intro = await call(`${plane.api.url}/v1/workers/tokens/introspect`, {
      token: plane.api.serviceToken("invocation"),
      body: { token: stolen },
    });
    assert.deepEqual(intro.body, { active: false });
    assert.equal(existsSync(file), false, "the token file is gone");
    await agent.close(5000);
  },
);

function desired(plane: Awaited<ReturnType<typeof startPlane>>, deploymentId: string): DesiredDeployment {
  return {
    deploymentId,
    functionId: plane.fn.functionId,
    versionId: plane.fn.versionId,
    name: "identity-tx",
    ncaId: "callplane",
    specs: [
      { gpu: "local", instanceType: "local.cpu", minInstances: 1, maxInstances: 1, maxRequestConcurrency: 1 },
    ],
    spec: {
      inferenceUrl: "/echo",
      inferencePort: 8000,
      containerImage: "local/echo",
      containerEnvironment: [],
      health: { protocol: "HTTP", uri: "/health", port: 8000, timeout: "PT10S", expectedStatusCode: 200 },
    },
  };
}

test("provisioning is transactional: no identity starts nothing; a failure after it undoes it; undoing tolerates what is gone", async (t) => {
  const ctx = lifo(t);
  const plane = await startPlane(ctx, { workers: 0, api: { workerAuth: "token" } });
  const d = await plane.api.store.getDeployment(plane.fn.functionId, plane.fn.versionId);
  const dataDir = tmpDir(ctx, "callplane-identity-tx-");
  const changes: Array<{ status: string; instanceId: string; message: string | undefined }> = [];
  const user = resolveInstanceUser("");
  const make = (identity: ReturnType<typeof apiIdentityProvider>, slot: number) => {
    const i = new LocalInstance(
      desired(plane, d!.deploymentId),
      slot,
      `127.0.33.${slot}`,
      {
        ...instanceEnv(plane, dataDir),
        identity,
        workerNatsEnv: () => ({ NVCF_NATS_ACCOUNT: "APP" }),
        allowCommand: false,
        user: () => user,
        instancesRoot: join(dataDir, "run"),
      },
      createLogger("compute", { destination: join(dataDir, "compute.log"), sync: true }),
      () => changes.push({ status: i.status, instanceId: i.instanceId, message: i.message }),
    );
    ctx.after(() => i.killNow());
    return i;
  };

  // 1. the API refuses the identity (a wrong service token): the instance is ERRORED and nothing runs
  const refused = make(apiIdentityProvider({ apiUrl: plane.api.url, serviceToken: "cps-not-a-token" }), 10);
  refused.start();
  await waitFor("ERRORED for want of an identity", () => refused.status === "ERRORED" || undefined);
  assert.match(
    refused.message ?? "",
    /could not provision the worker identity \(api\), so no worker was started/,
  );
  assert.deepEqual(refused.pids, { inference: undefined, worker: undefined });
  assert.equal(refused.workerIdentifier, undefined);
  await refused.stop();

  // 2. the identity is issued, then writing its file fails: the issue is undone at the API
  const good = apiIdentityProvider({
    apiUrl: plane.api.url,
    serviceToken: plane.api.serviceToken("compute"),
  });
  mkdirSync(join(dataDir, "instances", "identity-tx-11"), { recursive: true });
  writeFileSync(join(dataDir, "instances", "identity-tx-11", "identity"), "a file where the folder goes");
  const broken = make(good, 11);
  broken.start();
  const failed = await waitFor("ERRORED because the token file cannot be written", () =>
    changes.find(
      (c) => c.status === "ERRORED" && /cannot write the worker identity token/.test(c.message ?? ""),
    ),
  );
  assert.deepEqual(broken.pids, { inference: undefined, worker: undefined });
  const rec = await call<{ status: string; revokedWhy: string }>(
    `${plane.api.url}/v1/internal/instances/${failed.instanceId}/identity`,
    { token: plane.api.serviceToken("compute") },
  );
  assert.equal(rec.status, 200, rec.text);
  assert.equal(rec.body.status, "REVOKED", "the identity issued before the failure was revoked");
  await broken.stop();

  // 3. undoing what is already gone: a revoked identity, one never issued, a missing file
  await good.revoke(failed.instanceId);
  await good.revoke(randomUUID());
});
