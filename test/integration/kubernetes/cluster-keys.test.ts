// Cluster registration, the compute agent's side (ClusterKeysPublisher), against a real
// kube-apiserver (1.20, the testkit's): the agent's identity token is a real TokenRequest for its
// service account with audience nvcf-icms:<clusterId>; its issuer is the API server's URL, whose OIDC
// discovery and key set are real; the fallback reads /openid/v1/jwks with the agent's own service
// account token (the default RBAC lets service accounts read it).
//
// Two stand-ins, each for a reason:
// - The push target is a small HTTP server that records what it gets and answers as the API's
//   PUT /v1/internal/clusters/{id}/keys does (200, or 403 problem+json with its code, written by
//   lib/errors.ts as the API writes it). The route lands on main separately; the lead adds an
//   end-to-end test against the real API.
// - Key changes: an API server's signing keys cannot change while it runs (and the testkit does not
//   restart one), so where the keys must change the test points discovery (the publisher's
//   discoveryUrl) at a small HTTPS publisher it controls, as an issuer hosted outside the cluster
//   would publish them: it serves the real API server's set, then that set with a new key added.
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { pino } from "pino";
import { request } from "undici";
import { AGENT_IDENTITY_DIR } from "../../../src/deploy/render/compute.js";
import { CallplaneError, type ErrorCode } from "../../../src/lib/errors.js";
import { KubeClient } from "../../../src/lib/kube/index.js";
import { ComputeApiClient } from "../../../src/services/compute/api-client.js";
import { KubernetesBackend } from "../../../src/services/compute/kubernetes/backend.js";
import {
  ClusterKeysPublisher,
  DEFAULT_IDENTITY_TOKEN_FILE,
  type ClusterKeysSettings,
  type KeysLook,
} from "../../../src/services/compute/kubernetes/cluster-keys.js";
import type { Jwk, Jwks } from "../../../src/services/compute/kubernetes/issuer-keys.js";
import { waitFor } from "../../testkit/client.js";
import { testInstanceEnv } from "../../testkit/compute.js";
import { startKubeApiServer, type KubeApiServer } from "../../testkit/kube-apiserver.js";
import { freePort } from "../../testkit/plane.js";
import { lifo } from "../../testkit/proc.js";
import { startCountingPod, testPki } from "../../testkit/tls.js";

type Ctx = Pick<TestContext, "after">;

const CLUSTER = "c1";
const AUDIENCE = `nvcf-icms:${CLUSTER}`;
const CONTROL_NS = "callplane";
const SERVICE_TOKEN = "cps-compute-service-token";
const ADMIN_TOKEN = "cpo-admin-enrollment-token";

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString("base64url");
const headerOf = (jwt: string) =>
  JSON.parse(Buffer.from(jwt.split(".")[0], "base64url").toString()) as { kid: string };

/** A token the publisher reads like the kubelet's (it never verifies it; the API does). */
const craftedToken = (claims: { kid: string; iss: string; exp: number }) =>
  `${b64({ alg: "RS256", kid: claims.kid })}.${b64({ iss: claims.iss, aud: [AUDIENCE], exp: claims.exp })}.c2ln`;

interface Put {
  url: string;
  authorization: string | undefined;
  body: { issuer: string; jwks: Jwks; proofs: string[] };
}

/** What the stand-in API answers a PUT with: a status and an error code, or nothing (hangs). */
type Answer = { status: 200 } | { status: 403; code: ErrorCode } | "hang";

