// The test kubelet against a real kube-apiserver (Node,RBAC authorization, ServiceAccount admission):
// it binds a pod as the scheduler would, mounts the pod's bound token, its Secret and an emptyDir,
// runs its containers as local processes with the pod's environment, reports Running and Ready,
// and on deletion stops the processes and makes the final delete. It authenticates as its node
// alone (the harness's node token is also in system:masters, which would hide a missing
// permission), so the Node authorizer decides which Secrets and tokens it may have; the binding
// is made as system:kube-scheduler. Both identities come from a token webhook of the test's own.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:https";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { kubePaths, type KubeError, type KubeObject } from "../../../src/lib/kube/index.js";
import { waitFor } from "../../testkit/client.js";
import { startKubeApiServer } from "../../testkit/kube-apiserver.js";
import { distRoot, repoRoot } from "../../testkit/paths.js";
import { running } from "../../testkit/proc.js";
import { reverseScope, tmpDir } from "../../testkit/scope.js";
import { startTestKubelet } from "../../testkit/test-kubelet.js";
import { testPki } from "../../testkit/tls.js";

type Ctx = Pick<TestContext, "after">;
const NS = "workers";
const AUDIENCE = "nvcf-icms:test";

type Pod = KubeObject & {
  spec: { nodeName?: string };
  status: {
    phase: string;
    podIP?: string;
    conditions?: Array<{ type: string; status: string; reason?: string; message?: string }>;
    containerStatuses?: Array<{
      name: string;
      ready: boolean;
      restartCount: number;
      state: { running?: object; waiting?: { reason: string; message?: string } };
    }>;
  };
};

/**
 * A token authentication webhook (TokenReview) knowing two users: the node, in system:nodes only,
 * and the scheduler. Answers the API server's flags and the tokens.
 */
