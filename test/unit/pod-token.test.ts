// Pod tokens (lib/identity/pod-token.ts) with tokens this test signs in the exact claim shape a
// kube-apiserver 1.20 issues for a pod's projected volume (copied from one the testkit's API server
// minted, kept below as a fixture for the parse path): every refusal the plane makes, the order of its
// checks (nothing looked up or verified for a token refused earlier), and the key sets it accepts.
import assert from "node:assert/strict";
import { generateKeyPairSync, sign, type KeyObject } from "node:crypto";
import { test } from "node:test";
import { SignJWT } from "jose";
import {
  POD_TOKEN_MAX_BYTES,
  POD_TOKEN_SKEW_SECONDS,
  checkJwks,
  clusterAudience,
  jwksHash,
  unverifiedIssuerAndKid,
  verifyClusterToken,
  workerOf,
  type ClusterKeys,
  type ClusterTokenClaims,
  type PodTokenFailure,
  type PodTokenRefusal,
  type PublicJwk,
} from "../../src/lib/identity/index.js";

// A token and key set from kube-apiserver 1.20.2 (test/testkit/kube-apiserver.ts): TokenRequest for
// nvcf-workers/nvcf-worker-cp-abc, audience nvcf-icms:c1, 900 s, bound to pod cp-abc; and the same
// request without the pod.
const REAL = {
  issuer: "https://127.0.0.1:34433",
  iat: 1796190876,
  podUid: "0e45ff77-67df-4d2d-9d1b-dbb0592b4e2e",
  saUid: "baea0c1a-6da8-4797-ae41-d9789e02ac10",
  bound:
    "eyJhbGciOiJFUzI1NiIsImtpZCI6ImloWXNyczFBNHFIeWFheVYxQjFhSzRCZjF6RHJxSGR0SHJaRXV0QjFHQWMifQ.eyJhdWQiOlsibnZjZi1pY21zOmMxIl0sImV4cCI6MTc5NjE5MTc3NiwiaWF0IjoxNzk2MTkwODc2LCJpc3MiOiJodHRwczovLzEyNy4wLjAuMTozNDQzMyIsImt1YmVybmV0ZXMuaW8iOnsibmFtZXNwYWNlIjoibnZjZi13b3JrZXJzIiwicG9kIjp7Im5hbWUiOiJjcC1hYmMiLCJ1aWQiOiIwZTQ1ZmY3Ny02N2RmLTRkMmQtOWQxYi1kYmIwNTkyYjRlMmUifSwic2VydmljZWFjY291bnQiOnsibmFtZSI6Im52Y2Ytd29ya2VyLWNwLWFiYyIsInVpZCI6ImJhZWEwYzFhLTZkYTgtNDc5Ny1hZTQxLWQ5Nzg5ZTAyYWMxMCJ9fSwibmJmIjoxNzk2MTkwODc2LCJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bnZjZi13b3JrZXJzOm52Y2Ytd29ya2VyLWNwLWFiYyJ9.qtK27VdCcFGn9Gd6NLc5LVR0QZ0qG2fl86oU473b0nRbr1T-dKIPJiDqvmrnnj7Be-f7BP1Pbhv3-lVXht1Q9Q",
  unbound:
    "eyJhbGciOiJFUzI1NiIsImtpZCI6ImloWXNyczFBNHFIeWFheVYxQjFhSzRCZjF6RHJxSGR0SHJaRXV0QjFHQWMifQ.eyJhdWQiOlsibnZjZi1pY21zOmMxIl0sImV4cCI6MTc5NjE5MTc3NiwiaWF0IjoxNzk2MTkwODc2LCJpc3MiOiJodHRwczovLzEyNy4wLjAuMTozNDQzMyIsImt1YmVybmV0ZXMuaW8iOnsibmFtZXNwYWNlIjoibnZjZi13b3JrZXJzIiwic2VydmljZWFjY291bnQiOnsibmFtZSI6Im52Y2Ytd29ya2VyLWNwLWFiYyIsInVpZCI6ImJhZWEwYzFhLTZkYTgtNDc5Ny1hZTQxLWQ5Nzg5ZTAyYWMxMCJ9fSwibmJmIjoxNzk2MTkwODc2LCJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bnZjZi13b3JrZXJzOm52Y2Ytd29ya2VyLWNwLWFiYyJ9.XgaITUsRWOPpVTXnFQjzE9F30l83OJ1Al0Ri4bPUQ40__HeHgooeRmT3_02gsmgG2DBwwehi2dxxTuC8bL9HWA",
  jwks: {
    keys: [
      {
        use: "sig",
        kty: "EC",
        kid: "ihYsrs1A4qHyaayV1B1aK4Bf1zDrqHdtHrZEutB1GAc",
        crv: "P-256",
        alg: "ES256",
        x: "eHwbuwLppecXM0LoURVoA78ijYM5F3Omk6bTRZ6RLgQ",
        y: "3po4Xw-FDwvi3TIgSVy3oVVsx2-IuzMYMTf7vO0Ax9Y",
      },
    ],
  },
};

