// Pod tokens verified by the plane (issue 21), with tokens a real kube-apiserver issued: a cluster is
// enrolled by an admin, its agent pushes key changes with its own token as proof, and the API's NATS
// auth webhook and introspection accept a worker's pod token only when it names a live instance's
// pod and service account, reported by that cluster's agent. Every refusal the issue lists is here,
// each with the reason the API logs. (Signing-level cases against keys the test holds are in
// test/unit/pod-token.test.ts; the NATS login end to end is in test/e2e/kubernetes.test.ts.)
import assert from "node:assert/strict";
import { generateKeyPairSync, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { SignJWT, decodeJwt, decodeProtectedHeader, exportJWK } from "jose";
import { kubePaths, type KubeObject } from "../../../src/lib/kube/index.js";
import { createLogger } from "../../../src/lib/log.js";
import { call } from "../../testkit/client.js";
import { tmpDir } from "../../testkit/index.js";
import { startKubeApiServer, type KubeApiServer } from "../../testkit/kube-apiserver.js";
import { lifo } from "../../testkit/proc.js";
import { startApi, type ApiFixture } from "../../testkit/services.js";

const NS = "callplane-workers";
const CLUSTER = "c1";
const aud = (c: string) => `nvcf-icms:${c}`;

interface Worker {
  instanceId: string;
  pod: { name: string; uid: string };
  sa: { name: string; uid: string };
  sub: string;
}

/** The cluster's published keys, read as anyone reads them (discovery is anonymous on the test server). */
async function clusterJwks(k: KubeApiServer): Promise<{ keys: Array<Record<string, unknown>> }> {
  const r = await k.admin.send("GET", "/openid/v1/jwks", { accept: "application/jwk-set+json" });
  const text = await r.body.text();
  assert.equal(r.statusCode, 200, text);
  return JSON.parse(text) as { keys: Array<Record<string, unknown>> };
}

async function setup(t: Parameters<typeof lifo>[0]) {
  const ctx = lifo(t);
  const k = await startKubeApiServer(ctx);
  const dir = tmpDir(ctx, "callplane-podtokens-");
  const logFile = join(dir, "api.log");
  const api = await startApi(ctx, {
    workerAuth: "token",
    logger: createLogger("api", { destination: logFile, sync: true }),
  });
  await k.createNamespace(NS);
  await k.createNamespace("nvcf");
  await k.createServiceAccount("nvcf", "compute-agent");
  const admin = await api.adminToken({ scopes: ["cluster-management"] });
  const jwks = await clusterJwks(k);
  const logs = () =>
    readFileSync(logFile, "utf8")
      .split("\n")
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  return { ctx, k, api, admin, jwks, logs };
}

function putKeys(api: ApiFixture, cluster: string, token: string, body: Record<string, unknown>) {
  return call(`${api.url}/v1/internal/clusters/${cluster}/keys`, { method: "PUT", token, body });
}

/** Makes a worker's account and pod as the backend does (names from the pod contract), and its token. */
async function makeWorker(
  k: KubeApiServer,
  opts: { audience?: string; bound?: boolean } = {},
): Promise<Worker & { token: string }> {
  const instanceId = randomUUID();
  const podName = `cp-${instanceId}`;
  const saName = `nvcf-worker-${podName}`;
  const sa = await k.createServiceAccount(NS, saName);
  const pod = await k.admin.create<KubeObject>(kubePaths.pods(NS), {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: podName, namespace: NS },
    spec: {
      serviceAccountName: saName,
      automountServiceAccountToken: false,
      containers: [{ name: "worker", image: "callplane:test" }],
    },
  });
  const w = {
    instanceId,
    pod: { name: podName, uid: pod.metadata!.uid! },
    sa: { name: saName, uid: sa.metadata!.uid! },
    sub: `system:serviceaccount:${NS}:${saName}`,
  };
  const token = await k.tokenFor(NS, saName, {
    audiences: [opts.audience ?? aud(CLUSTER)],
    ...(opts.bound === false ? {} : { boundPod: w.pod }),
  });
  return { ...w, token };
}

