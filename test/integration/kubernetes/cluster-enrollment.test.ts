// The agent's key pushes against the real API (test/integration/kubernetes/cluster-keys.test.ts has
// the agent's own behaviour with a stand-in for the API): an agent given an admin token once
// (compute.kubernetes.enrollmentTokenFile) enrolls its cluster and is pinned as its agent; after the
// API server's signing key is switched and the agent's token renewed with the new key, its push is
// proven by the previous token (the new one does not verify yet), and tokens of both keys verify.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { test } from "node:test";
import { decodeProtectedHeader } from "jose";
import { createLogger } from "../../../src/lib/log.js";
import { ComputeApiClient } from "../../../src/services/compute/api-client.js";
import {
  ClusterKeysPublisher,
  type KeysLook,
} from "../../../src/services/compute/kubernetes/cluster-keys.js";
import { call } from "../../testkit/client.js";
import { startKubeApiServer } from "../../testkit/kube-apiserver.js";
import { lifo } from "../../testkit/proc.js";
import { startApi } from "../../testkit/services.js";

const CLUSTER = "enroll";
const AUD = `nvcf-icms:${CLUSTER}`;

test(
  "an agent enrolls its cluster with an admin token once, and proves a key rotation with its previous token",
  { timeout: 180_000 },
  async (t) => {
    const ctx = lifo(t);
    const k = await startKubeApiServer(ctx);
    const api = await startApi(ctx, { workerAuth: "token" });
    await k.createNamespace("nvcf");
    await k.createServiceAccount("nvcf", "compute-agent");
    const agentToken = () =>
      k.tokenFor("nvcf", "compute-agent", { audiences: [AUD], expirationSeconds: 3600 });
    const tokenFile = k.writeTokenFile(await agentToken());
    const enrollmentTokenFile = k.writeTokenFile(await api.adminToken({ scopes: ["cluster-management"] }));
    const publisher = (enrollment: string) =>
      new ClusterKeysPublisher({
        clusterId: CLUSTER,
        identityTokenFile: tokenFile,
        refreshMs: 3_600_000,
        enrollmentTokenFile: enrollment,
        caPem: k.caPem,
        kube: k.admin,
        api: new ComputeApiClient(api.url, api.serviceToken("compute")),
        logger: createLogger("compute", { level: "silent" }),
      });
    const outcome = (l: KeysLook) => (l.outcome === "failed" ? `failed: ${l.reason}` : l.outcome);

    // without an admin token the agent cannot enroll; with one, it does, and its own account is pinned
    const alone = publisher("");
    ctx.after(() => alone.stop());
    const refused = await alone.look();
    assert.equal(refused.outcome, "failed");
    assert.equal((refused as { code?: string }).code, "CLUSTER_NOT_ENROLLED");
    assert.equal(await api.store.clusterKeys(CLUSTER), undefined);
    await alone.stop();

    const agent = publisher(enrollmentTokenFile);
    ctx.after(() => agent.stop());
    const first = await agent.look();
    assert.equal(first.outcome, "pushed", outcome(first));
    assert.equal((first as { credential: string }).credential, "enrollment");
    let rec = (await api.store.clusterKeys(CLUSTER))!;
    assert.equal(rec.issuer, k.issuer);
    assert.equal(rec.agentSubject, "system:serviceaccount:nvcf:compute-agent");
    assert.match(rec.updatedBy, /^admin:/);
    assert.equal((await agent.look()).outcome, "unchanged");

    // the signing key switched; the kubelet renews the agent's token with the new key before it looks
    const oldKid = rec.jwks.keys[0].kid;
    const newKid = await k.rotateServiceAccountKey();
    const renewed = await agentToken();
    assert.equal(decodeProtectedHeader(renewed).kid, newKid);
    writeFileSync(tokenFile, renewed);
    const pushed = await agent.look();
    assert.equal(pushed.outcome, "pushed", outcome(pushed));
    // its own proof (not the admin token): the previous token, as the new one's key is not on record yet
    assert.equal((pushed as { credential: string }).credential, "proof");
    rec = (await api.store.clusterKeys(CLUSTER))!;
    assert.deepEqual(rec.jwks.keys.map((x) => x.kid).sort(), [oldKid, newKid].sort());
    assert.equal(rec.updatedBy, "agent:system:serviceaccount:nvcf:compute-agent");
    // from now on the new token alone proves the cluster
    const jwks = rec.jwks;
    const r = await call(`${api.url}/v1/internal/clusters/${CLUSTER}/keys`, {
      method: "PUT",
      token: api.serviceToken("compute"),
      body: { issuer: k.issuer, jwks, proofs: [renewed] },
    });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.body.changed, false);
  },
);