const NOW = Date.UTC(2030, 0, 1); // ms; every verification passes it, so no test depends on the clock
const NOW_S = NOW / 1000;
const ISSUER = "https://kube.example:6443";
const NS = "nvcf-workers";
const POD = "cp-7c1e";
const POD_UID = "5b0b6a0e-3f7e-4c55-9a0e-0d1e2f3a4b5c";
const SA_UID = "e2d1c0b9-a8f7-4e6d-8c5b-4a3f2e1d0c9b";

const rsa = generateKeyPairSync("rsa", { modulusLength: 2048 });
const ec = generateKeyPairSync("ec", { namedCurve: "P-256" });
const ec2 = generateKeyPairSync("ec", { namedCurve: "P-256" });

const publicJwk = (k: KeyObject, kid: string): PublicJwk => {
  const j = k.export({ format: "jwk" });
  return { ...j, kid, use: "sig", alg: j.kty === "RSA" ? "RS256" : "ES256" } as PublicJwk;
};
const RSA_KID = "rsa-1";
const EC_KID = "ec-1";
const EC2_KID = "ec-2";

const registry = new Map<string, ClusterKeys>([
  [
    "c1",
    {
      clusterId: "c1",
      issuer: ISSUER,
      jwks: { keys: [publicJwk(rsa.publicKey, RSA_KID), publicJwk(ec.publicKey, EC_KID)] },
    },
  ],
  // another cluster, with a key of its own (for a token of one cluster presented as the other's)
  [
    "c2",
    {
      clusterId: "c2",
      issuer: "https://kube-2.example",
      jwks: { keys: [publicJwk(ec2.publicKey, EC2_KID)] },
    },
  ],
  ["real", { clusterId: "c1", issuer: REAL.issuer, jwks: REAL.jwks as { keys: PublicJwk[] } }],
]);
let lookups = 0;
const keysOf = (id: string) => {
  lookups++;
  return registry.get(id);
};

/** The claims of a 1.20 projected token for worker pod `pod` (as in the fixture above). */
function podClaims(o: { ns?: string; pod?: string; iat?: number } = {}): Record<string, unknown> {
  const ns = o.ns ?? NS;
  const pod = o.pod ?? POD;
  const iat = o.iat ?? NOW_S - 60;
  return {
    aud: [clusterAudience("c1")],
    exp: iat + 900,
    iat,
    iss: ISSUER,
    "kubernetes.io": {
      namespace: ns,
      pod: { name: pod, uid: POD_UID },
      serviceaccount: { name: `nvcf-worker-${pod}`, uid: SA_UID },
    },
    nbf: iat,
    sub: `system:serviceaccount:${ns}:nvcf-worker-${pod}`,
  };
}

type Signer = { key: KeyObject | Uint8Array; alg: string; kid?: string };
const EC_SIGNER: Signer = { key: ec.privateKey, alg: "ES256", kid: EC_KID };
const RSA_SIGNER: Signer = { key: rsa.privateKey, alg: "RS256", kid: RSA_KID };

function mint(claims: Record<string, unknown>, s: Signer = EC_SIGNER): Promise<string> {
  return new SignJWT(claims).setProtectedHeader({ alg: s.alg, ...(s.kid ? { kid: s.kid } : {}) }).sign(s.key);
}

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");

/** A token signed by hand (what jose would refuse to produce), ES256 with key `ec`. */
function handSigned(header: Record<string, unknown>, claims: Record<string, unknown>): string {
  const input = `${b64(header)}.${b64(claims)}`;
  const sig = sign("sha256", Buffer.from(input), { key: ec.privateKey, dsaEncoding: "ieee-p1363" });
  return `${input}.${sig.toString("base64url")}`;
}

const verify = (token: string, opts: { now?: number; skewSeconds?: number } = {}) =>
  verifyClusterToken(token, keysOf, { now: NOW, ...opts });