function instance(w: Worker, versionId: string, status = "ACTIVE") {
  const now = new Date().toISOString();
  return {
    instanceId: w.instanceId,
    deploymentId: `d-${versionId}`,
    functionId: `f-${versionId}`,
    versionId,
    status,
    instanceType: "gpu.x1",
    gpu: "T4",
    backend: "kubernetes",
    location: CLUSTER,
    workerAuth: { sub: w.sub, saUid: w.sa.uid, workerIdentifiers: [{ name: w.pod.name, uid: w.pod.uid }] },
    createdAt: now,
    updatedAt: now,
  };
}

/** A status report as a compute agent sends it; an enrolled cluster's reporter adds its agent's token as proof. */
function reportAs(api: ApiFixture, instances: unknown[], o: { reporter?: string; proofs?: string[] } = {}) {
  return call(`${api.url}/v1/internal/instances`, {
    method: "PUT",
    token: api.serviceToken("compute"),
    body: { reporter: o.reporter ?? `kubernetes-${CLUSTER}`, instances },
    ...(o.proofs ? { headers: { "x-callplane-cluster-proof": o.proofs.join(",") } } : {}),
  });
}

function login(api: ApiFixture, token: string) {
  return call<{ code?: string; detail?: string; userId?: string; functionVersionId?: string }>(
    `${api.url}/v2/nvcf/webhook/nats-auth`,
    {
      method: "POST",
      token: api.serviceToken("nats-auth-callout"),
      body: { account: "APP", pluginName: "webhook", payload: token },
    },
  );
}

/** A login refused with `code`, and the reason the API logged for it. */
async function refused(
  s: { api: ApiFixture; logs: () => Array<Record<string, unknown>> },
  token: string,
  code: string,
  reason: RegExp,
) {
  const before = s.logs().length;
  const r = await login(s.api, token);
  assert.equal(r.status, 401, r.text);
  assert.equal(r.body.code, code, r.text);
  const logged = s
    .logs()
    .slice(before)
    .find((l) => l.msg === "worker token refused");
  assert.ok(logged, "the refusal is logged");
  assert.match(String(logged.reason), reason);
  assert.match(String(r.body.detail), reason, "the webhook's answer says why too");
  return logged;
}

