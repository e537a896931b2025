// The Kubernetes harness itself: a real kube-apiserver 1.20.2 (with etcd and the controller
// manager) answers as the compute backend, the webhook and the worker identity tests expect. One
// control plane for the whole file: starting one takes seconds. Its last two steps rotate the
// service-account signing key (each a restart of kube-apiserver): first keeping the old key, then
// dropping it.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import {
  KubeClient,
  KubeError,
  isNotFound,
  kubePaths,
  watchCollection,
  type KubeObject,
} from "../../../src/lib/kube/index.js";
import { KUBE_VERSION, serviceAccountKeyId, startKubeApiServer } from "../../testkit/kube-apiserver.js";

const payloadOf = (jwt: string) =>
  JSON.parse(Buffer.from(jwt.split(".")[1], "base64url").toString()) as Record<string, unknown>;
const headerOf = (jwt: string) =>
  JSON.parse(Buffer.from(jwt.split(".")[0], "base64url").toString()) as Record<string, unknown>;

async function eventually(what: string, check: () => Promise<boolean>, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`not within ${ms} ms: ${what}`);
    await sleep(200);
  }
}

test("the Kubernetes harness: a real API server, tokens, discovery, RBAC and garbage collection", async (t) => {
  const k = await startKubeApiServer(t, { controllerManager: true });
  const ns = "harness";
  const pod: KubeObject = {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: "p1", namespace: ns },
    spec: {
      serviceAccountName: "worker",
      automountServiceAccountToken: false,
      containers: [{ name: "c", image: "example.invalid/none:1" }],
    },
  };
  let created: KubeObject = {};
  let token = "";
  let tokens: { before: string; after: string; audiences: string[] } | undefined;

  await t.test("it is version 1.20.2, on loopback", async () => {
    assert.match(k.url, /^https:\/\/127\.0\.0\.1:\d+$/);
    assert.equal(k.issuer, k.url);
    const v = await k.admin.request<{ gitVersion: string }>("GET", "/version");
    assert.equal(v.gitVersion, KUBE_VERSION);
  });

  await t.test("a namespace (labelled with its name), a ServiceAccount and a pod naming it", async () => {
    const n = await k.createNamespace(ns, { team: "x" });
    assert.deepEqual(n.metadata?.labels, { "kubernetes.io/metadata.name": ns, team: "x" });
    await k.createServiceAccount(ns, "worker");
    const [r] = await k.apply([pod]);
    assert.equal(r.error, undefined);
    assert.equal(r.path, kubePaths.pods(ns));
    created = r.object!;
    assert.ok(created.metadata?.uid);
    // a dry run answers but creates nothing
    const [dry] = await k.apply([{ ...pod, metadata: { name: "p2", namespace: ns } }], { dryRun: true });
    assert.equal(dry.error, undefined);
    assert.ok(isNotFound(await k.admin.get(kubePaths.pods(ns, "p2")).catch((e: unknown) => e)));
  });

  await t.test("a TokenRequest bound to the pod: aud, iss, sub and the pod", async () => {
    token = await k.tokenFor(ns, "worker", {
      audiences: ["nvcf-icms:local"],
      boundPod: { name: "p1", uid: created.metadata!.uid! },
      expirationSeconds: 900,
    });
    const p = payloadOf(token);
    assert.deepEqual(p.aud, ["nvcf-icms:local"]);
    assert.equal(p.iss, k.issuer);
    assert.equal(p.sub, `system:serviceaccount:${ns}:worker`);
    const kio = p["kubernetes.io"] as {
      pod: { name: string; uid: string };
      serviceaccount: { name: string };
    };
    assert.deepEqual(kio.pod, { name: "p1", uid: created.metadata!.uid });
    assert.equal(kio.serviceaccount.name, "worker");
  });

  await t.test("OIDC discovery and the key set answer anonymously, and hold the token's kid", async () => {
    const anonymous = new KubeClient({ server: k.issuer, caPem: k.caPem });
    t.after(() => anonymous.close());
    const disc = await anonymous.request<{ issuer: string; jwks_uri: string }>(
      "GET",
      "/.well-known/openid-configuration",
    );
    assert.equal(disc.issuer, k.issuer);
    const jwksUrl = new URL(disc.jwks_uri);
    assert.equal(jwksUrl.origin, k.url);
    // 1.20 answers the key set only to Accept: application/jwk-set+json (application/json is 406)
    const res = await request(disc.jwks_uri, {
      dispatcher: anonymous.dispatcher,
      headers: { accept: "application/jwk-set+json" },
    });
    assert.equal(res.statusCode, 200);
    const jwks = (await res.body.json()) as { keys: Array<{ kid: string }> };
    assert.ok(jwks.keys.some((key) => key.kid === headerOf(token).kid));
  });

  await t.test("a ServiceAccount token without RBAC grants may not list pods", async () => {
    const sa = k.clientAs(await k.tokenFor(ns, "worker"));
    const err = await sa.list(kubePaths.pods(ns)).catch((e: unknown) => e);
    assert.ok(err instanceof KubeError);
    assert.equal(err.status, 403);
  });

  await t.test("the garbage collector deletes a ServiceAccount owned by a deleted pod", async () => {
    await k.admin.create(kubePaths.serviceAccounts(ns), {
      apiVersion: "v1",
      kind: "ServiceAccount",
      metadata: {
        name: "owned",
        ownerReferences: [
          {
            apiVersion: "v1",
            kind: "Pod",
            name: "p1",
            uid: created.metadata!.uid!,
            blockOwnerDeletion: false,
          },
        ],
      },
    });
    // no kubelet: the pod goes at once with a zero grace period
    await k.admin.delete(kubePaths.pods(ns, "p1"), { gracePeriodSeconds: 0 });
    await eventually("the owned ServiceAccount is gone", async () => {
      try {
        await k.admin.get(kubePaths.serviceAccounts(ns, "owned"));
        return false;
      } catch (err) {
        return isNotFound(err);
      }
    });
    // the account without an owner stays
    await k.admin.get(kubePaths.serviceAccounts(ns, "worker"));
  });

  await t.test("the signing key rotated, the old one kept: both keys published and accepted", async (tt) => {
    // a pod for the tokens to be bound to (no kubelet: the object is enough for a TokenReview)
    const [r] = await k.apply([{ ...pod, metadata: { name: "p3", namespace: ns } }]);
    const boundPod = { name: "p3", uid: r.object!.metadata!.uid! };
    const audiences = ["nvcf-icms:local"];
    const before = await k.tokenFor(ns, "worker", { audiences, boundPod });
    const oldKid = k.signingKeyId();
    assert.equal(headerOf(before).kid, oldKid);
    assert.deepEqual(await k.serviceAccountKeyIds(), [oldKid]);
    assert.equal((await k.reviewToken(before, audiences)).authenticated, true);
    // the harness's kid is kube-apiserver's: base64url(sha256(DER SPKI)) of the signing key
    assert.equal(oldKid, serviceAccountKeyId(readFileSync(join(k.dir, "sa.key"), "utf8")));

    // clients and a watch made before the restart
    const anonymous = new KubeClient({ server: k.issuer, caPem: k.caPem });
    tt.after(() => anonymous.close());
    await anonymous.request("GET", "/.well-known/openid-configuration");
    const seen: string[] = [];
    const watch = watchCollection(
      k.admin,
      kubePaths.namespaced("", "v1", "configmaps", ns),
      {},
      { onList: () => undefined, onEvent: (type, o) => seen.push(`${type} ${o.metadata?.name}`) },
    );
    tt.after(() => watch.stop());
    await watch.synced;

    const newKid = await k.rotateServiceAccountKey();
    assert.notEqual(newKid, oldKid);
    assert.equal(k.signingKeyId(), newKid);
    assert.deepEqual((await k.serviceAccountKeyIds()).sort(), [oldKid, newKid].sort());

    const review = await k.reviewToken(before, audiences);
    assert.equal(review.authenticated, true, review.error);
    assert.equal(review.username, `system:serviceaccount:${ns}:worker`);
    const after = await k.tokenFor(ns, "worker", { audiences, boundPod });
    assert.equal(headerOf(after).kid, newKid);
    assert.equal(headerOf(after).alg, headerOf(before).alg);
    assert.equal((await k.reviewToken(after, audiences)).authenticated, true);

    // what was made before the restart works after it: the clients, and the watch resumed
    await anonymous.request("GET", "/.well-known/openid-configuration");
    await k.admin.create(kubePaths.namespaced("", "v1", "configmaps", ns), {
      apiVersion: "v1",
      kind: "ConfigMap",
      metadata: { name: "after-rotation" },
    });
    await eventually("the watch sees the ConfigMap", () =>
      Promise.resolve(seen.includes("ADDED after-rotation")),
    );
    tokens = { before, after, audiences };
  });

  await t.test(
    "the signing key rotated, the old one dropped: tokens of the old keys are refused",
    async () => {
      assert.ok(tokens, "the step before made tokens");
      const newest = await k.rotateServiceAccountKey({ keepOld: false });
      assert.deepEqual(await k.serviceAccountKeyIds(), [newest]);
      for (const [which, token] of [
        ["the first key's", tokens.before],
        ["the second key's", tokens.after],
      ] as const) {
        const review = await k.reviewToken(token, tokens.audiences);
        assert.equal(review.authenticated, false, `${which} token`);
        assert.ok(review.error, `${which} token: a reason`);
      }
      const fresh = await k.tokenFor(ns, "worker", { audiences: tokens.audiences });
      assert.equal(headerOf(fresh).kid, newest);
      assert.equal((await k.reviewToken(fresh, tokens.audiences)).authenticated, true);
    },
  );
});