/** Refused with `failure`; the reason never repeats the token or its signature. */
async function refused(
  token: string,
  failure: PodTokenFailure,
  opts: { now?: number; skewSeconds?: number } = {},
): Promise<PodTokenRefusal> {
  const r = await verify(token, opts);
  assert.equal(r.ok, false, `accepted, expected ${failure}`);
  assert.ok(!r.ok);
  assert.equal(r.failure, failure, r.reason);
  if (token) assert.ok(!r.reason.includes(token));
  const sig = token.split(".")[2] ?? "";
  if (sig.length > 8) assert.ok(!r.reason.includes(sig));
  return r;
}

async function accepted(token: string, opts: { now?: number; skewSeconds?: number } = {}) {
  const r = await verify(token, opts);
  assert.ok(r.ok, r.ok ? "" : `${r.failure}: ${r.reason}`);
  return r.claims;
}

const without = (o: object, ...keys: string[]): Record<string, unknown> =>
  Object.fromEntries(Object.entries(o).filter(([k]) => !keys.includes(k)));

void test("a 1.20 kube-apiserver's own token, bound to its pod: verified, and the worker it names", async () => {
  const r = await verifyClusterToken(REAL.bound, (id) => (id === "c1" ? registry.get("real") : undefined), {
    now: REAL.iat * 1000,
  });
  assert.ok(r.ok, r.ok ? "" : r.reason);
  assert.deepEqual(r.claims, {
    clusterId: "c1",
    issuer: REAL.issuer,
    subject: "system:serviceaccount:nvcf-workers:nvcf-worker-cp-abc",
    keyId: REAL.jwks.keys[0].kid,
    algorithm: "ES256",
    issuedAt: REAL.iat,
    notBefore: REAL.iat,
    expiresAt: REAL.iat + 900,
    namespace: "nvcf-workers",
    serviceAccount: { name: "nvcf-worker-cp-abc", uid: REAL.saUid },
    pod: { name: "cp-abc", uid: REAL.podUid },
  });
  assert.deepEqual(workerOf(r.claims), {
    ok: true,
    worker: {
      clusterId: "c1",
      subject: "system:serviceaccount:nvcf-workers:nvcf-worker-cp-abc",
      namespace: "nvcf-workers",
      serviceAccount: { name: "nvcf-worker-cp-abc", uid: REAL.saUid },
      pod: { name: "cp-abc", uid: REAL.podUid },
      expiresAt: REAL.iat + 900,
    },
  });
  // the same TokenRequest without boundObjectRef: a good cluster token, not a worker's
  const u = await verifyClusterToken(REAL.unbound, () => registry.get("real"), { now: REAL.iat * 1000 });
  assert.ok(u.ok);
  const w = workerOf(u.claims);
  assert.ok(!w.ok);
  assert.equal(w.failure, "not-bound");
  // its key set is one the registration accepts as it is
  assert.deepEqual(checkJwks(REAL.jwks), { ok: true, jwks: REAL.jwks });
  assert.deepEqual(unverifiedIssuerAndKid(`${REAL.bound}\n`), {
    issuer: REAL.issuer,
    keyId: REAL.jwks.keys[0].kid,
  });
});

void test("a worker's token, RS256 and ES256: the cluster's claims and the worker", async () => {
  for (const s of [RSA_SIGNER, EC_SIGNER]) {
    const claims = await accepted(await mint(podClaims(), s));
    assert.equal(claims.algorithm, s.alg);
    assert.equal(claims.keyId, s.kid);
    assert.equal(claims.expiresAt, NOW_S - 60 + 900);
    const w = workerOf(claims);
    assert.ok(w.ok, w.ok ? "" : w.reason);
    assert.deepEqual(w.worker, {
      clusterId: "c1",
      subject: `system:serviceaccount:${NS}:nvcf-worker-${POD}`,
      namespace: NS,
      serviceAccount: { name: `nvcf-worker-${POD}`, uid: SA_UID },
      pod: { name: POD, uid: POD_UID },
      expiresAt: NOW_S - 60 + 900,
    });
  }
  // the lookup may be asynchronous (a registry in a database); one audience may be a plain string
  const r = await verifyClusterToken(
    await mint({ ...podClaims(), aud: clusterAudience("c1") }),
    (id) => Promise.resolve(registry.get(id)),
    { now: NOW },
  );
  assert.ok(r.ok);
});