test(
  "pod tokens: a cluster is enrolled by an admin, and only its agent's proof changes its keys",
  { timeout: 120_000 },
  async (t) => {
    const { k, api, admin, jwks } = await setup(t);
    const agentToken = await k.tokenFor("nvcf", "compute-agent", { audiences: [aud(CLUSTER)] });
    const compute = api.serviceToken("compute");

    // the shared compute credential cannot enroll a cluster by itself
    let r = await putKeys(api, CLUSTER, compute, { issuer: k.issuer, jwks, proofs: [agentToken] });
    assert.equal(r.status, 403, r.text);
    assert.equal(r.body.code, "CLUSTER_NOT_ENROLLED");
    assert.match(String(r.body.detail), /callplane cluster enroll c1/);

    // bad keys are refused by name, before anything is stored
    const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
    const priv = { ...(await exportJWK(privateKey)), kid: "leaked" };
    r = await putKeys(api, CLUSTER, admin, { issuer: k.issuer, jwks: { keys: [priv] } });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.body.code, "CLUSTER_KEYS_INVALID");
    assert.match(String(r.body.detail), /leaked/);
    r = await putKeys(api, CLUSTER, admin, { issuer: "http://plain.example", jwks });
    assert.equal(r.status, 400, r.text);

    // an API key or an account's admin token is not a plane admin
    const accountAdmin = await api.adminToken({ scopes: ["cluster-management"], account: "someone" });
    r = await putKeys(api, CLUSTER, accountAdmin, { issuer: k.issuer, jwks });
    assert.equal(r.status, 403, r.text);

    // the admin enrolls: the keys the cluster publishes
    r = await putKeys(api, CLUSTER, admin, { issuer: k.issuer, jwks });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.changed, true);
    assert.deepEqual(
      r.body.keyIds,
      jwks.keys.map((x) => x.kid),
    );

    // the agent's push of the same keys, proven by its own token: accepted, nothing changed
    r = await putKeys(api, CLUSTER, compute, { issuer: k.issuer, jwks, proofs: [agentToken] });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.changed, false);

    // a push with new keys and no proof, a worker's token, or a token of another audience: refused
    const { publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
    const extra = { ...(await exportJWK(publicKey)), kid: "planted", use: "sig", alg: "ES256" };
    const planted = { keys: [...jwks.keys, extra] };
    const worker = await makeWorker(k);
    const other = await k.tokenFor("nvcf", "compute-agent", { audiences: [aud("c2")] });
    for (const [proofs, why] of [
      [[], /no proof was sent/],
      [[worker.token], /a worker's token/],
      [[other], /cluster "c2"/],
    ] as const) {
      r = await putKeys(api, CLUSTER, compute, { issuer: k.issuer, jwks: planted, proofs });
      assert.equal(r.status, 403, r.text);
      assert.equal(r.body.code, "CLUSTER_PROOF_REFUSED");
      assert.match(String(r.body.detail), why);
    }
    // with the agent's proof the new set is taken (this is how a rotation reaches the plane)
    r = await putKeys(api, CLUSTER, compute, {
      issuer: k.issuer,
      jwks: planted,
      proofs: [worker.token, agentToken],
    });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.changed, true);
    assert.match(String(r.body.updatedBy), /^agent:system:serviceaccount:nvcf:compute-agent$/);
    // the first agent to prove the cluster is pinned: another account of the cluster (anyone who may
    // make a pod can have a token of nvcf-icms:c1 minted for some account) proves nothing from now on
    assert.equal(r.body.agentSubject, "system:serviceaccount:nvcf:compute-agent");
    await k.createServiceAccount("nvcf", "intruder");
    const intruder = await k.tokenFor("nvcf", "intruder", { audiences: [aud(CLUSTER)] });
    r = await putKeys(api, CLUSTER, compute, { issuer: k.issuer, jwks, proofs: [intruder] });
    assert.equal(r.status, 403, r.text);
    assert.match(
      String(r.body.detail),
      /not of the cluster's compute agent system:serviceaccount:nvcf:compute-agent/,
    );

    // an enrolled cluster's instance reports must carry its agent's proof: the shared compute
    // token alone cannot rewrite (or empty) them
    for (const proofs of [undefined, [worker.token], [intruder]]) {
      const rep = await reportAs(api, [], proofs ? { proofs } : {});
      assert.equal(rep.status, 403, rep.text);
      assert.equal(rep.body.code, "CLUSTER_PROOF_REFUSED");
    }
    assert.equal((await reportAs(api, [], { proofs: [agentToken] })).status, 204);
  },
);

