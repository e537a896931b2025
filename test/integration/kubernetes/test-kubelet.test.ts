// The test kubelet against a real kube-apiserver (Node,RBAC authorization, ServiceAccount admission):
// it binds a pod as the scheduler would, mounts the pod's bound token, its Secret and an emptyDir,
// runs its containers as local processes with the pod's environment, reports Running and Ready,
// and on deletion stops the processes and makes the final delete. It authenticates as its node
// alone (the harness's node user is in system:nodes only), so the Node authorizer decides which
// Secrets and tokens it may have; the binding is made as the harness's system:kube-scheduler.
// Midway the API server's signing key is rotated (one restart of kube-apiserver) while the pod runs:
// renewTokens() puts a token of the new key in the pod's file, and the rest of the test runs on
// against the restarted server.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { kubePaths, type KubeError, type KubeObject } from "../../../src/lib/kube/index.js";
import { waitFor } from "../../testkit/client.js";
import { startKubeApiServer } from "../../testkit/kube-apiserver.js";
import { distRoot, repoRoot } from "../../testkit/paths.js";
import { running } from "../../testkit/proc.js";
import { reverseScope } from "../../testkit/scope.js";
import { startTestKubelet } from "../../testkit/test-kubelet.js";

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

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const getJson = async (url: string) => {
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};
const jwtPayload = (jwt: string) =>
  JSON.parse(Buffer.from(jwt.split(".")[1], "base64url").toString()) as Record<string, unknown>;
const jwtHeader = (jwt: string) =>
  JSON.parse(Buffer.from(jwt.split(".")[0], "base64url").toString()) as { kid?: string; alg?: string };

test("the test kubelet runs a pod's containers as processes, with its token, Secret and status", async (t) => {
  const scope = reverseScope(t); // what starts last stops first: the kubelet before the API server
  const kube = await startKubeApiServer(scope);
  const { admin, node, scheduler } = kube;
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

  // the API server's signing key rotated while p1 runs (a restart of kube-apiserver): the token
  // file keeps its token until renewTokens() asks again, as the kubelet would at 80 % of its life
  const oldKid = kube.signingKeyId();
  assert.equal(jwtHeader(readFileSync(tokenFile, "utf8")).kid, oldKid);
  const newKid = await kube.rotateServiceAccountKey();
  assert.notEqual(newKid, oldKid);
  assert.equal(jwtHeader(readFileSync(tokenFile, "utf8")).kid, oldKid);
  await kubelet.renewTokens();
  const renewed = readFileSync(tokenFile, "utf8");
  assert.equal(jwtHeader(renewed).kid, newKid);
  const renewedClaims = jwtPayload(renewed);
  assert.deepEqual(renewedClaims.aud, [AUDIENCE]);
  assert.deepEqual((renewedClaims["kubernetes.io"] as { pod: object }).pod, { name: "p1", uid });
  assert.ok((renewedClaims.exp as number) - (renewedClaims.iat as number) === 900);
  const review = await kube.reviewToken(renewed, [AUDIENCE]);
  assert.equal(review.authenticated, true, review.error);
  // the containers ran on through the restart
  assert.deepEqual(kubelet.pods().find((p) => p.name === "p1")?.pids, info.pids);

  // a changed Secret is rewritten in place, as the kubelet does (its watch of the Secret resumed
  // after the restart, once its retry backoff let it: the wait allows for that)
  await admin.patch(kubePaths.secrets(NS, "p1-secrets"), { stringData: { "secrets.json": '{"k":"v2"}' } });
  await waitFor(
    "the new secret value",
    async () => (await getJson(`http://${ip}:16680/secrets?name=k`)).body.value === "v2",
    40_000,
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