void test("the size comes first: a token over 16 KiB is refused before it is parsed or its cluster looked up", async () => {
  // grow a claim until the token crosses the limit: the last one under it verifies, the first over is refused
  const base = (await mint(podClaims())).length;
  let pad = Math.floor(((POD_TOKEN_MAX_BYTES - base) * 3) / 4) - 40;
  let under = "";
  let over = "";
  for (; !over; pad++) {
    const t = await mint({ ...podClaims(), pad: "x".repeat(pad) });
    if (t.length <= POD_TOKEN_MAX_BYTES) under = t;
    else over = t;
  }
  assert.ok(under.length > POD_TOKEN_MAX_BYTES - 4, `${under.length}`);
  await accepted(under);
  lookups = 0;
  const r = await refused(over, "oversized");
  assert.match(r.reason, /the token is 1638\d bytes, over the 16384-byte limit/);
  assert.equal(lookups, 0);
  assert.equal(r.clusterId, undefined);
  // counted in bytes, not characters
  await refused("é".repeat(9000), "oversized");
});

void test("not a JWT, and audiences that do not name exactly one cluster: refused before any lookup", async () => {
  const good = await mint(podClaims());
  lookups = 0;
  for (const t of ["", "not-a-token", "a.b.c", `${good}.x.y`, ` ${good}`, `${b64([1])}.${b64({})}.`]) {
    const r = await refused(t, "malformed");
    assert.match(r.reason, /not a signed JWT/);
  }
  // a JSON header and claims, but not an object of claims
  await refused(`${b64({ alg: "ES256", kid: EC_KID })}.${b64("x")}.abc`, "malformed");
  const two = await refused(
    await mint({ ...podClaims(), aud: [clusterAudience("c1"), "https://kubernetes.default.svc"] }),
    "audience",
  );
  assert.match(
    two.reason,
    /names 2 audiences \("nvcf-icms:c1", "https:\/\/kubernetes.default.svc"\).*exactly one/,
  );
  const foreign = await refused(
    await mint({ ...podClaims(), aud: ["https://kubernetes.default.svc"] }),
    "audience",
  );
  assert.match(foreign.reason, /audience "https:\/\/kubernetes.default.svc" is not nvcf-icms:<clusterId>/);
  await refused(await mint({ ...podClaims(), aud: ["nvcf-icms:"] }), "audience");
  await refused(await mint({ ...podClaims(), aud: ["icms:c1"] }), "audience");
  // a cluster id no cluster can have (the API's shape: 1 to 128 of [A-Za-z0-9._-], a letter or digit
  // first): refused before it is looked up, and quoted shortened
  for (const id of ["a".repeat(129), "-c1", "c1/x", "c 1", "c1\n"]) {
    const r = await refused(await mint({ ...podClaims(), aud: [clusterAudience(id)] }), "audience");
    assert.match(r.reason, /not a cluster id/);
    assert.ok(r.reason.length < 400, r.reason);
  }
  const none = await refused(await mint(without(podClaims(), "aud")), "audience");
  assert.match(none.reason, /names no audience/);
  assert.equal(lookups, 0);
  assert.equal(none.clusterId, undefined);
});

void test("a cluster that has not registered its keys", async () => {
  const r = await refused(await mint({ ...podClaims(), aud: [clusterAudience("c9")] }), "unknown-cluster");
  assert.equal(r.clusterId, "c9");
  assert.match(
    r.reason,
    /cluster "c9", which has not registered its keys .*PUT \/v1\/internal\/clusters\/c9\/keys/,
  );
});

void test("algorithms other than RS256 and ES256 are refused by name: none, HS256 keyed with the public key, RS384", async () => {
  const claims = podClaims();
  // alg none, built by hand: no signature at all
  const unsigned = `${b64({ alg: "none", kid: EC_KID })}.${b64(claims)}.`;
  const n = await refused(unsigned, "algorithm");
  assert.match(n.reason, /unsigned \(alg none\)/);
  assert.equal(n.clusterId, "c1");
  // the classic confusion: HMAC with the RSA public key's bytes as the secret, under the RSA key's kid
  const pem = rsa.publicKey.export({ type: "spki", format: "pem" }).toString();
  for (const secret of [pem, JSON.stringify(publicJwk(rsa.publicKey, RSA_KID))]) {
    const hs = await mint(claims, { key: new TextEncoder().encode(secret), alg: "HS256", kid: RSA_KID });
    const r = await refused(hs, "algorithm");
    assert.match(r.reason, /signed with "HS256"; only RS256 and ES256/);
  }
  // a real RSA signature by the registered key, but with an algorithm Kubernetes does not use
  const r384 = await refused(
    await mint(claims, { key: rsa.privateKey, alg: "RS384", kid: RSA_KID }),
    "algorithm",
  );
  assert.match(r384.reason, /"RS384"/);
  // a header whose alg does not fit the key its kid names
  const mixed = await refused(
    await mint(claims, { key: ec.privateKey, alg: "ES256", kid: RSA_KID }),
    "algorithm",
  );
  assert.match(mixed.reason, /says ES256, but key "rsa-1" of cluster "c1" is for RS256/);
  // the same when the registered key names no alg (its kty decides)
  const bare = {
    ...registry.get("c1")!,
    jwks: { keys: registry.get("c1")!.jwks.keys.map((k) => ({ ...k, alg: undefined })) },
  };
  const r = await verifyClusterToken(
    await mint(claims, { key: ec.privateKey, alg: "ES256", kid: RSA_KID }),
    () => bare,
    { now: NOW },
  );
  assert.ok(!r.ok);
  assert.equal(r.failure, "algorithm");
  assert.match(r.reason, /says ES256, but key "rsa-1" of cluster "c1" is for RS256/);
  assert.ok((await verifyClusterToken(await mint(claims, RSA_SIGNER), () => bare, { now: NOW })).ok);
});