test(
  "pod tokens: a worker logs in with its pod's token, and every other token is refused with its reason",
  { timeout: 180_000 },
  async (t) => {
    const s = await setup(t);
    const { k, api, admin, jwks } = s;
    assert.equal((await putKeys(api, CLUSTER, admin, { issuer: k.issuer, jwks })).status, 200);
    // the agent's own token proves its reports (the first proof pins it as the cluster's agent)
    const proofs = [await k.tokenFor("nvcf", "compute-agent", { audiences: [aud(CLUSTER)] })];
    const report = (instances: unknown[], reporter?: string) =>
      reportAs(api, instances, { proofs, ...(reporter ? { reporter } : {}) });

    const a = await makeWorker(k);
    const b = await makeWorker(k);
    assert.equal((await report([instance(a, "v-a"), instance(b, "v-b")])).status, 204);

    // the good one: the user and permissions of its own instance's version
    const ok = await login(api, a.token);
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.body.userId, `worker-v-a.${a.instanceId}`);
    assert.equal(ok.body.functionVersionId, "v-a");

    // introspection: active, with the pod; a caller claiming another version gets inactive
    const intro = (body: Record<string, string>) =>
      call(`${api.url}/v1/workers/tokens/introspect`, {
        method: "POST",
        token: api.serviceToken("invocation"),
        rawBody: new URLSearchParams(body).toString(),
        headers: { "content-type": "application/x-www-form-urlencoded" },
      });
    let i = await intro({ token: a.token });
    assert.equal(i.body.active, true, i.text);
    assert.equal(i.body.token_type, "pod_service_account");
    assert.equal(i.body.pod_uid, a.pod.uid);
    assert.equal(i.body.cluster_id, CLUSTER);
    // a token of a pod of another function version
    i = await intro({ token: b.token, function_version_id: "v-a" });
    assert.deepEqual(i.body, { active: false });
    assert.ok(
      s
        .logs()
        .some(
          (l) =>
            l.msg === "worker token refused" && /claims function_version_id "v-a"/.test(String(l.reason)),
        ),
    );

    // the wrong audience: the API server's own, and two audiences
    const own = await k.tokenFor(NS, a.sa.name, { boundPod: a.pod });
    await refused(s, own, "WORKER_TOKEN_INVALID", /audience/);
    const two = await k.tokenFor(NS, a.sa.name, { audiences: [aud(CLUSTER), aud("c2")], boundPod: a.pod });
    await refused(s, two, "WORKER_TOKEN_INVALID", /audience/);

    // a token of a cluster the plane does not know
    const unknown = await k.tokenFor(NS, a.sa.name, { audiences: [aud("nowhere")], boundPod: a.pod });
    await refused(s, unknown, "WORKER_TOKEN_INVALID", /nowhere/);

    // a token of another cluster: c2 is enrolled with the same issuer and keys (clusters that share an
    // issuer), but a's instance was reported by c1's agent
    assert.equal((await putKeys(api, "c2", admin, { issuer: k.issuer, jwks })).status, 200);
    const c2 = await k.tokenFor(NS, a.sa.name, { audiences: [aud("c2")], boundPod: a.pod });
    await refused(
      s,
      c2,
      "WORKER_TOKEN_INVALID",
      /reported by kubernetes-c1, not by the compute agent of cluster c2/,
    );

    // a foreign issuer: c3 enrolled with these keys but another issuer; the cluster's tokens say k.issuer
    assert.equal(
      (await putKeys(api, "c3", admin, { issuer: "https://issuer.c3.example", jwks })).status,
      200,
    );
    const c3 = await k.tokenFor(NS, a.sa.name, { audiences: [aud("c3")], boundPod: a.pod });
    await refused(s, c3, "WORKER_TOKEN_INVALID", /issuer/);

    // signed by a key the cluster never registered (same claims, our own key, the cluster's kid or a new one)
    const claims = decodeJwt(a.token);
    const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
    for (const kid of [decodeProtectedHeader(a.token).kid!, "unregistered"]) {
      const forged = await new SignJWT(claims).setProtectedHeader({ alg: "RS256", kid }).sign(privateKey);
      await refused(s, forged, "WORKER_TOKEN_INVALID", /signature|not registered|key/);
    }
    // alg none, and HS256 with the cluster's public key as the secret (the classic confusion)
    const b64 = (o: unknown) => Buffer.from(JSON.stringify(o)).toString("base64url");
    await refused(
      s,
      `${b64({ alg: "none", kid: "x" })}.${b64(claims)}.`,
      "WORKER_TOKEN_INVALID",
      /unsigned \(alg none\)/,
    );
    const hs = await new SignJWT(claims)
      .setProtectedHeader({ alg: "HS256", kid: decodeProtectedHeader(a.token).kid! })
      .sign(Buffer.from(JSON.stringify(jwks.keys[0])));
    await refused(s, hs, "WORKER_TOKEN_INVALID", /"HS256"; only RS256 and ES256/);
    // oversized: refused before it is parsed
    await refused(s, `${a.token}.${"A".repeat(20_000)}`, "WORKER_TOKEN_INVALID", /bytes|large|size/);

    // expired: a cluster whose key the test holds (enrolled as any cluster is), a's claims, past exp
    const held = generateKeyPairSync("ec", { namedCurve: "P-256" });
    const heldJwk = { ...(await exportJWK(held.publicKey)), kid: "held", use: "sig", alg: "ES256" };
    assert.equal(
      (await putKeys(api, "held", admin, { issuer: "https://held.example", jwks: { keys: [heldJwk] } }))
        .status,
      200,
    );
    const now = Math.floor(Date.now() / 1000);
    const expired = await new SignJWT({
      ...claims,
      aud: [aud("held")],
      iss: "https://held.example",
      iat: now - 1000,
      nbf: now - 1000,
      exp: now - 120,
    })
      .setProtectedHeader({ alg: "ES256", kid: "held" })
      .sign(held.privateKey);
    await refused(s, expired, "WORKER_TOKEN_EXPIRED", /expired/);

    // a TokenRequest not bound to a pod
    const unbound = await k.tokenFor(NS, a.sa.name, { audiences: [aud(CLUSTER)] });
    await refused(s, unbound, "WORKER_TOKEN_INVALID", /pod/);

    // the service account deleted and made again under the same name: a new uid, not the reported one
    await k.admin.delete(kubePaths.serviceAccounts(NS, b.sa.name));
    await k.createServiceAccount(NS, b.sa.name);
    const reborn = await k.tokenFor(NS, b.sa.name, { audiences: [aud(CLUSTER)], boundPod: b.pod });
    await refused(s, reborn, "WORKER_TOKEN_INVALID", /uid .* not .*made again under the same name/);

    // a deleted pod: once its instance is gone from the report, its token is refused (and a pod made
    // again under the name has a new uid, which the old token does not carry)
    assert.equal((await report([instance(a, "v-a")])).status, 204);
    await k.admin.delete(kubePaths.pods(NS, b.pod.name), { gracePeriodSeconds: 0 });
    await refused(s, b.token, "WORKER_TOKEN_REVOKED", /no live instance/);
    await k.admin.delete(kubePaths.pods(NS, a.pod.name), { gracePeriodSeconds: 0 });
    const again = await k.admin.create<KubeObject>(kubePaths.pods(NS), {
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: a.pod.name, namespace: NS },
      spec: {
        serviceAccountName: a.sa.name,
        automountServiceAccountToken: false,
        containers: [{ name: "worker", image: "callplane:test" }],
      },
    });
    const a2 = { ...a, pod: { name: a.pod.name, uid: again.metadata!.uid! } };
    assert.equal((await report([instance(a2, "v-a")])).status, 204);
    await refused(s, a.token, "WORKER_TOKEN_REVOKED", /not the pod of instance/);
    const fresh = await k.tokenFor(NS, a.sa.name, { audiences: [aud(CLUSTER)], boundPod: a2.pod });
    assert.equal((await login(api, fresh)).status, 200, "the new pod's token is taken");

    // an instance's end refuses its worker at once
    assert.equal((await report([instance(a2, "v-a", "TERMINATED")])).status, 204);
    await refused(s, fresh, "WORKER_TOKEN_REVOKED", /no live instance/);

    // another agent cannot take over (or re-identify) an instance c1's agent reports
    assert.equal((await report([instance(a2, "v-a")])).status, 204);
    // (a cluster not enrolled needs no proof: none of its workers' tokens verifies anyway)
    const hijack = await report(
      [{ ...instance(a2, "v-b"), workerAuth: instance(b, "v-b").workerAuth }],
      "kubernetes-c9",
    );
    assert.equal(hijack.status, 200, hijack.text);
    assert.deepEqual(
      (hijack.body as { refused: Array<{ instanceId: string }> }).refused.map((x) => x.instanceId),
      [a2.instanceId],
    );
    assert.equal((await login(api, fresh)).body.functionVersionId, "v-a", "still c1's report");
  },
);