/** The stand-in for the API's keys route (see the top of the file). */
async function startStandInApi(t: Ctx) {
  const puts: Put[] = [];
  let answer: (p: Put) => Answer = () => ({ status: 200 });
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const put: Put = {
        url: req.url ?? "",
        authorization: req.headers.authorization,
        body: JSON.parse(Buffer.concat(chunks).toString()) as Put["body"],
      };
      puts.push(put);
      const a = answer(put);
      if (a === "hang") return;
      if (a.status === 403) {
        const problem = new CallplaneError(a.code, `refused (${a.code})`).toProblem();
        res.writeHead(403, { "content-type": "application/problem+json" });
        res.end(JSON.stringify(problem));
        return;
      }
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          clusterId: CLUSTER,
          issuer: put.body.issuer,
          keyIds: put.body.jwks.keys.map((k) => k.kid),
          changed: true,
          updatedAt: new Date().toISOString(),
        }),
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    puts,
    answerWith(f: (p: Put) => Answer) {
      answer = f;
    },
  };
}

/** Log lines, every level (a repeated warning goes to debug). */
function captureLogs() {
  const lines: Array<{ level: number; msg: string } & Record<string, unknown>> = [];
  const logger = pino(
    { level: "debug" },
    { write: (s: string) => void lines.push(JSON.parse(s) as (typeof lines)[number]) },
  );
  return { lines, logger, warnings: () => lines.filter((l) => l.level === 40) };
}

/** The real API server's key set, as anyone reads it. */
async function apiServerJwks(kube: KubeApiServer): Promise<Jwks> {
  const res = await request(`${kube.url}/openid/v1/jwks`, {
    dispatcher: kube.admin.dispatcher,
    headers: { accept: "application/jwk-set+json" },
  });
  assert.equal(res.statusCode, 200);
  return (await res.body.json()) as Jwks;
}