void test("signed by a key the cluster has not registered, or by another key under a registered kid", async () => {
  const claims = podClaims();
  const unknown = await refused(
    await mint(claims, { key: ec2.privateKey, alg: "ES256", kid: "k-new" }),
    "signature",
  );
  assert.match(unknown.reason, /signed by a key cluster "c1" has not registered \(kid "k-new"\)/);
  // cluster c2's key, presented to c1 (its audience): c1 does not hold it
  const other = await refused(
    await mint(claims, { key: ec2.privateKey, alg: "ES256", kid: EC2_KID }),
    "signature",
  );
  assert.match(other.reason, /\(kid "ec-2"\)/);
  // a kid c1 holds, signed by another key: the signature is what counts
  const forged = await refused(
    await mint(claims, { key: ec2.privateKey, alg: "ES256", kid: EC_KID }),
    "signature",
  );
  assert.match(forged.reason, /does not verify with key "ec-1" registered for cluster "c1"/);
  // no kid: no key to try
  const nokid = await refused(await mint(claims, { key: ec.privateKey, alg: "ES256" }), "signature");
  assert.match(nokid.reason, /names no key \(kid\)/);
  // a good token altered after signing (claims swapped for another pod's)
  const [h, , s] = (await mint(claims)).split(".");
  await refused(`${h}.${b64(podClaims({ pod: "cp-other" }))}.${s}`, "signature");
  // crit extensions, which Kubernetes never sets, are refused before any crypto
  const crit = await refused(handSigned({ alg: "ES256", kid: EC_KID, crit: ["exp"] }, claims), "malformed");
  assert.match(crit.reason, /critical extensions/);
  // the hand signer makes tokens that verify when nothing is wrong with them
  await accepted(handSigned({ alg: "ES256", kid: EC_KID }, claims));
});

void test("the issuer must be the one the cluster registered", async () => {
  const r = await refused(await mint({ ...podClaims(), iss: "https://evil.example" }), "issuer");
  assert.match(
    r.reason,
    /issued by "https:\/\/evil.example", but cluster "c1" is registered with issuer "https:\/\/kube.example:6443"/,
  );
  await refused(await mint(without(podClaims(), "iss")), "issuer");
  // a trailing slash is another issuer (OIDC compares issuers as strings)
  await refused(await mint({ ...podClaims(), iss: `${ISSUER}/` }), "issuer");
});

void test("times: exp required, exp/nbf/iat with 30 s of skew", async () => {
  assert.equal(POD_TOKEN_SKEW_SECONDS, 30);
  const at = (o: { exp?: number; nbf?: number; iat?: number }) => mint({ ...podClaims(), ...o });
  const expired = await refused(
    await at({ iat: NOW_S - 1000, nbf: NOW_S - 1000, exp: NOW_S - 31 }),
    "expired",
  );
  assert.match(
    expired.reason,
    /expired at 2029-12-31T23:59:29.000Z \(now 2030-01-01T00:00:00.000Z, 30 s of clock skew allowed\)/,
  );
  await accepted(await at({ iat: NOW_S - 1000, nbf: NOW_S - 1000, exp: NOW_S - 29 }));
  // the skew is a setting
  await refused(await at({ iat: NOW_S - 1000, nbf: NOW_S - 1000, exp: NOW_S - 29 }), "expired", {
    skewSeconds: 10,
  });
  const early = await refused(await at({ nbf: NOW_S + 60 }), "not-yet-valid");
  assert.match(early.reason, /not valid before 2030-01-01T00:01:00.000Z/);
  await accepted(await at({ nbf: NOW_S + 25, iat: NOW_S + 25 }));
  const future = await refused(
    await mint({ ...without(podClaims(), "nbf"), iat: NOW_S + 120 }),
    "not-yet-valid",
  );
  assert.match(future.reason, /issued at 2030-01-01T00:02:00.000Z, in the future/);
  const noexp = await refused(await mint(without(podClaims(), "exp")), "malformed");
  assert.match(noexp.reason, /no expiry \(exp\)/);
  await refused(await mint({ ...podClaims(), exp: "never" }), "malformed");
  // iat and nbf are optional
  const bare = await accepted(await mint(without(podClaims(), "iat", "nbf")));
  assert.equal(bare.issuedAt, undefined);
  assert.equal(bare.notBefore, undefined);
});

