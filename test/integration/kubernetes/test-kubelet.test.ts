// The test kubelet against a real kube-apiserver (Node,RBAC authorization, ServiceAccount admission):
// it binds a pod as the scheduler would, mounts the pod's bound token, its Secret and an emptyDir,
// runs its containers as local processes with the pod's environment, reports Running and Ready,
// and on deletion stops the processes and makes the final delete. The kubelet authenticates as its
// node, so the Node authorizer decides which Secrets and tokens it may have.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash, generateKeyPairSync, randomBytes } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test, type TestContext } from "node:test";

type Ctx = Pick<TestContext, "after">;
import { KubeClient, kubePaths, type KubeObject } from "../../../src/lib/kube/index.js";
import { waitFor } from "../../testkit/client.js";
import { distRoot, repoRoot } from "../../testkit/paths.js";
import { freePort } from "../../testkit/plane.js";
import { running } from "../../testkit/proc.js";
import { reverseScope, tmpDir } from "../../testkit/scope.js";
import { startTestKubelet } from "../../testkit/test-kubelet.js";

const BIN = join(process.env.HOME ?? "/root", ".cache/callplane/kubernetes-1.20.2/bin");
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

/** etcd and kube-apiserver on loopback, with an admin, a node and a scheduler identity (tokens). */
async function startApiServer(t: Ctx) {
  const dir = tmpDir(t, "kube-");
  const { publicKey, privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
  writeFileSync(join(dir, "sa.pub"), publicKey.export({ type: "spki", format: "pem" }));
  writeFileSync(join(dir, "sa.key"), privateKey.export({ type: "pkcs8", format: "pem" }));
  const token = () => randomBytes(16).toString("hex");
  const tokens = { admin: token(), node: token(), scheduler: token() };
  writeFileSync(
    join(dir, "tokens.csv"),
    `${tokens.admin},admin,admin,system:masters\n${tokens.node},system:node:test-node,node,system:nodes\n` +
      `${tokens.scheduler},system:kube-scheduler,scheduler\n`,
  );
  const [etcdPort, peerPort, apiPort] = [
    await freePort("127.0.0.1"),
    await freePort("127.0.0.1"),
    await freePort("127.0.0.1"),
  ];
  const etcdUrl = `http://127.0.0.1:${etcdPort}`;
  const start = (cmd: string, args: string[]) => {
    const p = spawn(cmd, args, { stdio: ["ignore", "ignore", "ignore"] });
    t.after(async () => {
      if (p.exitCode !== null) return;
      p.kill("SIGKILL");
      await new Promise((r) => p.once("exit", r));
    });
  };
  start("/usr/bin/etcd", [
    `--data-dir=${join(dir, "etcd")}`,
    `--listen-client-urls=${etcdUrl}`,
    `--advertise-client-urls=${etcdUrl}`,
    `--listen-peer-urls=http://127.0.0.1:${peerPort}`,
  ]);
  const issuer = "https://kubernetes.default.svc.cluster.local";
  start(join(BIN, "kube-apiserver"), [
    `--etcd-servers=${etcdUrl}`,
    "--bind-address=127.0.0.1",
    `--secure-port=${apiPort}`,
    `--cert-dir=${join(dir, "certs")}`,
    `--token-auth-file=${join(dir, "tokens.csv")}`,
    `--service-account-issuer=${issuer}`,
    `--service-account-key-file=${join(dir, "sa.pub")}`,
    `--service-account-signing-key-file=${join(dir, "sa.key")}`,
    `--api-audiences=${issuer}`,
    "--authorization-mode=Node,RBAC",
    "--service-cluster-ip-range=10.96.0.0/16",
    "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,ValidatingAdmissionWebhook",
  ]);
  const caFile = join(dir, "certs", "apiserver.crt"); // the self-signed certificate and its CA
  await waitFor("the API server's certificate", () => existsSync(caFile), 30_000);
  const server = `https://127.0.0.1:${apiPort}`;
  const client = (who: keyof typeof tokens) => {
    const c = new KubeClient({ server, caPem: readFileSync(caFile, "utf8"), token: tokens[who] });
    t.after(() => c.close());
    return c;
  };
  const admin = client("admin");
  await waitFor(
    "the API server to be ready",
    async () => (await admin.send("GET", "/readyz")).statusCode === 200,
    { timeoutMs: 60_000, intervalMs: 250 },
  );
  return { admin, node: client("node"), scheduler: client("scheduler") };
}

const sha256 = (s: string) => createHash("sha256").update(s).digest("hex");
const getJson = async (url: string) => {
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};
const jwtPayload = (jwt: string) =>
  JSON.parse(Buffer.from(jwt.split(".")[1], "base64url").toString()) as Record<string, unknown>;

test("the test kubelet runs a pod's containers as processes, with its token, Secret and status", async (t) => {
  if (!existsSync(join(BIN, "kube-apiserver"))) return t.skip("no kube-apiserver binary (scripts build it)");
  const scope = reverseScope(t); // what starts last stops first: the kubelet before the API server
  const { admin, node, scheduler } = await startApiServer(scope);
  const ns = (obj: object) => ({ ...obj, metadata: { ...(obj as KubeObject).metadata, namespace: NS } });
  await admin.create(kubePaths.namespaces(), { apiVersion: "v1", kind: "Namespace", metadata: { name: NS } });
  await admin.create(
    kubePaths.serviceAccounts(NS),
    ns({ apiVersion: "v1", kind: "ServiceAccount", metadata: { name: "sa-p1" } }),
  );
  const secret = (name: string, data: Record<string, string>) => ({
    apiVersion: "v1",
    kind: "Secret",
    metadata: { name, namespace: NS },
    stringData: data,
  });
  await admin.create(kubePaths.secrets(NS), secret("p1-secrets", { "secrets.json": '{"k":"v1"}' }));
  await admin.create(kubePaths.secrets(NS), secret("p1-worker", { FOO: "bar", KEY: "k-value" }));

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
    { timeoutMs: 20_000, intervalMs: 200 },
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
    10_000,
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
    { timeoutMs: 20_000, intervalMs: 200 },
  );
  assert.equal(p2.status.phase, "Pending");
  assert.equal(p2.status.containerStatuses?.[0]?.state.waiting?.reason, "ErrImagePull");
  assert.match(
    p2.status.containerStatuses?.[0]?.state.waiting?.message ?? "",
    /registry\.example\/nothing:1/,
  );
  for (const [name, why] of [
    ["p3", "didn't match node selector"],
    ["p4", "Insufficient nvidia.com/gpu"],
  ] as const) {
    const p = await waitFor(`${name} unschedulable`, async () => {
      const p = await admin.get<Pod>(kubePaths.pods(NS, name));
      return p.status.conditions?.find((c) => c.type === "PodScheduled" && c.status === "False") && p;
    });
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
    10_000,
  );
  assert.deepEqual(pids.filter(running), []);
  await waitFor("p1's folder removed", () => !existsSync(info.dir), 5000);
  assert.ok(!kubelet.pods().some((p) => p.name === "p1"));

  // the GPU p1 held is free: p4 (two GPUs) is bound now
  await waitFor(
    "p4 bound",
    async () => (await admin.get<Pod>(kubePaths.pods(NS, "p4"))).spec.nodeName === "test-node",
    10_000,
  );
});
