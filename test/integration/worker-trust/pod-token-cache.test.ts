// The API's pod-token caches (src/services/api/pod-tokens.ts) on a real SQLite store, with tokens the
// test signs and a clock it moves: two PodTokens stand for two API replicas sharing the store. What a
// replica remembers must never outlive what the store says: a token verified before its cluster's
// keys were replaced elsewhere is refused once the replica's key cache has expired, however long the
// token claims to live; and tokens naming clusters that do not exist cost neither a query each nor
// memory that grows without bound.
import assert from "node:assert/strict";
import { generateKeyPairSync, type KeyObject } from "node:crypto";
import { join } from "node:path";
import { test } from "node:test";
import { SignJWT } from "jose";
import { jwksHash, type PublicJwk } from "../../../src/lib/identity/index.js";
import { PodTokens } from "../../../src/services/api/pod-tokens.js";
import { openSqliteStore } from "../../../src/services/api/store/sqlite.js";
import type { InstanceRecord, Store } from "../../../src/services/api/store/types.js";
import { tmpDir } from "../../testkit/index.js";

const ISSUER = "https://kube.example:6443";
const NS = "nvcf-workers";
const CLUSTER = "c1";
const INSTANCE = "i-1";
const POD = `cp-${INSTANCE}`;
const SA = `nvcf-worker-${POD}`;
const SUB = `system:serviceaccount:${NS}:${SA}`;
const POD_UID = "pod-uid-1";
const SA_UID = "sa-uid-1";

const publicJwk = (k: KeyObject, kid: string): PublicJwk =>
  ({ ...k.export({ format: "jwk" }), kid, use: "sig", alg: "ES256" }) as PublicJwk;

async function setKeys(store: Store, keys: PublicJwk[]) {
  const jwks = { keys };
  await store.setClusterKeys({
    clusterId: CLUSTER,
    issuer: ISSUER,
    jwks,
    jwksHash: jwksHash(jwks),
    updatedBy: "admin:test",
    updatedAt: new Date().toISOString(),
  });
}

function sign(key: KeyObject, kid: string, nowS: number, lifeS: number) {
  return new SignJWT({
    aud: [`nvcf-icms:${CLUSTER}`],
    iss: ISSUER,
    sub: SUB,
    iat: nowS,
    nbf: nowS,
    exp: nowS + lifeS,
    "kubernetes.io": {
      namespace: NS,
      pod: { name: POD, uid: POD_UID },
      serviceaccount: { name: SA, uid: SA_UID },
    },
  })
    .setProtectedHeader({ alg: "ES256", kid })
    .sign(key);
}

/** An instance whose worker is the pod above (its account and pod), as an agent reports it. */
function instanceOf(instanceId: string, ms: number): InstanceRecord {
  return {
    instanceId,
    deploymentId: "d-1",
    functionId: "f-1",
    versionId: "v-1",
    status: "ACTIVE",
    instanceType: "gpu.x1",
    gpu: "T4",
    backend: "kubernetes",
    location: CLUSTER,
    workerAuth: { sub: SUB, saUid: SA_UID, workerIdentifiers: [{ name: POD, uid: POD_UID }] },
    createdAt: new Date(ms).toISOString(),
    updatedAt: new Date(ms).toISOString(),
  };
}

function setup(t: Parameters<typeof tmpDir>[0]) {
  const store = openSqliteStore(join(tmpDir(t, "callplane-podcache-"), "callplane.db"));
  t.after(() => store.db.close());
  const clock = { ms: Date.UTC(2030, 0, 1) };
  return { store, clock, now: () => clock.ms };
}