async function identities(t: Ctx) {
  const token = () => randomBytes(16).toString("hex");
  const tokens = { node: token(), scheduler: token() };
  const users: Record<string, { username: string; uid: string; groups: string[] }> = {
    [tokens.node]: { username: "system:node:test-node", uid: "node", groups: ["system:nodes"] },
    [tokens.scheduler]: { username: "system:kube-scheduler", uid: "scheduler", groups: [] },
  };
  const pki = await testPki();
  const cert = await pki.issue(["127.0.0.1"]);
  const server = createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    let body = "";
    req.on("data", (c: Buffer) => (body += c.toString()));
    req.on("end", () => {
      const review = JSON.parse(body) as {
        apiVersion: string;
        spec: { token: string; audiences?: string[] };
      };
      const user = users[review.spec.token];
      const status = user
        ? { authenticated: true, user, audiences: review.spec.audiences }
        : { authenticated: false };
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ apiVersion: review.apiVersion, kind: "TokenReview", status }));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => new Promise((r) => server.close(r)));
  const config = join(tmpDir(t, "kubelet-auth-"), "webhook.kubeconfig");
  const ca = Buffer.from(pki.ca.certPem).toString("base64");
  const url = `https://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  writeFileSync(
    config,
    JSON.stringify({
      apiVersion: "v1",
      kind: "Config",
      clusters: [{ name: "auth", cluster: { server: url, "certificate-authority-data": ca } }],
      users: [{ name: "apiserver", user: {} }],
      contexts: [{ name: "auth", context: { cluster: "auth", user: "apiserver" } }],
      "current-context": "auth",
    }),
  );
  const args = [
    `--authentication-token-webhook-config-file=${config}`,
    "--authentication-token-webhook-version=v1",
  ];
  return { args, tokens };
}

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const getJson = async (url: string) => {
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};
const jwtPayload = (jwt: string) =>
  JSON.parse(Buffer.from(jwt.split(".")[1], "base64url").toString()) as Record<string, unknown>;

test("the test kubelet runs a pod's containers as processes, with its token, Secret and status", async (t) => {
  const scope = reverseScope(t); // what starts last stops first: the kubelet before the API server
  const who = await identities(scope);
  const kube = await startKubeApiServer(scope, { extraApiServerArgs: who.args });
  const [admin, node, scheduler] = [
    kube.admin,
    kube.clientAs(who.tokens.node),
    kube.clientAs(who.tokens.scheduler),
  ];
  await kube.createNamespace(NS);
  await kube.createServiceAccount(NS, "sa-p1");
  const secret = (name: string, data: Record<string, string>) => ({
    apiVersion: "v1",
    kind: "Secret",
    metadata: { name, namespace: NS },
    stringData: data,
  });
  await admin.create(kubePaths.secrets(NS), secret("p1-secrets", { "secrets.json": '{"k":"v1"}' }));
  await admin.create(kubePaths.secrets(NS), secret("p1-worker", { FOO: "bar", KEY: "k-value" }));
  await admin.create(kubePaths.secrets(NS), secret("unrelated", { x: "y" }));
  // the node is a node, not a master: a Secret no pod of its own names is out of its reach
  await assert.rejects(node.get(kubePaths.secrets(NS, "unrelated")), (e: KubeError) => e.status === 403);

  const kubelet = await startTestKubelet(scope, {
    client: node,
    scheduler,
    namespace: NS,
    nodeLabels: { "nvidia.com/gpu.product": "A100", "nvidia.com/gpu.count": "2" },
    podNetwork: "127.0.166.0/24",
    repoRoot,
    images: {
      "example/inference": ({ podIP, env }) => ({
        command: process.execPath,
        args: [
          join(distRoot, "examples", "inference-server.js"),
          "--listen",
          `${podIP}:${env.INFERENCE_PORT}`,
        ],
      }),
      "example/crash": () => ({ command: process.execPath, args: ["-e", "process.exit(3)"] }),
    },
  });
  const nodeObj = await admin.get<KubeObject & { status: { allocatable: Record<string, string> } }>(
    kubePaths.nodes("test-node"),
  );
  assert.equal(nodeObj.metadata?.labels?.["nvidia.com/gpu.product"], "A100");
  assert.equal(nodeObj.status.allocatable["nvidia.com/gpu"], "2");

  const podIP = { valueFrom: { fieldRef: { fieldPath: "status.podIP" } } };
  const affinity = (product: string) => ({
    nodeAffinity: {
      requiredDuringSchedulingIgnoredDuringExecution: {
        nodeSelectorTerms: [
          { matchExpressions: [{ key: "nvidia.com/gpu.product", operator: "In", values: [product] }] },
        ],
      },
    },
  });
  const pod = (name: string, containers: object[], extra: object = {}) => ({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, namespace: NS },
    spec: {
      serviceAccountName: "sa-p1",
      automountServiceAccountToken: false,
      terminationGracePeriodSeconds: 30,
      containers,
      ...extra,
    },
  });
  const created = await admin.create<Pod>(
    kubePaths.pods(NS),
    pod(
      "p1",
      [
        {
          name: "inference",
          image: "example/inference",
          ports: [{ name: "inference", containerPort: 16680 }],
          env: [
            { name: "INFERENCE_PORT", value: "16680" },
            { name: "INFERENCE_HOST", ...podIP },
            { name: "SECRETS_PATH", value: "/var/secrets/secrets.json" },
            { name: "POD", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } },
            { name: "WHERE", value: "$(POD) on $(INFERENCE_HOST)" },
            { name: "API_KEY", valueFrom: { secretKeyRef: { name: "p1-worker", key: "KEY" } } },
          ],
          readinessProbe: { httpGet: { path: "/health", port: "inference" }, periodSeconds: 1 },
          resources: { limits: { "nvidia.com/gpu": "1" } },
          volumeMounts: [{ name: "secrets", mountPath: "/var/secrets", readOnly: true }],
        },
        {
          // the callplane image's shape: node /app/dist/... runs from this checkout
          name: "worker",
          image: "callplane:test",
          command: ["node", "/app/dist/examples/inference-server.js"],
          env: [
            { name: "INFERENCE_PORT", value: "16681" },
            { name: "INFERENCE_HOST", ...podIP },
            { name: "SECRETS_PATH", value: "/var/secrets/secrets.json" },
            { name: "NVCF_TOKEN_FILE_PATH", value: "/var/run/secrets/tokens/token" },
            { name: "BASE_RESPONSE_DIR", value: "/var/inf/responses" },
          ],
          envFrom: [{ secretRef: { name: "p1-worker" } }],
          readinessProbe: { httpGet: { path: "/health", port: 16681 } },
          volumeMounts: [
            { name: "secrets", mountPath: "/var/secrets", readOnly: true },
            { name: "nvcf-worker-token", mountPath: "/var/run/secrets/tokens", readOnly: true },
            { name: "inference-data", mountPath: "/var/inf" },
          ],
        },
      ],
      {
        affinity: affinity("A100"),
        volumes: [
          { name: "secrets", secret: { secretName: "p1-secrets" } },
          {
            name: "nvcf-worker-token",
            projected: {
              sources: [
                { serviceAccountToken: { audience: AUDIENCE, expirationSeconds: 900, path: "token" } },
              ],
            },
          },
          { name: "inference-data", emptyDir: {} },
        ],
      },
    ),
  );
  const uid = created.metadata!.uid!;

  // Running and Ready, bound to the node, with an address of the pod network
  const p1 = await waitFor(
    "p1 Running and Ready",
    async () => {
      const p = await admin.get<Pod>(kubePaths.pods(NS, "p1"));
      const ready = p.status.conditions?.find((c) => c.type === "Ready")?.status === "True";
      return p.status.phase === "Running" && ready && p;
    },
    { timeoutMs: 40_000, intervalMs: 200 },
  );
  assert.equal(p1.spec.nodeName, "test-node");
  assert.match(p1.status.podIP ?? "", /^127\.0\.166\.\d+$/);
  assert.deepEqual(
    p1.status.containerStatuses?.map((c) => [c.name, c.ready, !!c.state.running]),
    [
      ["inference", true, true],
      ["worker", true, true],
    ],
  );
  const [info] = kubelet.pods();
  assert.equal(info?.ip, p1.status.podIP);
  const ip = p1.status.podIP!;

  // the server answers on podIP:port; it reads the Secret's file where SECRETS_PATH now points
  assert.equal((await fetch(`http://${ip}:16680/health`)).status, 200);
  const secrets = await getJson(`http://${ip}:16680/secrets?name=k&env=API_KEY`);
  assert.equal(secrets.body.value, "v1");
  assert.equal(secrets.body.path, join(info.dir, "volumes", "secrets", "secrets.json"));
  assert.deepEqual(secrets.body.env, { name: "API_KEY", set: true, sha256: sha256("k-value") });
  const where = await getJson(`http://${ip}:16680/secrets?env=WHERE`);
  assert.equal((where.body.env as { sha256: string }).sha256, sha256(`p1 on ${ip}`));

  // the worker-shaped container: envFrom the Secret, the token's path under the pod's folder
  const tokenFile = join(info.dir, "volumes", "nvcf-worker-token", "token");
  for (const [name, value] of [
    ["FOO", "bar"],
    ["NVCF_TOKEN_FILE_PATH", tokenFile],
    ["BASE_RESPONSE_DIR", join(info.dir, "volumes", "inference-data", "responses")],
  ]) {
    const r = await getJson(`http://${ip}:16681/secrets?env=${name}`);
    assert.deepEqual(r.body.env, { name, set: true, sha256: sha256(value) }, name);
  }

  // the token: a JWT bound to this pod, for the volume's audience
  const claims = jwtPayload(readFileSync(tokenFile, "utf8"));
  assert.deepEqual(claims.aud, [AUDIENCE]);
  assert.equal(claims.sub, `system:serviceaccount:${NS}:sa-p1`);
  const bound = claims["kubernetes.io"] as { pod: { name: string; uid: string } };
  assert.deepEqual(bound.pod, { name: "p1", uid });
  assert.ok((claims.exp as number) - (claims.iat as number) === 900);

  // a changed Secret is rewritten in place, as the kubelet does
  await admin.patch(kubePaths.secrets(NS, "p1-secrets"), { stringData: { "secrets.json": '{"k":"v2"}' } });
  await waitFor(
    "the new secret value",
    async () => (await getJson(`http://${ip}:16680/secrets?name=k`)).body.value === "v2",
    20_000,
  );

  // an image it cannot run, a container that keeps exiting, a pod that fits no node
  await admin.create(
    kubePaths.pods(NS),
    pod("p2", [
      { name: "pull", image: "registry.example/nothing:1" },
      { name: "crash", image: "example/crash" },
    ]),
  );
  await admin.create(
    kubePaths.pods(NS),
    pod("p3", [{ name: "c", image: "example/crash", resources: { limits: { "nvidia.com/gpu": "1" } } }], {
      affinity: affinity("H100"),
    }),
  );
  await admin.create(
    kubePaths.pods(NS),
    pod("p4", [{ name: "c", image: "example/crash", resources: { limits: { "nvidia.com/gpu": "2" } } }]),
  );
  const p2 = await waitFor(
    "p2's container states",
    async () => {
      const p = await admin.get<Pod>(kubePaths.pods(NS, "p2"));
      const [pull, crash] = p.status.containerStatuses ?? [];
      return (
        pull?.state.waiting &&
        crash?.state.waiting?.reason === "CrashLoopBackOff" &&
        crash.restartCount >= 2 &&
        p
      );
    },
    { timeoutMs: 40_000, intervalMs: 200 },
  );
  assert.equal(p2.status.phase, "Pending");
  assert.ok((kubelet.pods().find((p) => p.name === "p2")?.restarts.crash ?? 0) >= 2);
  assert.equal(p2.status.containerStatuses?.[0]?.state.waiting?.reason, "ErrImagePull");
  assert.match(
    p2.status.containerStatuses?.[0]?.state.waiting?.message ?? "",
    /registry\.example\/nothing:1/,
  );
  for (const [name, why] of [
    ["p3", "didn't match node selector"],
    ["p4", "Insufficient nvidia.com/gpu"],
  ] as const) {
    const p = await waitFor(
      `${name} unschedulable`,
      async () => {
        const p = await admin.get<Pod>(kubePaths.pods(NS, name));
        return p.status.conditions?.find((c) => c.type === "PodScheduled" && c.status === "False") && p;
      },
      15_000,
    );
    const cond = p.status.conditions!.find((c) => c.type === "PodScheduled")!;
    assert.equal(cond.reason, "Unschedulable");
    assert.ok(cond.message?.includes(why), cond.message);
    assert.equal(p.spec.nodeName, undefined);
    assert.equal(p.status.phase, "Pending");
  }

  // deleted: SIGTERM (the example server exits on it), the final delete, the folder removed
  const pids = Object.values(info.pids);
  assert.equal(pids.length, 2);
  await admin.delete(kubePaths.pods(NS, "p1"));
  await waitFor(
    "p1 gone",
    async () => !(await admin.list(kubePaths.pods(NS))).items.some((p) => p.metadata?.name === "p1"),
    20_000,
  );
  assert.deepEqual(pids.filter(running), []);
  await waitFor("p1's folder removed", () => !existsSync(info.dir), 5000);
  assert.ok(!kubelet.pods().some((p) => p.name === "p1"));

  // the GPU p1 held is free: p4 (two GPUs) is bound now
  await waitFor(
    "p4 bound",
    async () => (await admin.get<Pod>(kubePaths.pods(NS, "p4"))).spec.nodeName === "test-node",
    20_000,
  );
});