test("cluster keys: found from the agent's own token, pushed when they change, with its proofs", async (t) => {
  const ctx = lifo(t);
  const kube = await startKubeApiServer(ctx);
  await kube.createNamespace(CONTROL_NS);
  await kube.createServiceAccount(CONTROL_NS, "compute-agent");
  // the agent's API-server credential (the API server's audience) and its identity token (the plane's)
  const client = new KubeClient({
    server: kube.url,
    caPem: kube.caPem,
    token: await kube.tokenFor(CONTROL_NS, "compute-agent"),
  });
  ctx.after(() => client.close());
  const identity = () => kube.tokenFor(CONTROL_NS, "compute-agent", { audiences: [AUDIENCE] });
  const first = await identity();
  const realSet = await apiServerJwks(kube);
  assert.ok(realSet.keys.some((k) => k.kid === headerOf(first).kid));
  const api = await startStandInApi(ctx);
  const computeApi = new ComputeApiClient(api.url, SERVICE_TOKEN);

  const publisher = (
    tokenFile: string,
    logs: ReturnType<typeof captureLogs>,
    o: Partial<ClusterKeysSettings> = {},
  ) => {
    const p = new ClusterKeysPublisher({
      clusterId: CLUSTER,
      identityTokenFile: tokenFile,
      // the tests look by hand; start() is under test once, and looks at once
      refreshMs: 3_600_000,
      enrollmentTokenFile: "",
      caPem: kube.caPem,
      kube: client,
      api: computeApi,
      logger: logs.logger,
      ...o,
    });
    ctx.after(() => p.stop());
    return p;
  };
  const pushed = (l: KeysLook) => {
    assert.equal(l.outcome, "pushed", JSON.stringify(l));
    return l;
  };

  await t.test("the rendered agent pod mounts its token where the setting's default reads it", () => {
    assert.equal(DEFAULT_IDENTITY_TOKEN_FILE, join(AGENT_IDENTITY_DIR, "token"));
  });

  await t.test("at start: the issuer's keys by OIDC discovery, pushed with the token as proof", async () => {
    const logs = captureLogs();
    const p = publisher(kube.writeTokenFile(first), logs);
    p.start();
    await waitFor("the first push", () => api.puts.length === 1, 30_000);
    const put = api.puts[0];
    assert.equal(put.url, `/v1/internal/clusters/${CLUSTER}/keys`);
    assert.equal(put.authorization, `Bearer ${SERVICE_TOKEN}`);
    assert.equal(put.body.issuer, kube.issuer);
    assert.deepEqual(put.body.jwks, realSet);
    assert.deepEqual(put.body.proofs, [first]);
    const line = await waitFor("the log line", () =>
      logs.lines.find((l) => l.msg === "cluster keys pushed to the API"),
    );
    assert.equal(line.level, 30);
    assert.equal(line.via, "oidc");
    assert.equal(line.issuer, kube.issuer);
    assert.deepEqual(
      line.keyIds,
      realSet.keys.map((k) => k.kid),
    );

    // the same keys again: nothing is pushed
    const again = await p.look();
    assert.equal(again.outcome, "unchanged", JSON.stringify(again));
    assert.equal(api.puts.length, 1);
    assert.deepEqual(logs.warnings(), []);
    await p.stop();
  });

  await t.test(
    "discovery unreachable, or naming another issuer: the API server's set, which holds the kid",
    async () => {
      api.puts.length = 0;
      const closed = await freePort("127.0.0.1");
      const logs = captureLogs();
      const p = publisher(kube.writeTokenFile(first), logs, { discoveryUrl: `https://127.0.0.1:${closed}` });
      const l = pushed(await p.look());
      assert.equal(l.via, "apiserver");
      assert.equal(api.puts.length, 1);
      assert.equal(api.puts[0].body.issuer, kube.issuer);
      assert.deepEqual(api.puts[0].body.jwks, realSet);
      const [warning] = logs.warnings();
      assert.match(
        warning.msg,
        /OIDC discovery failed .*ECONNREFUSED.*the API server's key set holds the token's key/,
      );

      // a publisher whose discovery document speaks for another issuer is not believed
      const pki = await testPki();
      const cert = await pki.issue(["127.0.0.1"]);
      const elsewhere = await startCountingPod(ctx, cert, (_req, res) => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            issuer: "https://issuer.example.com",
            jwks_uri: "https://issuer.example.com/keys",
          }),
        );
      });
      const logs2 = captureLogs();
      const p2 = publisher(kube.writeTokenFile(first), logs2, {
        discoveryUrl: `https://127.0.0.1:${elsewhere.port}`,
        caPem: kube.caPem + pki.ca.certPem,
      });
      assert.equal(pushed(await p2.look()).via, "apiserver");
      assert.equal(elsewhere.requests.length, 1, JSON.stringify(logs2.warnings()));
      assert.match(
        logs2.warnings()[0].msg,
        /names the issuer "https:\/\/issuer\.example\.com", not the token's/,
      );
    },
  );

  await t.test(
    "the fallback is refused when the API server's set lacks the token's kid; the last keys stay",
    async () => {
      api.puts.length = 0;
      const closed = await freePort("127.0.0.1");
      const logs = captureLogs();
      const file = kube.writeTokenFile(first);
      const p = publisher(file, logs, { discoveryUrl: `https://127.0.0.1:${closed}` });
      pushed(await p.look());
      // a token signed by a key the API server does not publish (an external issuer's, say)
      writeFileSync(
        file,
        craftedToken({
          kid: "not-this-servers-key",
          iss: kube.issuer,
          exp: Math.floor(Date.now() / 1000) + 600,
        }),
      );
      const l = await p.look();
      assert.equal(l.outcome, "failed");
      assert.match(
        (l as { reason: string }).reason,
        /does not hold the token's key id not-this-servers-key.*the keys pushed last stay registered/,
      );
      assert.equal(api.puts.length, 1, "nothing pushed after the refusal");
      assert.ok(logs.warnings().some((w) => w.msg === (l as { reason: string }).reason));
    },
  );

  await t.test("keys that change are pushed again, with the previous token as a second proof", async () => {
    api.puts.length = 0;
    // the stand-in issuer publisher (see the top of the file): discovery names the real issuer
    const pki = await testPki();
    const cert = await pki.issue(["127.0.0.1"]);
    const added = {
      ...(generateKeyPairSync("rsa", { modulusLength: 2048 }).publicKey.export({ format: "jwk" }) as Jwk),
      kid: "rotated-1",
      use: "sig",
      alg: "RS256",
    };
    let published: Jwks = realSet;
    const issuerHost = await startCountingPod(ctx, cert, (req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify(
          req.url === "/.well-known/openid-configuration"
            ? { issuer: kube.issuer, jwks_uri: `https://127.0.0.1:${issuerHost.port}/keys` }
            : published,
        ),
      );
    });
    const logs = captureLogs();
    const file = kube.writeTokenFile(first);
    const p = publisher(file, logs, {
      discoveryUrl: `https://127.0.0.1:${issuerHost.port}`,
      caPem: kube.caPem + pki.ca.certPem,
    });
    assert.equal(pushed(await p.look()).via, "oidc");
    assert.deepEqual(api.puts[0].body.proofs, [first]);

    // the kubelet refreshed the token: no push for that alone
    const second = await identity();
    assert.notEqual(second, first);
    writeFileSync(file, second);
    assert.equal((await p.look()).outcome, "unchanged");
    assert.equal(api.puts.length, 1);

    // a new key published (in another order: the order alone is no change)
    published = { keys: [added, ...realSet.keys] };
    const l = pushed(await p.look());
    assert.deepEqual(l.keyIds, [added.kid, ...realSet.keys.map((k) => k.kid)]);
    assert.equal(api.puts.length, 2);
    assert.deepEqual(api.puts[1].body.jwks, published);
    assert.deepEqual(api.puts[1].body.proofs, [second, first]);
    published = { keys: [...realSet.keys, added] };
    assert.equal((await p.look()).outcome, "unchanged");

    // an expired previous token is no proof any more: it is left out
    writeFileSync(file, craftedToken({ kid: headerOf(first).kid, iss: kube.issuer, exp: 1 }));
    assert.equal((await p.look()).outcome, "unchanged");
    const third = await identity();
    writeFileSync(file, third);
    published = realSet;
    pushed(await p.look());
    assert.deepEqual(api.puts[2].body.proofs, [third]);
  });

  await t.test(
    "CLUSTER_NOT_ENROLLED without an enrollment token: one warning that says what to do",
    async () => {
      api.puts.length = 0;
      api.answerWith(() => ({ status: 403, code: "CLUSTER_NOT_ENROLLED" }));
      const logs = captureLogs();
      const p = publisher(kube.writeTokenFile(first), logs);
      const l = await p.look();
      assert.deepEqual([l.outcome, (l as { code?: string }).code], ["failed", "CLUSTER_NOT_ENROLLED"]);
      const warnings = logs.warnings();
      assert.equal(warnings.length, 1);
      assert.match(warnings[0].msg, /no keys of cluster c1 yet \(CLUSTER_NOT_ENROLLED\)/);
      assert.match(warnings[0].msg, /callplane cluster enroll c1/);
      assert.match(warnings[0].msg, /compute\.kubernetes\.enrollmentTokenFile/);
      // the next look tries again (nothing was accepted), and does not warn twice
      assert.equal((await p.look()).outcome, "failed");
      assert.equal(api.puts.length, 2);
      assert.equal(logs.warnings().length, 1);
      // once the cluster is enrolled (an admin did it), the agent's own proof is taken
      api.answerWith(() => ({ status: 200 }));
      assert.equal(pushed(await p.look()).credential, "proof");
      assert.equal(api.puts[2].authorization, `Bearer ${SERVICE_TOKEN}`);
    },
  );

  await t.test(
    "a refused proof with an enrollment token: pushed once more with the admin token",
    async () => {
      for (const code of ["CLUSTER_NOT_ENROLLED", "CLUSTER_PROOF_REFUSED"] as const) {
        api.puts.length = 0;
        api.answerWith((put) =>
          put.authorization === `Bearer ${ADMIN_TOKEN}` ? { status: 200 } : { status: 403, code },
        );
        const logs = captureLogs();
        const enrollment = kube.writeTokenFile(`${ADMIN_TOKEN}\n`);
        const p = publisher(kube.writeTokenFile(first), logs, { enrollmentTokenFile: enrollment });
        const l = pushed(await p.look());
        assert.equal(l.credential, "enrollment");
        assert.deepEqual(
          api.puts.map((x) => x.authorization),
          [`Bearer ${SERVICE_TOKEN}`, `Bearer ${ADMIN_TOKEN}`],
        );
        assert.deepEqual(api.puts[1].body, api.puts[0].body);
        assert.ok(
          logs.lines.some((x) => x.level === 30 && /^cluster enrolled with the admin token/.test(x.msg)),
        );
        assert.deepEqual(logs.warnings(), []);
      }
      // any other refusal is not an enrollment matter: the admin token is not sent
      api.puts.length = 0;
      api.answerWith(() => ({ status: 403, code: "FORBIDDEN_SCOPE" }));
      const logs = captureLogs();
      const p = publisher(kube.writeTokenFile(first), logs, {
        enrollmentTokenFile: kube.writeTokenFile(ADMIN_TOKEN),
      });
      const l = await p.look();
      assert.deepEqual([l.outcome, (l as { code?: string }).code], ["failed", "FORBIDDEN_SCOPE"]);
      assert.equal(api.puts.length, 1);
      api.answerWith(() => ({ status: 200 }));
    },
  );

  await t.test("stop() aborts a push in flight; no look follows", async () => {
    api.puts.length = 0;
    api.answerWith(() => "hang");
    const logs = captureLogs();
    const p = publisher(kube.writeTokenFile(first), logs);
    const looking = p.look();
    await waitFor("the push to arrive", () => api.puts.length === 1, 30_000);
    await p.stop();
    assert.deepEqual(await looking, { outcome: "failed", reason: "stopped" });
    assert.deepEqual(await p.look(), { outcome: "failed", reason: "stopped" });
    assert.equal(api.puts.length, 1);
    assert.deepEqual(logs.warnings(), []);
    api.answerWith(() => ({ status: 200 }));
  });

  await t.test(
    "the kubernetes backend starts the publisher as it prepares, and stops it on dispose",
    async () => {
      api.puts.length = 0;
      const ns = "callplane-workers";
      await kube.createNamespace(ns);
      const logs = captureLogs();
      const env = testInstanceEnv({ natsUrl: "tls://nats:4222", natsCaPem: "", dataDir: "/nonexistent" });
      const backend = new KubernetesBackend({
        client: kube.admin,
        namespace: ns,
        clusterId: CLUSTER,
        workerImage: "callplane:test",
        gpuResource: "nvidia.com/gpu",
        unschedulableSeconds: 300,
        terminationGraceSeconds: 30,
        instanceTypes: [{ name: "cpu.small", gpu: "none", gpuCount: 0, nodeSelector: {} }],
        worker: env,
        restart: env.restart,
        api: computeApi,
        logger: logs.logger,
        clusterKeys: {
          identityTokenFile: kube.writeTokenFile(first),
          refreshMs: 3_600_000,
          enrollmentTokenFile: "",
          caPem: kube.caPem,
        },
      });
      ctx.after(() => backend.dispose());
      await backend.prepare(() => undefined);
      await waitFor("the push at start", () => api.puts.length === 1, 30_000);
      assert.deepEqual(api.puts[0].body.proofs, [first]);
      await backend.dispose();
      assert.deepEqual(await backend.clusterKeys?.look(), { outcome: "failed", reason: "stopped" });
    },
  );

  await t.test("a missing token file is a warning, and the loop goes on", async () => {
    const logs = captureLogs();
    const p = publisher(join(kube.dir, "no-such-token"), logs);
    const l = await p.look();
    assert.equal(l.outcome, "failed");
    assert.match(logs.warnings()[0].msg, /cannot read the agent's identity token .*ENOENT/);
  });
});