test("a replica's verified-token cache does not outlive the cluster's keys replaced on another replica", async (t) => {
  const { store, clock, now } = setup(t);
  const old = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const next = generateKeyPairSync("ec", { namedCurve: "P-256" });
  await setKeys(store, [publicJwk(old.publicKey, "old")]);
  await store.reportInstances(`kubernetes-${CLUSTER}`, [instanceOf(INSTANCE, clock.ms)]);
  // a token that claims to live a year (whoever holds a key signs what exp they like)
  const token = await sign(old.privateKey, "old", clock.ms / 1000, 365 * 86_400);

  const replica = new PodTokens(store, now);
  const first = await replica.introspect(token);
  assert.equal(first.active, true, JSON.stringify(first));

  // the key is removed (an admin re-enrolls after a leak; another replica took the PUT, so this one
  // gets no forget())
  await setKeys(store, [publicJwk(next.publicKey, "next")]);
  clock.ms += 60_000; // well past the replica's key cache
  const after = await replica.introspect(token);
  assert.equal(after.active, false, "the token of a removed key is refused");
  assert.ok(!after.active && /not registered/.test(after.reason), JSON.stringify(after));

  // and the same for a changed issuer: the key stays, the issuer on record is another
  await setKeys(store, [publicJwk(old.publicKey, "old")]);
  clock.ms += 2_000; // (an unknown kid reads the keys again, at most once a second)
  const again = await sign(old.privateKey, "old", clock.ms / 1000, 365 * 86_400);
  assert.equal((await replica.introspect(again)).active, true);
  await store.setClusterKeys({
    clusterId: CLUSTER,
    issuer: "https://elsewhere.example",
    jwks: { keys: [publicJwk(old.publicKey, "old")] },
    jwksHash: "x",
    updatedBy: "admin:test",
    updatedAt: new Date().toISOString(),
  });
  clock.ms += 60_000;
  const moved = await replica.introspect(again);
  assert.equal(moved.active, false, "a token of the issuer no longer on record is refused");
  assert.ok(!moved.active && /issuer/.test(moved.reason), JSON.stringify(moved));
});

test("tokens naming clusters that do not exist: refused, and the replica's key cache stays bounded", async (t) => {
  const { store, now } = setup(t);
  const key = generateKeyPairSync("ec", { namedCurve: "P-256" });
  await setKeys(store, [publicJwk(key.publicKey, "k")]);
  const replica = new PodTokens(store, now);
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
  // (the audience is read before any signature is checked: these need none)
  for (let i = 0; i < 3_000; i++) {
    const forged = `${b64({ alg: "ES256", kid: "k" })}.${b64({ aud: [`nvcf-icms:made-up-${i}`] })}.AAAA`;
    const r = await replica.verify(forged);
    assert.ok("active" in r && r.check === "unknown-cluster", JSON.stringify(r));
  }
  // the private cache, read by the test: what grew with the flood
  const cached = (replica as unknown as { keys: Map<string, unknown> }).keys;
  assert.ok(cached.size <= 1_024, `${cached.size} clusters cached`);
  // the enrolled cluster still verifies
  const good = await sign(key.privateKey, "k", now() / 1000, 600);
  assert.equal("ok" in (await replica.verify(good)), true);
});

test("another reporter's instance with the same service account does not hide the worker's own", async (t) => {
  const { store, clock, now } = setup(t);
  const key = generateKeyPairSync("ec", { namedCurve: "P-256" });
  await setKeys(store, [publicJwk(key.publicKey, "k")]);
  const own = instanceOf(INSTANCE, clock.ms);
  await store.reportInstances(`kubernetes-${CLUSTER}`, [own]);
  // an agent holding the shared compute credential reports an instance of its own naming this
  // worker's account; then the worker's agent reports again (its rows are written anew)
  await store.reportInstances("kubernetes-c2", [{ ...instanceOf("i-2", clock.ms), versionId: "v-2" }]);
  await store.reportInstances(`kubernetes-${CLUSTER}`, [own]);
  const replica = new PodTokens(store, now);
  const r = await replica.introspect(await sign(key.privateKey, "k", clock.ms / 1000, 600));
  assert.ok(r.active, JSON.stringify(r));
  assert.equal(r.instanceId, INSTANCE);
  assert.equal(r.functionVersionId, "v-1");
});