/** Verifies (the base layer passes) and hands the claims to the worker layer, expecting `failure`. */
async function notAWorker(
  claims: Record<string, unknown>,
  failure: PodTokenFailure,
): Promise<PodTokenRefusal> {
  const c: ClusterTokenClaims = await accepted(await mint(claims));
  const w = workerOf(c);
  assert.ok(!w.ok, "accepted as a worker");
  assert.equal(w.failure, failure, w.reason);
  assert.equal(w.clusterId, "c1");
  return w;
}

const k8s = (o: Record<string, unknown>) => ({
  ...podClaims(),
  "kubernetes.io": { ...(podClaims()["kubernetes.io"] as object), ...o },
});

void test("the worker layer: a worker pod's own account, bound to that very pod", async () => {
  const notSa = await notAWorker({ ...podClaims(), sub: "alice" }, "subject");
  assert.match(notSa.reason, /subject "alice" is not a Kubernetes service account/);
  const other = await notAWorker({ ...podClaims(), sub: `system:serviceaccount:${NS}:default` }, "subject");
  assert.match(
    other.reason,
    /service account "nvcf-workers\/default", not a worker pod's \(nvcf-worker-<pod>\)/,
  );
  await notAWorker({ ...podClaims(), sub: `system:serviceaccount:${NS}:nvcf-worker-` }, "subject");
  const ns = await notAWorker(k8s({ namespace: "elsewhere" }), "subject");
  assert.match(
    ns.reason,
    /subject is in namespace "nvcf-workers" but its kubernetes.io namespace claim says "elsewhere"/,
  );
  const noSa = await notAWorker(without(k8s({}), "kubernetes.io"), "subject");
  assert.match(noSa.reason, /namespace claim says "\(none\)"/);
  const saMissing = await notAWorker(k8s({ serviceaccount: undefined }), "subject");
  assert.match(saMissing.reason, /no kubernetes.io serviceaccount claim/);
  const saName = await notAWorker(
    k8s({ serviceaccount: { name: "nvcf-worker-cp-x", uid: SA_UID } }),
    "subject",
  );
  assert.match(
    saName.reason,
    /names account "nvcf-worker-cp-7c1e" but its kubernetes.io serviceaccount claim says "nvcf-worker-cp-x"/,
  );
  // a TokenRequest for the worker's account made without boundObjectRef
  const unbound = await notAWorker(k8s({ pod: undefined }), "not-bound");
  assert.match(unbound.reason, /not bound to a pod/);
  await notAWorker(k8s({ pod: { name: POD } }), "not-bound");
  // a pod that runs under another worker's account: its token is bound to it, not to the account's pod
  const mismatch = await notAWorker(k8s({ pod: { name: "cp-other", uid: POD_UID } }), "subject");
  assert.match(
    mismatch.reason,
    /bound to pod "cp-other", but its account "nvcf-worker-cp-7c1e" is pod "cp-7c1e"'s/,
  );
});

void test("key rotation: both keys of the set verify; a key taken out of the set no longer does", async () => {
  const rotating: ClusterKeys = {
    clusterId: "r",
    issuer: ISSUER,
    jwks: { keys: [publicJwk(ec.publicKey, "old"), publicJwk(ec2.publicKey, "new")] },
  };
  const claims = { ...podClaims(), aud: [clusterAudience("r")] };
  const byOld = await mint(claims, { key: ec.privateKey, alg: "ES256", kid: "old" });
  const byNew = await mint(claims, { key: ec2.privateKey, alg: "ES256", kid: "new" });
  for (const t of [byOld, byNew]) assert.ok((await verifyClusterToken(t, () => rotating, { now: NOW })).ok);
  const after = { ...rotating, jwks: { keys: [rotating.jwks.keys[1]] } };
  assert.ok((await verifyClusterToken(byNew, () => after, { now: NOW })).ok);
  const r = await verifyClusterToken(byOld, () => after, { now: NOW });
  assert.ok(!r.ok);
  assert.equal(r.failure, "signature");
});

void test("every refusal says something different", async () => {
  const claims = podClaims();
  const tokens: Array<string | Promise<string>> = [
    "x".repeat(POD_TOKEN_MAX_BYTES + 1),
    "not-a-token",
    mint({ ...claims, aud: ["a", "b"] }),
    mint({ ...claims, aud: ["a"] }),
    mint(without(claims, "aud")),
    mint({ ...claims, aud: [clusterAudience("c9")] }),
    `${b64({ alg: "none", kid: EC_KID })}.${b64(claims)}.`,
    mint(claims, { key: rsa.privateKey, alg: "RS384", kid: RSA_KID }),
    mint(claims, { key: ec.privateKey, alg: "ES256", kid: RSA_KID }),
    mint(claims, { key: ec2.privateKey, alg: "ES256", kid: "k-new" }),
    mint(claims, { key: ec2.privateKey, alg: "ES256", kid: EC_KID }),
    mint(claims, { key: ec.privateKey, alg: "ES256" }),
    mint({ ...claims, iss: "https://evil.example" }),
    mint({ ...claims, exp: NOW_S - 600 }),
    mint({ ...claims, nbf: NOW_S + 600 }),
    mint({ ...without(claims, "nbf"), iat: NOW_S + 600 }),
    mint(without(claims, "exp")),
  ];
  const reasons: string[] = [];
  for (const t of tokens) {
    const r = await verify(await t);
    assert.ok(!r.ok);
    reasons.push(r.reason);
  }
  for (const c of [
    { ...claims, sub: "alice" },
    { ...claims, sub: `system:serviceaccount:${NS}:default` },
    k8s({ namespace: "elsewhere" }),
    k8s({ serviceaccount: undefined }),
    k8s({ serviceaccount: { name: "nvcf-worker-cp-x", uid: SA_UID } }),
    k8s({ pod: undefined }),
    k8s({ pod: { name: "cp-other", uid: POD_UID } }),
  ]) {
    const w = workerOf(await accepted(await mint(c)));
    assert.ok(!w.ok);
    reasons.push(w.reason);
  }
  assert.equal(new Set(reasons).size, reasons.length, reasons.join("\n"));
});

void test("checkJwks: a good set is cleaned to its public members", () => {
  const r = publicJwk(rsa.publicKey, "r1");
  const e = publicJwk(ec.publicKey, "e1");
  const got = checkJwks({
    keys: [
      { ...r, key_ops: ["verify"], x5t: "abc" },
      { kty: "EC", kid: "e1", crv: "P-256", x: e.x, y: e.y },
    ],
    extra: true,
  });
  assert.deepEqual(got, {
    ok: true,
    jwks: {
      keys: [
        { kty: "RSA", kid: "r1", use: "sig", alg: "RS256", n: r.n, e: r.e },
        { kty: "EC", kid: "e1", crv: "P-256", x: e.x, y: e.y },
      ],
    },
  });
  // 16 keys is the most
  const sixteen = Array.from({ length: 16 }, (_, i) => ({ ...e, kid: `k${i}` }));
  assert.ok(checkJwks({ keys: sixteen }).ok);
});

void test("checkJwks: every problem names the key and what is wrong", () => {
  const problems = (x: unknown) => {
    const r = checkJwks(x);
    assert.ok(!r.ok, "accepted");
    return r.problems;
  };
  const e = publicJwk(ec.publicKey, "e1");
  for (const x of [null, [], "keys", 7, {}, { keys: "x" }, { keys: { 0: e } }])
    assert.deepEqual(problems(x), ['the key set is not a JSON object with a "keys" array (RFC 7517)']);
  assert.deepEqual(problems({ keys: [] }), ["the key set holds no keys"]);
  const seventeen = Array.from({ length: 17 }, (_, i) => ({ ...e, kid: `k${i}` }));
  assert.deepEqual(problems({ keys: seventeen }), ["the key set holds 17 keys; at most 16 are accepted"]);

  // a private key: refused, and its secret never repeated
  const priv: Record<string, string> = {
    ...(rsa.privateKey.export({ format: "jwk" }) as Record<string, string>),
    kid: "r1",
  };
  const [leak, ...rest] = problems({ keys: [priv] });
  assert.deepEqual(rest, []);
  assert.match(leak, /^key 0 \(kid "r1"\) holds private key material \(d, p, q, dp, dq, qi\)/);
  for (const m of ["d", "p", "q"]) assert.ok(!leak.includes(priv[m]));
  const weak = generateKeyPairSync("rsa", { modulusLength: 1024 }).publicKey;
  assert.deepEqual(problems({ keys: [publicJwk(weak, "w")] }), [
    'key 0 (kid "w") is a 1024-bit RSA key; RS256 keys of 2048 to 8192 bits are accepted',
  ]);
  const p384 = generateKeyPairSync("ec", { namedCurve: "P-384" }).publicKey;
  assert.deepEqual(problems({ keys: [{ ...p384.export({ format: "jwk" }), kid: "p" }] }), [
    'key 0 (kid "p") is an EC key on curve "P-384"; only P-256 (ES256) is accepted',
  ]);
  assert.deepEqual(problems({ keys: [e, { ...e, kid: "e2" }, { ...e }] }), [
    'key 2 (kid "e1") repeats the kid of key 0',
  ]);
  assert.deepEqual(problems({ keys: [without(e, "kid")] }), [
    "key 0 has no kid; every key needs one, since a token names the key it was signed with",
  ]);
  assert.deepEqual(problems({ keys: [{ ...e, kid: 5 }] }), [
    "key 0 has a kid that is not a string of 1 to 256 characters",
  ]);
  // several keys, several problems, each its own line
  const several = problems({
    keys: [
      e,
      "x",
      { ...e, kid: "enc", use: "enc" },
      { ...e, kid: "a", alg: "ES384" },
      { ...publicJwk(rsa.publicKey, "b"), alg: "PS256" },
      { kty: "oct", kid: "h", k: "c2VjcmV0" },
      { kty: "EC", kid: "c", crv: "P-256", x: e.x },
      // well-formed members, but not a point of the curve: only importing the key tells
      { ...e, kid: "off", y: e.x },
      { kty: "RSA", kid: "n", e: "AQAB" },
    ],
  });
  assert.match(several[7], /^key 7 \(kid "off"\) is not a usable public key \(.+\)$/);
  assert.deepEqual(several.toSpliced(7, 1), [
    "key 1 is not a JSON object",
    'key 2 (kid "enc") has use "enc"; a signing key has use "sig" or none',
    'key 3 (kid "a") has alg "ES384"; an EC key must be for ES256',
    'key 4 (kid "b") has alg "PS256"; an RSA key must be for RS256',
    'key 5 (kid "h") holds private key material (k): register the public key only, and treat this one as leaked',
    'key 5 (kid "h") has kty "oct"; only RSA and EC keys are accepted',
    'key 6 (kid "c") is an EC key without its coordinates (x, y) in base64url',
    'key 8 (kid "n") is an RSA key without its modulus and exponent (n, e) in base64url',
  ]);
});

void test("jwksHash: the same keys in any order hash the same; any change to a key changes it", () => {
  const a = publicJwk(rsa.publicKey, "a");
  const b = publicJwk(ec.publicKey, "b");
  const h = jwksHash({ keys: [a, b] });
  assert.match(h, /^[0-9a-f]{64}$/);
  assert.equal(jwksHash({ keys: [b, a] }), h);
  // member order inside a key does not count either
  const reordered = Object.fromEntries(Object.entries(b).reverse()) as unknown as PublicJwk;
  assert.equal(jwksHash({ keys: [reordered, a] }), h);
  assert.notEqual(jwksHash({ keys: [a] }), h);
  assert.notEqual(jwksHash({ keys: [a, { ...b, use: undefined }] }), h);
  assert.notEqual(jwksHash({ keys: [a, publicJwk(ec2.publicKey, "b")] }), h);
  assert.notEqual(jwksHash({ keys: [a, { ...b, kid: "c" }] }), h);
});

void test("unverifiedIssuerAndKid: what the compute agent reads from its own token", async () => {
  const t = await mint(podClaims());
  assert.deepEqual(unverifiedIssuerAndKid(t), { issuer: ISSUER, keyId: EC_KID });
  assert.equal(unverifiedIssuerAndKid("not-a-token"), undefined);
  assert.equal(unverifiedIssuerAndKid(await mint(without(podClaims(), "iss"))), undefined);
  assert.equal(
    unverifiedIssuerAndKid(await mint(podClaims(), { key: ec.privateKey, alg: "ES256" })),
    undefined,
  );
  assert.equal(unverifiedIssuerAndKid("x".repeat(POD_TOKEN_MAX_BYTES + 1)), undefined);
});
