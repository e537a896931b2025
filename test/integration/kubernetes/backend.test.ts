// The compute agent's Kubernetes backend against a real kube-apiserver (1.20, RBAC, ServiceAccount
// admission; the testkit's) and a real API. The agent authenticates as the ServiceAccount
// compute-agent, bound to a Role with exactly the verbs the backend uses (AGENT_RULES, NODE_RULES;
// what `callplane render` grants must cover them, checked below), so a missing permission fails
// here. No kubelet and no scheduler run: pods stay Pending, and the test plays the kubelet's status
// updates itself (the status subresource, as an admin) where a status is under test. One test runs
// kube-controller-manager, whose garbage collector removes a pod's identity objects with it.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { pino } from "pino";
import type { IContainer, IPod } from "kubernetes-models/v1";
import {
  KubeClient,
  kubePaths,
  watchCollection,
  type KubeObject,
  type WatchEventType,
} from "../../../src/lib/kube/index.js";
import { COMPUTE_AGENT_CLUSTER_RULES, COMPUTE_AGENT_RULES } from "../../../src/deploy/render/compute.js";
import { createComputeAgent, type ComputeAgent } from "../../../src/services/compute/agent.js";
import type { KubernetesBackend } from "../../../src/services/compute/kubernetes/backend.js";
import type { PodInstance } from "../../../src/services/compute/kubernetes/pod-instance.js";
import {
  buildInstanceObjects,
  LABELS,
  managedSelector,
} from "../../../src/services/compute/kubernetes/pod-spec.js";
import { waitFor as poll } from "../../testkit/client.js";
import { call, sampleFunction, startApi, type ApiFixture } from "../../testkit/index.js";
import { startKubeApiServer, type KubeApiServer as Kube } from "../../testkit/kube-apiserver.js";
import { lifo } from "../../testkit/proc.js";
import { testInstanceEnv } from "../../testkit/compute.js";

const waitFor = <T>(
  what: string,
  check: () => T | undefined | false | Promise<T | undefined | false>,
  ms = 30_000,
) => poll(what, check, { timeoutMs: ms, intervalMs: 100 });

const NS = "callplane-workers";
const CONTROL_NS = "callplane";
const CLUSTER = "c1";
const SELECTOR = managedSelector(CLUSTER);
const RBAC = "rbac.authorization.k8s.io";

/** The agent's Role in the workers' namespace: every verb the backend uses, and no other. */
const AGENT_RULES = [
  { apiGroups: [""], resources: ["pods"], verbs: ["get", "list", "watch", "create", "delete"] },
  { apiGroups: [""], resources: ["serviceaccounts"], verbs: ["list", "create", "patch", "delete"] },
  { apiGroups: [""], resources: ["secrets"], verbs: ["list", "create", "patch", "delete"] },
  { apiGroups: [RBAC], resources: ["roles", "rolebindings"], verbs: ["list", "create", "patch", "delete"] },
];
/** Its ClusterRole: instance types are found on the nodes' labels. */
const NODE_RULES = [{ apiGroups: [""], resources: ["nodes"], verbs: ["list", "watch"] }];

const A100 = {
  name: "a100.x2",
  gpu: "A100",
  gpuCount: 2,
  nodeSelector: { "nvidia.com/gpu.product": "A100", "nvidia.com/gpu.count": "2" },
};
const CPU = { name: "cpu.small", gpu: "none", gpuCount: 0, nodeSelector: {} };

const deploymentOf = (min: number, type: { name: string; gpu: string } = A100) => ({
  deploymentSpecifications: [
    {
      gpu: type.gpu,
      instanceType: type.name,
      minInstances: min,
      maxInstances: Math.max(min, 1),
      maxRequestConcurrency: 4,
    },
  ],
});

/** The compute-agent account in the control namespace, its Role in the workers' namespace and its node ClusterRole. */
async function agentAccount(kube: Kube): Promise<string> {
  const { admin } = kube;
  for (const name of [NS, CONTROL_NS]) await kube.createNamespace(name);
  await kube.createServiceAccount(CONTROL_NS, "compute-agent");
  const subject = [{ kind: "ServiceAccount", name: "compute-agent", namespace: CONTROL_NS }];
  await admin.create(kubePaths.roles(NS), {
    apiVersion: `${RBAC}/v1`,
    kind: "Role",
    metadata: { name: "compute-agent", namespace: NS },
    rules: AGENT_RULES,
  });
  await admin.create(kubePaths.roleBindings(NS), {
    apiVersion: `${RBAC}/v1`,
    kind: "RoleBinding",
    metadata: { name: "compute-agent", namespace: NS },
    roleRef: { apiGroup: RBAC, kind: "Role", name: "compute-agent" },
    subjects: subject,
  });
  await admin.create(kubePaths.cluster(RBAC, "v1", "clusterroles"), {
    apiVersion: `${RBAC}/v1`,
    kind: "ClusterRole",
    metadata: { name: "callplane-compute-agent-nodes" },
    rules: NODE_RULES,
  });
  await admin.create(kubePaths.cluster(RBAC, "v1", "clusterrolebindings"), {
    apiVersion: `${RBAC}/v1`,
    kind: "ClusterRoleBinding",
    metadata: { name: "callplane-compute-agent-nodes" },
    roleRef: { apiGroup: RBAC, kind: "ClusterRole", name: "callplane-compute-agent-nodes" },
    subjects: subject,
  });
  return kube.writeTokenFile(await kube.tokenFor(CONTROL_NS, "compute-agent"));
}

interface Logs {
  lines: Array<Record<string, unknown>>;
  logger: pino.Logger;
}
function captureLogs(): Logs {
  const lines: Array<Record<string, unknown>> = [];
  const logger = pino(
    { level: "info" },
    { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) },
  );
  return { lines, logger };
}

function agentFor(
  api: ApiFixture,
  kube: Kube,
  tokenFile: string,
  logs: Logs,
  opts: {
    instanceTypes?: Array<typeof A100>;
    unschedulableSeconds?: number;
    terminationGraceSeconds?: number;
    deleteWaitMs?: number;
  } = {},
): ComputeAgent<PodInstance> {
  const client = new KubeClient({ server: kube.url, caPem: kube.caPem, tokenFile });
  const agent = createComputeAgent({
    listen: { host: "127.0.0.1", port: 0 },
    apiUrl: api.url,
    serviceToken: api.serviceToken("compute"),
    syncIntervalMs: 300,
    reporter: `kubernetes-${CLUSTER}`,
    clusterId: CLUSTER,
    instanceEnv: testInstanceEnv({
      natsUrl: "tls://nats.callplane.svc:4222",
      natsCaPem: "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n",
      dataDir: "/nonexistent",
    }),
    tokenSource: "psat",
    logger: logs.logger,
    kubernetes: {
      client,
      namespace: NS,
      workerImage: "callplane:test",
      gpuResource: "nvidia.com/gpu",
      unschedulableSeconds: opts.unschedulableSeconds ?? 300,
      terminationGraceSeconds: opts.terminationGraceSeconds ?? 30,
      instanceTypes: opts.instanceTypes ?? [A100, CPU],
      deleteWaitMs: opts.deleteWaitMs ?? 5000,
    },
  });
  const close = agent.close.bind(agent);
  // the client goes with the agent, as in main.ts
  agent.close = async (g?: number) => {
    await close(g);
    await client.close();
  };
  return agent;
}

async function listOf(kube: Kube, path: string, selector = SELECTOR): Promise<KubeObject[]> {
  return (await kube.admin.list(path, { query: { labelSelector: selector } })).items;
}
const names = (l: KubeObject[]) => l.map((o) => o.metadata?.name ?? "").sort();
const idsOf = (l: KubeObject[]) => new Set(l.map((o) => o.metadata?.labels?.[LABELS.instanceId] ?? ""));

/** Every object of the backend's in the workers' namespace, by kind. */
async function everything(kube: Kube) {
  const [pods, sas, roles, bindings, secrets] = await Promise.all([
    listOf(kube, kubePaths.pods(NS)),
    listOf(kube, kubePaths.serviceAccounts(NS)),
    listOf(kube, kubePaths.roles(NS)),
    listOf(kube, kubePaths.roleBindings(NS)),
    listOf(kube, kubePaths.secrets(NS)),
  ]);
  return { pods, sas, roles, bindings, secrets };
}

/** Records the pods the test's own watch sees ADDED and DELETED. */
function recordPods(kube: Kube, t: Pick<TestContext, "after">) {
  const events: Array<{ type: WatchEventType; name: string }> = [];
  const w = watchCollection(
    kube.admin,
    kubePaths.pods(NS),
    { labelSelector: SELECTOR },
    {
      onList: () => undefined,
      onEvent: (type, p) => {
        if (type !== "MODIFIED") events.push({ type, name: p.metadata?.name ?? "" });
      },
    },
  );
  t.after(() => w.stop());
  return { events, synced: w.synced, stop: () => w.stop() };
}

async function setPodStatus(kube: Kube, name: string, status: Record<string, unknown>): Promise<void> {
  await kube.admin.patch(`${kubePaths.pods(NS, name)}/status`, { status }, "merge");
}

test("the kubernetes backend: pods with their own identity, on a real API server", async (t) => {
  const ctx = lifo(t);
  const kube = await startKubeApiServer(ctx);
  const tokenFile = await agentAccount(kube);
  // (deployments must name a type some registered cluster offers)
  const api = await startApi(ctx, { workerAuth: "token", clusterId: CLUSTER, computeBackend: "kubernetes" });
  const admin = await api.adminToken();
  const logs = captureLogs();
  let agent = agentFor(api, kube, tokenFile, logs);
  ctx.after(() => agent.destroy());
  await agent.listen();
  const reported = async (vid: string) => await api.store.listInstances(vid);
  const mine = (vid: string) => agent.instances().filter((i) => i.deployment.versionId === vid);

  const created = await call<{ function: { id: string; versionId: string } }>(
    `${api.url}/v2/nvcf/functions`,
    {
      token: admin,
      body: sampleFunction("on-pods", {
        containerImage: "nvcr.io/example/echo:1.0",
        containerArgs: "--port 8000 --greeting $(HOME)",
        containerEnvironment: [{ key: "MODE", value: "fast" }],
        secrets: [{ name: "API_TOKEN", value: "s3cret" }],
      }),
    },
  );
  assert.equal(created.status, 200, created.text);
  const fn = created.body.function;
  const depPath = `${api.url}/v2/nvcf/deployments/functions/${fn.id}/versions/${fn.versionId}`;
  let first: PodInstance | undefined;
  let firstPod: IPod | undefined;

  await t.test(
    "the instance types are registered with the API, which refuses a type no cluster offers",
    async () => {
      await waitFor("the registration", () => agent.instanceTypes.registered);
      assert.deepEqual(agent.instanceTypes.registered, [
        { name: "a100.x2", gpu: "A100", gpuCount: 2 },
        { name: "cpu.small", gpu: "none", gpuCount: 0 },
      ]);
      assert.ok(
        logs.lines.some((l) => l.msg === "instance types registered with the API" && l.clusterId === CLUSTER),
      );
      const refused = await call<{ code?: string }>(depPath, {
        token: admin,
        body: deploymentOf(1, { name: "h100.x8", gpu: "H100" }),
      });
      assert.equal(refused.status, 400, refused.text);
      assert.equal(refused.body.code, "INSTANCE_TYPE_UNAVAILABLE");
    },
  );

  await t.test(
    "a deployment gets a pod, its account, role, binding and two Secrets, shaped per the contract",
    async () => {
      const r = await call(depPath, { token: admin, body: deploymentOf(1) });
      assert.equal(r.status, 200, r.text);
      const pods = await waitFor("one pod", async () => {
        const l = await listOf(kube, kubePaths.pods(NS));
        return l.length === 1 && l;
      });
      const pod = pods[0] as IPod & KubeObject;
      firstPod = pod;
      const podName = pod.metadata!.name!;
      const inst = await waitFor("the agent's instance", () => mine(fn.versionId)[0]);
      first = inst;
      const id = inst.instanceId;
      assert.equal(podName, `cp-${id}`);
      const identity = `nvcf-worker-${podName}`;

      // labels and annotations
      assert.deepEqual(pod.metadata!.labels, {
        "app.kubernetes.io/managed-by": "callplane-compute",
        "callplane.io/cluster": CLUSTER,
        "callplane.io/instance-id": id,
        "function-id": fn.id,
        "function-version-id": fn.versionId,
        "nvcf.nvidia.io/deployment-id": inst.deployment.deploymentId,
        "nca-id": inst.deployment.ncaId,
      });
      assert.deepEqual(pod.metadata!.annotations, {
        "function-name": "on-pods",
        "nvcf.nvidia.io/instance-type-name": "a100.x2",
        "nvcf.nvidia.io/backend": "kubernetes",
        "nvcf.nvidia.io/gpu-name": "A100",
      });
      // the pod's spec
      const spec = pod.spec!;
      assert.equal(spec.serviceAccountName, identity);
      assert.equal(spec.automountServiceAccountToken, false);
      assert.equal(spec.terminationGracePeriodSeconds, 30);
      assert.equal(spec.restartPolicy, "Always");
      // (the DefaultTolerationSeconds admission plugin adds the not-ready and unreachable ones)
      assert.deepEqual(
        spec.tolerations?.filter((tl) => tl.key === "nvidia.com/gpu"),
        [{ key: "nvidia.com/gpu", operator: "Exists", effect: "NoSchedule" }],
      );
      assert.deepEqual(
        spec.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms,
        [
          {
            matchExpressions: [
              { key: "nvidia.com/gpu.product", operator: "In", values: ["A100"] },
              { key: "nvidia.com/gpu.count", operator: "In", values: ["2"] },
            ],
          },
        ],
      );
      const token = spec.volumes?.find((v) => v.name === "nvcf-worker-token");
      assert.deepEqual(token?.projected?.sources, [
        { serviceAccountToken: { audience: `nvcf-icms:${CLUSTER}`, expirationSeconds: 900, path: "token" } },
      ]);
      const byName = new Map(spec.containers.map((c) => [c.name, c]));
      const inference = byName.get("inference") as IContainer;
      const worker = byName.get("worker") as IContainer;
      assert.deepEqual([...byName.keys()], ["inference", "worker"]);
      // GPUs: requests equal limits, on the function's container
      assert.deepEqual(inference.resources, {
        requests: { "nvidia.com/gpu": "2" },
        limits: { "nvidia.com/gpu": "2" },
      });
      assert.equal(inference.image, "nvcr.io/example/echo:1.0");
      // a $(...) of the function's is literal, not a Kubernetes variable reference
      assert.deepEqual(inference.args, ["--port", "8000", "--greeting", "$$(HOME)"]);
      const env = (c: IContainer) => new Map((c.env ?? []).map((e) => [e.name, e.value ?? e.valueFrom]));
      const ienv = env(inference);
      assert.equal(ienv.get("MODE"), "fast");
      assert.equal(ienv.get("INFERENCE_PORT"), "8000");
      assert.deepEqual(ienv.get("INFERENCE_HOST"), {
        fieldRef: { apiVersion: "v1", fieldPath: "status.podIP" },
      });
      assert.equal(ienv.get("SECRETS_PATH"), "/var/secrets/secrets.json");
      assert.deepEqual(inference.ports, [{ name: "inference", containerPort: 8000, protocol: "TCP" }]);
      assert.deepEqual(
        inference.volumeMounts?.find((m) => m.name === "secrets"),
        { name: "secrets", mountPath: "/var/secrets", readOnly: true },
      );
      // the token is the worker's only: the function's own code never holds it
      assert.ok(!inference.volumeMounts?.some((m) => m.name === "nvcf-worker-token"));
      assert.deepEqual(
        worker.volumeMounts?.find((m) => m.name === "nvcf-worker-token"),
        { name: "nvcf-worker-token", mountPath: "/var/run/secrets/tokens", readOnly: true },
      );
      assert.equal(worker.image, "callplane:test");
      assert.deepEqual(worker.command, ["node", "/app/dist/src/services/worker/main.js"]);
      const wenv = env(worker);
      assert.equal(wenv.get("NVCF_TOKEN_FILE_PATH"), "/var/run/secrets/tokens/token");
      assert.equal(wenv.get("NVCF_IDENTITY_SOURCE"), "psat");
      assert.equal(wenv.get("INSTANCE_ID"), id);
      assert.equal(wenv.get("NVCF_INSTANCE_ID"), podName);
      assert.equal(wenv.get("FUNCTION_ID"), fn.id);
      assert.equal(wenv.get("NVCF_FQDN_NATS"), "tls://nats.callplane.svc:4222");
      assert.equal(wenv.get("HEALTH_PORT"), "8080");
      assert.equal(wenv.get("BASE_RESPONSE_DIR"), "/var/inf/responses");
      assert.deepEqual(wenv.get("HEALTH_HOST"), {
        fieldRef: { apiVersion: "v1", fieldPath: "status.podIP" },
      });
      // the NATS credential comes from the -worker Secret, never as plain pod env
      assert.ok(!wenv.has("NVCF_NATS_ACCOUNT") && !wenv.has("NKEY_SEED"));
      assert.deepEqual(worker.envFrom, [{ secretRef: { name: `${podName}-worker` } }]);
      assert.equal(worker.readinessProbe?.httpGet?.path, "/v1/health/ready");
      assert.equal(worker.livenessProbe?.httpGet?.path, "/v1/health/live");

      // the identity objects, and the Secrets' contents
      const { sas, roles, bindings, secrets } = await everything(kube);
      assert.deepEqual(names(sas), [identity]);
      assert.deepEqual(names(roles), [identity]);
      assert.deepEqual(names(bindings), [identity]);
      assert.deepEqual(names(secrets), [`${podName}-secrets`, `${podName}-worker`]);
      assert.equal(
        (sas[0] as { automountServiceAccountToken?: boolean }).automountServiceAccountToken,
        false,
      );
      assert.deepEqual((roles[0] as { rules?: unknown }).rules ?? [], []);
      assert.deepEqual((bindings[0] as { roleRef?: unknown }).roleRef, {
        apiGroup: RBAC,
        kind: "Role",
        name: identity,
      });
      assert.deepEqual((bindings[0] as { subjects?: unknown }).subjects, [
        { kind: "ServiceAccount", name: identity, namespace: NS },
      ]);
      const data = (s: KubeObject) =>
        Object.fromEntries(
          Object.entries((s as { data?: Record<string, string> }).data ?? {}).map(([k, v]) => [
            k,
            Buffer.from(v, "base64").toString(),
          ]),
        );
      const byN = new Map(secrets.map((s) => [s.metadata?.name, s]));
      assert.deepEqual(data(byN.get(`${podName}-worker`)!), { NVCF_NATS_ACCOUNT: "APP" });
      assert.deepEqual(JSON.parse(data(byN.get(`${podName}-secrets`)!)["secrets.json"]), {
        API_TOKEN: "s3cret",
      });
      for (const o of [...sas, ...roles, ...bindings, ...secrets])
        assert.equal(o.metadata?.labels?.[LABELS.instanceId], id, `${o.metadata?.name} is labelled`);

      // once the pod exists, each points at it (the garbage collector's owner)
      await waitFor("owner references on all five", async () => {
        const all = await everything(kube);
        return [...all.sas, ...all.roles, ...all.bindings, ...all.secrets].every((o) => {
          const refs = o.metadata?.ownerReferences ?? [];
          return (
            refs.length === 1 &&
            refs[0].kind === "Pod" &&
            refs[0].name === podName &&
            refs[0].uid === pod.metadata!.uid &&
            refs[0].blockOwnerDeletion === false
          );
        });
      });

      // what the agent reports: STARTING (no kubelet runs it), where, and who its worker is
      const row = await waitFor("the instance reported", async () =>
        (await reported(fn.versionId)).find((i) => i.instanceId === id),
      );
      assert.equal(row.status, "STARTING");
      assert.equal(row.backend, "kubernetes");
      assert.equal(row.location, `${NS}/${podName}`);
      assert.equal(row.instanceType, "a100.x2");
      const workerAuth = {
        sub: `system:serviceaccount:${NS}:${identity}`,
        saUid: sas[0].metadata?.uid,
        workerIdentifiers: [{ name: podName, uid: pod.metadata!.uid }],
      };
      assert.deepEqual(inst.workerAuth, workerAuth);
      const kept = await waitFor("the API keeps who the worker is", () => api.store.workerAuthOf(id));
      assert.deepEqual(kept.workerAuth, workerAuth);
      assert.ok(
        logs.lines.some((l) => l.msg === "pod created" && l.instanceId === id && l.pod === podName),
        "one info line names the pod created",
      );
    },
  );

  await t.test(
    "the pod's status decides the instance's: Running and Ready is ACTIVE; pull failures, crash loops, unschedulable are ERRORED",
    async () => {
      assert.ok(first && firstPod, "the previous subtest made the pod");
      const inst = first;
      const name = firstPod.metadata!.name!;
      const statusOf = async (want: string) =>
        await waitFor(`the instance reported ${want}`, async () =>
          (await reported(fn.versionId)).find((i) => i.instanceId === inst.instanceId && i.status === want),
        );
      const now = new Date().toISOString();
      const ready = (s: "True" | "False") => [
        { type: "PodScheduled", status: "True", lastTransitionTime: now },
        { type: "Ready", status: s, lastTransitionTime: now },
      ];
      await setPodStatus(kube, name, { phase: "Running", podIP: "10.1.2.3", conditions: ready("True") });
      const active = await statusOf("ACTIVE");
      assert.equal(active.location, `${NS}/${name} at 10.1.2.3`);
      assert.equal(active.message, undefined);

      await setPodStatus(kube, name, {
        phase: "Pending",
        conditions: ready("False"),
        containerStatuses: [
          {
            name: "inference",
            image: "nvcr.io/example/echo:1.0",
            imageID: "",
            ready: false,
            restartCount: 0,
            state: {
              waiting: { reason: "ErrImagePull", message: "pull access denied for nvcr.io/example/echo" },
            },
          },
        ],
      });
      const pull = await statusOf("ERRORED");
      assert.match(
        pull.message ?? "",
        /^image pull failed: container inference \(nvcr\.io\/example\/echo:1\.0\): ErrImagePull: pull access denied/,
      );

      await setPodStatus(kube, name, {
        phase: "Running",
        conditions: ready("False"),
        containerStatuses: [
          {
            name: "worker",
            image: "callplane:test",
            imageID: "",
            ready: false,
            restartCount: 5,
            state: {
              waiting: { reason: "CrashLoopBackOff", message: "back-off 40s restarting failed container" },
            },
            lastState: { terminated: { exitCode: 2, reason: "Error" } },
          },
        ],
      });
      await waitFor("crash loop reported", async () =>
        (await reported(fn.versionId)).find(
          (i) =>
            i.instanceId === inst.instanceId &&
            /keeps crashing \(restarted 5 times\); it last exited with code 2/.test(i.message ?? ""),
        ),
      );

      // Pending and refused by the scheduler for longer than unschedulableSeconds (300 s here)
      const long = new Date(Date.now() - 10 * 60_000).toISOString();
      await setPodStatus(kube, name, {
        phase: "Pending",
        containerStatuses: null,
        conditions: [
          {
            type: "PodScheduled",
            status: "False",
            reason: "Unschedulable",
            message: "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            lastTransitionTime: long,
          },
        ],
      });
      await waitFor("unschedulable reported", async () =>
        (await reported(fn.versionId)).find(
          (i) =>
            i.instanceId === inst.instanceId &&
            i.status === "ERRORED" &&
            /^unschedulable for \d+s: Unschedulable: 0\/3 nodes are available: 3 Insufficient nvidia\.com\/gpu\./.test(
              i.message ?? "",
            ),
        ),
      );
      // and back: scheduled, running, ready
      await setPodStatus(kube, name, { phase: "Running", podIP: "10.1.2.3", conditions: ready("True") });
      await statusOf("ACTIVE");
    },
  );

  await t.test(
    "a secret of the version changed: the pod's secrets Secret gets the new secrets.json",
    async () => {
      const inst = mine(fn.versionId)[0];
      assert.ok(inst);
      const put = await call(`${api.url}/v2/nvcf/secrets/functions/${fn.id}/versions/${fn.versionId}`, {
        method: "PUT",
        token: admin,
        body: {
          secrets: [
            { name: "API_TOKEN", value: "rotated" },
            { name: "ADDED", value: { a: 1 } },
          ],
        },
      });
      assert.equal(put.status, 204, put.text);
      const secret = await waitFor("the Secret rewritten", async () => {
        const s = await kube.admin.get<KubeObject & { data: Record<string, string> }>(
          kubePaths.secrets(NS, `${inst.podName}-secrets`),
        );
        const values = JSON.parse(Buffer.from(s.data["secrets.json"], "base64").toString()) as Record<
          string,
          unknown
        >;
        return values.API_TOKEN === "rotated" && { s, values };
      });
      assert.deepEqual(secret.values, { API_TOKEN: "rotated", ADDED: { a: 1 } });
      const revision = Number(secret.s.metadata?.annotations?.["callplane.io/secrets-revision"]);
      assert.ok(revision > 1, `the revision is kept with it (${revision})`);
      assert.ok(logs.lines.some((l) => l.msg === "secrets refreshed" && l.pod === inst.podName));
    },
  );

  await t.test("scale 1 → 3 → 1: pods (and their identities) come and go", async () => {
    let r = await call(depPath, { method: "PUT", token: admin, body: deploymentOf(3) });
    assert.equal(r.status, 200, r.text);
    const three = await waitFor("three pods", async () => {
      const l = await listOf(kube, kubePaths.pods(NS));
      return l.length === 3 && l;
    });
    assert.ok(names(three).includes(firstPod!.metadata!.name!), "the first pod stays");
    await waitFor("three identities", async () => {
      const all = await everything(kube);
      return (
        all.sas.length === 3 &&
        all.roles.length === 3 &&
        all.bindings.length === 3 &&
        all.secrets.length === 6
      );
    });
    r = await call(depPath, { method: "PUT", token: admin, body: deploymentOf(1) });
    assert.equal(r.status, 200, r.text);
    await waitFor("one pod and one identity left", async () => {
      const all = await everything(kube);
      return (
        all.pods.length === 1 &&
        all.sas.length === 1 &&
        all.roles.length === 1 &&
        all.bindings.length === 1 &&
        all.secrets.length === 2 &&
        idsOf(all.sas).has(idsOf(all.pods).values().next().value!)
      );
    });
    const rows = await waitFor("one instance reported", async () => {
      const l = (await reported(fn.versionId)).filter((i) => i.status !== "TERMINATED");
      return l.length === 1 && l;
    });
    assert.equal(mine(fn.versionId).length, 1);
    assert.equal(rows[0].instanceId, mine(fn.versionId)[0].instanceId);
    assert.equal(
      logs.lines.filter((l) => l.msg === "pod deleted").length,
      2,
      "one info line per pod deleted",
    );
  });

  await t.test("a pod deleted by hand is reported TERMINATED and replaced", async () => {
    const before = mine(fn.versionId)[0];
    const podName = before.podName;
    const seen = new Set<string>();
    await kube.admin.delete(kubePaths.pods(NS, podName), { gracePeriodSeconds: 0 });
    const replacement = await waitFor("another pod", async () => {
      for (const i of await reported(fn.versionId)) if (i.status === "TERMINATED") seen.add(i.instanceId);
      const l = await listOf(kube, kubePaths.pods(NS));
      return l.length === 1 && l[0].metadata?.name !== podName && l[0];
    });
    assert.notEqual(replacement.metadata?.name, podName);
    await waitFor("the old instance reported TERMINATED", async () => {
      for (const i of await reported(fn.versionId)) if (i.status === "TERMINATED") seen.add(i.instanceId);
      return seen.has(before.instanceId);
    });
    await waitFor("the old pod's identity purged", async () => {
      const all = await everything(kube);
      return (
        !idsOf(all.sas).has(before.instanceId) &&
        !idsOf(all.secrets).has(before.instanceId) &&
        all.sas.length === 1
      );
    });
    assert.ok(before.ended);
    assert.equal(before.status, "TERMINATED");
    assert.match(before.message ?? "", /deleted, not by the agent/);
  });

  await t.test("a pod that Failed (evicted) is reported, deleted by the agent and replaced", async () => {
    const before = mine(fn.versionId)[0];
    await setPodStatus(kube, before.podName, {
      phase: "Failed",
      reason: "Evicted",
      message: "The node was low on resource: memory.",
    });
    const replacement = await waitFor("another pod, and the failed one gone", async () => {
      const l = await listOf(kube, kubePaths.pods(NS));
      return l.length === 1 && l[0].metadata?.name !== before.podName && l[0];
    });
    assert.ok(replacement);
    assert.equal(before.status, "TERMINATED");
    assert.equal(before.message, "the pod failed: Evicted: The node was low on resource: memory.");
    await waitFor(
      "the failed pod's identity purged",
      async () => !idsOf((await everything(kube)).sas).has(before.instanceId),
    );
  });

  await t.test("the agent restarted adopts its pods: no duplicate, no deletion", async () => {
    const rec = recordPods(kube, ctx);
    await rec.synced;
    const before = mine(fn.versionId).map((i) => i.instanceId);
    assert.equal(before.length, 1);
    // its pod runs and is ready (the kubelet's part, played)
    await setPodStatus(kube, `cp-${before[0]}`, {
      phase: "Running",
      podIP: "10.1.2.4",
      conditions: [{ type: "Ready", status: "True", lastTransitionTime: new Date().toISOString() }],
    });
    await waitFor("ACTIVE before the restart", () => mine(fn.versionId)[0]?.status === "ACTIVE");
    const secretVersion = (await kube.admin.get(kubePaths.secrets(NS, `cp-${before[0]}-secrets`))).metadata
      ?.resourceVersion;
    await agent.close();
    // closing leaves the pods: they outlive the agent
    assert.equal((await listOf(kube, kubePaths.pods(NS))).length, 1);
    agent = agentFor(api, kube, tokenFile, logs);
    await agent.listen();
    const adopted = mine(fn.versionId);
    assert.deepEqual(
      adopted.map((i) => i.instanceId),
      before,
    );
    // a few syncs later, still the same pod, and the report names it
    await sleep(1500);
    assert.deepEqual(
      mine(fn.versionId).map((i) => i.instanceId),
      before,
    );
    const row = await waitFor("the adopted instance reported", async () =>
      (await reported(fn.versionId)).find((i) => i.instanceId === before[0] && i.status !== "TERMINATED"),
    );
    assert.equal(row.status, "ACTIVE", "its status comes from its pod");
    assert.equal(row.location, `${NS}/cp-${before[0]} at 10.1.2.4`);
    assert.deepEqual(rec.events, [], "no pod was created or deleted");
    const secret = await kube.admin.get(kubePaths.secrets(NS, `cp-${before[0]}-secrets`));
    assert.equal(
      secret.metadata?.resourceVersion,
      secretVersion,
      "its secrets (same revision) were not rewritten",
    );
    const sa = (await listOf(kube, kubePaths.serviceAccounts(NS)))[0];
    assert.deepEqual(adopted[0].workerAuth, {
      sub: `system:serviceaccount:${NS}:nvcf-worker-cp-${before[0]}`,
      saUid: sa.metadata?.uid,
      workerIdentifiers: [
        { name: `cp-${before[0]}`, uid: (await listOf(kube, kubePaths.pods(NS)))[0].metadata?.uid },
      ],
    });
    rec.stop();
  });

  await t.test(
    "pods adopted beyond what is wanted (scaled down, or undeployed, while the agent was away) are stopped at the first sync",
    async () => {
      const other = await call<{ function: { id: string; versionId: string } }>(
        `${api.url}/v2/nvcf/functions`,
        {
          token: admin,
          body: sampleFunction("undeployed-while-away", { containerImage: "nvcr.io/example/echo:1.0" }),
        },
      );
      const otherPath = `${api.url}/v2/nvcf/deployments/functions/${other.body.function.id}/versions/${other.body.function.versionId}`;
      assert.equal((await call(otherPath, { token: admin, body: deploymentOf(1, CPU) })).status, 200);
      assert.equal((await call(depPath, { method: "PUT", token: admin, body: deploymentOf(2) })).status, 200);
      await waitFor("three pods", async () => (await listOf(kube, kubePaths.pods(NS))).length === 3);
      const keptBefore = mine(fn.versionId).map((i) => i.podName);
      await agent.close();
      assert.equal((await call(otherPath, { method: "DELETE", token: admin })).status, 200);
      assert.equal((await call(depPath, { method: "PUT", token: admin, body: deploymentOf(1) })).status, 200);
      const rec = recordPods(kube, ctx);
      await rec.synced;
      agent = agentFor(api, kube, tokenFile, logs);
      await agent.listen();
      await waitFor("one pod left", async () => (await listOf(kube, kubePaths.pods(NS))).length === 1);
      const left = mine(fn.versionId).map((i) => i.podName);
      assert.equal(left.length, 1);
      assert.ok(keptBefore.includes(left[0]), "the one kept is one of the adopted pods");
      assert.ok(
        rec.events.every((e) => e.type === "DELETED"),
        "no pod was created",
      );
      assert.equal(rec.events.length, 2);
      await waitFor("their identities purged", async () => {
        const all = await everything(kube);
        return all.sas.length === 1 && all.secrets.length === 2 && all.bindings.length === 1;
      });
      rec.stop();
    },
  );

  await t.test(
    "an agent killed after each provisioning step: at its next start no orphan is left",
    async () => {
      await agent.close();
      const kept = await everything(kube);
      // what a dead agent left: the first 1..5 objects of four instances, never their pod
      const fake = mine(fn.versionId)[0]?.deployment ?? first!.deployment;
      const steps = ["serviceAccount", "role", "roleBinding", "workerSecret", "secretsSecret"] as const;
      const paths = {
        serviceAccount: kubePaths.serviceAccounts(NS),
        role: kubePaths.roles(NS),
        roleBinding: kubePaths.roleBindings(NS),
        workerSecret: kubePaths.secrets(NS),
        secretsSecret: kubePaths.secrets(NS),
      };
      const dead: string[] = [];
      for (let n = 1; n <= 5; n++) {
        const id = randomUUID();
        dead.push(id);
        const objs = buildInstanceObjects({
          instanceId: id,
          namespace: NS,
          clusterId: CLUSTER,
          deployment: fake,
          instanceType: A100,
          gpuResource: "nvidia.com/gpu",
          terminationGraceSeconds: 30,
          workerImage: "callplane:test",
          worker: {
            natsUrl: "x",
            region: "x",
            serviceDomain: "x",
            keepAliveSeconds: 1,
            inferenceIdleSeconds: 1,
            ackWaitSeconds: 1,
            streamMaxMessages: 1,
            streamMaxMessageBytes: 1,
            streamReplicas: 1,
            logLevel: "info",
            workerExtraEnv: {},
            natsCaPem: "",
          },
          workerNatsEnv: {},
          secrets: { revision: 0, values: {} },
        });
        for (const step of steps.slice(0, n)) await kube.admin.create(paths[step], objs[step] as KubeObject);
      }
      // another cluster's objects are not this agent's business
      const other = randomUUID();
      await kube.admin.create(kubePaths.serviceAccounts(NS), {
        apiVersion: "v1",
        kind: "ServiceAccount",
        metadata: {
          name: `nvcf-worker-cp-${other}`,
          labels: {
            "app.kubernetes.io/managed-by": "callplane-compute",
            "callplane.io/cluster": "c2",
            "callplane.io/instance-id": other,
          },
        },
      });
      const rec = recordPods(kube, ctx);
      await rec.synced;
      agent = agentFor(api, kube, tokenFile, logs);
      await agent.listen();
      const all = await everything(kube);
      for (const [kind, list] of Object.entries(all))
        for (const id of dead)
          assert.ok(!idsOf(list).has(id), `no ${kind} of the dead agent's instance ${id}`);
      // the running instance kept everything, and nothing new was started
      assert.deepEqual(names(all.pods), names(kept.pods));
      assert.deepEqual(names(all.sas), names(kept.sas));
      assert.deepEqual(names(all.secrets), names(kept.secrets));
      assert.ok(
        (await kube.admin.list(kubePaths.serviceAccounts(NS))).items.some(
          (s) => s.metadata?.name === `nvcf-worker-cp-${other}`,
        ),
        "the other cluster's account stays",
      );
      await sleep(1000);
      assert.deepEqual(rec.events, [], "no pod created or deleted");
      assert.equal(
        logs.lines.filter((l) => l.msg === "removed identity objects an earlier run left without their pod")
          .length,
        5,
      );
      rec.stop();
    },
  );

  await t.test(
    "a RoleBinding the API refuses: no pod, nothing left; once allowed, the instance starts",
    async () => {
      // the agent's Role without create on rolebindings
      const limited = AGENT_RULES.map((r) =>
        r.resources.includes("rolebindings") ? { ...r, resources: ["roles"] } : r,
      );
      limited.push({ apiGroups: [RBAC], resources: ["rolebindings"], verbs: ["list", "patch", "delete"] });
      await kube.admin.patch(kubePaths.roles(NS, "compute-agent"), { rules: limited }, "merge");
      const rec = recordPods(kube, ctx);
      const accounts: Array<{ type: WatchEventType; name: string }> = [];
      const saWatch = watchCollection(
        kube.admin,
        kubePaths.serviceAccounts(NS),
        { labelSelector: SELECTOR },
        {
          onList: () => undefined,
          onEvent: (type, o) => accounts.push({ type, name: o.metadata?.name ?? "" }),
        },
      );
      ctx.after(() => saWatch.stop());
      await Promise.all([rec.synced, saWatch.synced]);
      const cpu = await call<{ function: { id: string; versionId: string } }>(
        `${api.url}/v2/nvcf/functions`,
        {
          token: admin,
          body: sampleFunction("refused-binding", { containerImage: "nvcr.io/example/echo:1.0" }),
        },
      );
      assert.equal(cpu.status, 200, cpu.text);
      const cpuPath = `${api.url}/v2/nvcf/deployments/functions/${cpu.body.function.id}/versions/${cpu.body.function.versionId}`;
      const r = await call(cpuPath, { token: admin, body: deploymentOf(1, CPU) });
      assert.equal(r.status, 200, r.text);
      const errored = await waitFor("the instance reported ERRORED", async () =>
        (await reported(cpu.body.function.versionId)).find((i) => i.status === "ERRORED"),
      );
      assert.match(errored.message ?? "", /creating the roleBinding failed: .*403 Forbidden.*rolebindings/);
      // a retry or two, then allowed again
      await sleep(800);
      assert.equal(rec.events.length, 0, "no pod was ever created");
      await kube.admin.patch(kubePaths.roles(NS, "compute-agent"), { rules: AGENT_RULES }, "merge");
      const active = await waitFor("a pod for the deployment", () => {
        const i = mine(cpu.body.function.versionId)[0];
        return i && rec.events.find((e) => e.type === "ADDED" && e.name === i.podName) && i;
      });
      // every account a failed attempt made was deleted again, and only the last attempt got a pod
      const failed = new Set(
        accounts.filter((a) => a.name !== `nvcf-worker-${active.podName}`).map((a) => a.name),
      );
      assert.ok(failed.size >= 1, "at least one attempt failed");
      for (const name of failed)
        assert.ok(
          accounts.some((a) => a.name === name && a.type === "DELETED"),
          `${name} was removed`,
        );
      assert.deepEqual(
        rec.events.map((e) => e.name),
        [active.podName],
      );
      const all = await everything(kube);
      for (const list of Object.values(all))
        for (const o of list)
          assert.ok(
            !failed.has(`nvcf-worker-cp-${o.metadata?.labels?.[LABELS.instanceId]}`),
            `${o.metadata?.name} is not a failed attempt's`,
          );
      const del = await call(cpuPath, { method: "DELETE", token: admin });
      assert.equal(del.status, 200, del.text);
      saWatch.stop();
      rec.stop();
    },
  );

  await t.test(
    "a pod delete the API refuses is retried: the instance is TERMINATED only once its pod is deleted",
    async () => {
      const f = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
        token: admin,
        body: sampleFunction("refused-delete", { containerImage: "nvcr.io/example/echo:1.0" }),
      });
      const { id, versionId } = f.body.function;
      const path = `${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`;
      assert.equal((await call(path, { token: admin, body: deploymentOf(1, CPU) })).status, 200);
      const inst = await waitFor("its pod", async () => {
        const i = mine(versionId)[0];
        return i && (await listOf(kube, kubePaths.pods(NS))).some((p) => p.metadata?.name === i.podName) && i;
      });
      // the agent's Role without delete on pods
      const noDelete = AGENT_RULES.map((r) =>
        r.resources.includes("pods") ? { ...r, verbs: r.verbs.filter((v) => v !== "delete") } : r,
      );
      await kube.admin.patch(kubePaths.roles(NS, "compute-agent"), { rules: noDelete }, "merge");
      const rec = recordPods(kube, ctx);
      await rec.synced;
      assert.equal((await call(path, { method: "DELETE", token: admin })).status, 200);
      const refused = (l: Record<string, unknown>) =>
        l.msg ===
          "could not delete the pod; retrying (the instance stays tracked until its pod is deleted)" &&
        l.pod === inst.podName;
      await waitFor("two refused deletes", () => logs.lines.filter(refused).length >= 2);
      assert.match(String(logs.lines.find(refused)?.err), /403 Forbidden/);
      assert.notEqual(inst.status, "TERMINATED", "not TERMINATED while its pod runs");
      assert.ok(
        (await listOf(kube, kubePaths.pods(NS))).some((p) => p.metadata?.name === inst.podName),
        "the pod is still there",
      );
      assert.ok(
        !(await reported(versionId)).some(
          (r) => r.instanceId === inst.instanceId && r.status === "TERMINATED",
        ),
        "not reported TERMINATED",
      );
      assert.ok(idsOf((await everything(kube)).sas).has(inst.instanceId), "its identity is kept meanwhile");
      await kube.admin.patch(kubePaths.roles(NS, "compute-agent"), { rules: AGENT_RULES }, "merge");
      await waitFor("the pod deleted once allowed", () =>
        rec.events.some((e) => e.type === "DELETED" && e.name === inst.podName),
      );
      await waitFor("TERMINATED after", () => inst.status === "TERMINATED");
      await waitFor("reported TERMINATED", async () =>
        (await reported(versionId)).some(
          (r) => r.instanceId === inst.instanceId && r.status === "TERMINATED",
        ),
      );
      await waitFor("nothing of it left", async () => {
        const all = await everything(kube);
        return Object.values(all).every((l) => !idsOf(l).has(inst.instanceId));
      });
      rec.stop();
    },
  );

  await t.test("a pod of this cluster's labels that no instance has (made by hand) is deleted", async () => {
    const rec = recordPods(kube, ctx);
    await rec.synced;
    const stray = randomUUID();
    await kube.admin.create(kubePaths.serviceAccounts(NS), {
      apiVersion: "v1",
      kind: "ServiceAccount",
      metadata: { name: "stray", namespace: NS },
    });
    await kube.admin.create(kubePaths.pods(NS), {
      apiVersion: "v1",
      kind: "Pod",
      metadata: {
        name: `cp-${stray}`,
        namespace: NS,
        labels: {
          "app.kubernetes.io/managed-by": "callplane-compute",
          "callplane.io/cluster": CLUSTER,
          "callplane.io/instance-id": stray,
        },
      },
      spec: {
        serviceAccountName: "stray",
        automountServiceAccountToken: false,
        containers: [{ name: "inference", image: "nvcr.io/example/echo:1.0" }],
      },
    });
    await waitFor("the stray pod deleted", () =>
      rec.events.some((e) => e.type === "DELETED" && e.name === `cp-${stray}`),
    );
    assert.ok(
      logs.lines.some(
        (l) =>
          l.msg === "deleted a pod of this cluster's labels that no instance of the agent's has" &&
          l.pod === `cp-${stray}`,
      ),
    );
    assert.ok(!agent.instances().some((i) => i.instanceId === stray), "not adopted");
    await kube.admin.delete(kubePaths.serviceAccounts(NS, "stray"));
    rec.stop();
  });

  await t.test(
    "a deployment of another cluster (its type, or its clusters) is skipped: no pod, no report, logged once",
    async () => {
      // another cluster registers its types, as the compute service
      const put = await call(`${api.url}/v1/internal/clusters/c2/instance-types`, {
        method: "PUT",
        token: api.serviceToken("compute"),
        body: {
          backend: "kubernetes",
          instanceTypes: [
            { name: "h100.x8", gpu: "H100", gpuCount: 8 },
            { name: "a100.x2", gpu: "A100", gpuCount: 2 },
          ],
        },
      });
      assert.equal(put.status, 204, put.text);
      const make = async (name: string, body: Record<string, unknown>) => {
        const f = await call<{ function: { id: string; versionId: string } }>(
          `${api.url}/v2/nvcf/functions`,
          { token: admin, body: sampleFunction(name, { containerImage: "nvcr.io/example/echo:1.0" }) },
        );
        const { id, versionId } = f.body.function;
        const path = `${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`;
        const r = await call<{ deployment: { id?: string; deploymentId?: string } }>(path, {
          token: admin,
          body,
        });
        assert.equal(r.status, 200, r.text);
        return { path, versionId, functionId: id };
      };
      const h100 = await make("elsewhere-type", deploymentOf(1, { name: "h100.x8", gpu: "H100" }));
      const onC2 = await make("elsewhere-cluster", {
        deploymentSpecifications: [{ ...deploymentOf(1).deploymentSpecifications[0], clusters: ["c2"] }],
      });
      const skipped = (fid: string) =>
        logs.lines.filter(
          (l) => l.msg === "deployment skipped: it is another cluster's" && l.function === fid,
        );
      await waitFor(
        "both skipped",
        () => skipped("elsewhere-type").length > 0 && skipped("elsewhere-cluster").length > 0,
      );
      assert.match(
        String(skipped("elsewhere-type")[0].reason),
        /does not offer instance type h100\.x8 with gpu H100/,
      );
      assert.match(String(skipped("elsewhere-cluster")[0].reason), /names clusters c2, not this one \(c1\)/);
      // a few syncs later: still no pod, no instance, nothing reported, one log line each
      await sleep(1200);
      for (const d of [h100, onC2]) {
        assert.equal(mine(d.versionId).length, 0);
        assert.deepEqual(await reported(d.versionId), []);
        assert.ok(
          !(await kube.admin.list(kubePaths.pods(NS))).items.some(
            (p) => p.metadata?.labels?.["function-id"] === d.functionId,
          ),
          "no pod here",
        );
      }
      assert.equal(skipped("elsewhere-type").length, 1);
      assert.equal(skipped("elsewhere-cluster").length, 1);
      for (const d of [h100, onC2])
        assert.equal((await call(d.path, { method: "DELETE", token: admin })).status, 200);
    },
  );

  await t.test(
    "a function on port 8080 gets a worker health port that is not 8080; quoted containerArgs stay one argument",
    async () => {
      const f = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
        token: admin,
        body: sampleFunction("on-8080", {
          containerImage: "nvcr.io/example/echo:1.0",
          inferencePort: 8080,
          health: { protocol: "HTTP", uri: "/health", port: 8081, timeout: "PT10S", expectedStatusCode: 200 },
          containerArgs: `--greeting "hello world" 'it''s' a\\ b "q\\"uote" '$HOME' ""`,
        }),
      });
      assert.equal(f.status, 200, f.text);
      const { id, versionId } = f.body.function;
      const path = `${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`;
      assert.equal((await call(path, { token: admin, body: deploymentOf(1, CPU) })).status, 200);
      const pod = (await waitFor("its pod", async () =>
        (await kube.admin.list(kubePaths.pods(NS))).items.find(
          (p) => p.metadata?.labels?.["function-id"] === id,
        ),
      )) as IPod & KubeObject;
      const worker = pod.spec!.containers.find((c) => c.name === "worker")!;
      const inference = pod.spec!.containers.find((c) => c.name === "inference")!;
      const healthPort = worker.env?.find((e) => e.name === "HEALTH_PORT")?.value;
      assert.equal(healthPort, "8082", "neither the inference port (8080) nor the health port (8081)");
      assert.equal(worker.readinessProbe?.httpGet?.port, 8082);
      assert.equal(worker.livenessProbe?.httpGet?.port, 8082);
      assert.deepEqual(inference.args, ["--greeting", "hello world", "its", "a b", 'q"uote', "$$HOME", ""]);
      assert.equal((await call(path, { method: "DELETE", token: admin })).status, 200);
      await waitFor(
        "its pod gone",
        async () =>
          !(await kube.admin.list(kubePaths.pods(NS))).items.some(
            (p) => p.metadata?.labels?.["function-id"] === id,
          ),
      );
    },
  );

  await t.test("a deployment deleted: its pods and identity objects are gone", async () => {
    const del = await call(depPath, { method: "DELETE", token: admin });
    assert.equal(del.status, 200, del.text);
    await waitFor("nothing of the backend's left", async () => {
      const all = await everything(kube);
      return Object.values(all).every((l) => l.length === 0);
    });
    await waitFor("no instance left", () => agent.instances().length === 0);
  });

  await t.test(
    "a pod no node takes is ERRORED once unschedulableSeconds have passed, with no event to tell",
    async () => {
      await agent.close();
      agent = agentFor(api, kube, tokenFile, logs, { unschedulableSeconds: 1 });
      await agent.listen();
      const f = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
        token: admin,
        body: sampleFunction("no-node", { containerImage: "nvcr.io/example/echo:1.0" }),
      });
      const path = `${api.url}/v2/nvcf/deployments/functions/${f.body.function.id}/versions/${f.body.function.versionId}`;
      assert.equal((await call(path, { token: admin, body: deploymentOf(1, CPU) })).status, 200);
      const row = await waitFor("ERRORED", async () =>
        (await reported(f.body.function.versionId)).find((i) => i.status === "ERRORED"),
      );
      assert.match(
        row.message ?? "",
        /^unschedulable for \d+s: no node was assigned to it \(is a scheduler running\?\)$/,
      );
      assert.equal((await call(path, { method: "DELETE", token: admin })).status, 200);
      await waitFor("its pod gone", async () => (await listOf(kube, kubePaths.pods(NS))).length === 0);
    },
  );

  await t.test(
    "a pod that takes its grace to go holds nothing up: its stop waits (bounded), other deployments go on",
    async () => {
      await agent.close();
      agent = agentFor(api, kube, tokenFile, logs, { terminationGraceSeconds: 1, deleteWaitMs: 3000 });
      await agent.listen();
      const make = async (name: string) => {
        const f = await call<{ function: { id: string; versionId: string } }>(
          `${api.url}/v2/nvcf/functions`,
          {
            token: admin,
            body: sampleFunction(name, { containerImage: "nvcr.io/example/echo:1.0" }),
          },
        );
        const { id, versionId } = f.body.function;
        const path = `${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`;
        assert.equal((await call(path, { token: admin, body: deploymentOf(1, CPU) })).status, 200);
        const inst = await waitFor(`${name}'s pod`, async () => {
          const i = mine(versionId)[0];
          return (
            i && (await listOf(kube, kubePaths.pods(NS))).some((p) => p.metadata?.name === i.podName) && i
          );
        });
        return { path, versionId, inst };
      };
      const slow = await make("slow-to-go");
      // a node took it (the scheduler's part): a bound pod goes only when its kubelet (none here) says so
      await kube.admin.create(`${kubePaths.pods(NS, slow.inst.podName)}/binding`, {
        apiVersion: "v1",
        kind: "Binding",
        metadata: { name: slow.inst.podName },
        target: { apiVersion: "v1", kind: "Node", name: "node-a" },
      });
      assert.equal((await call(slow.path, { method: "DELETE", token: admin })).status, 200);
      await waitFor(
        "its deletion under way",
        async () => (await kube.admin.get(kubePaths.pods(NS, slow.inst.podName))).metadata?.deletionTimestamp,
      );
      const quick = await make("quick");
      assert.notEqual(
        slow.inst.status,
        "TERMINATED",
        "the other deployment got its pod while the first one's stop waited",
      );
      await waitFor(
        "the slow instance TERMINATED after the bound",
        () => slow.inst.status === "TERMINATED",
        15_000,
      );
      assert.ok(
        logs.lines.some(
          (l) =>
            l.msg === "the pod is still terminating; purging its identity all the same" &&
            l.pod === slow.inst.podName,
        ),
      );
      const left = await everything(kube);
      assert.ok(idsOf(left.pods).has(slow.inst.instanceId), "the pod is still terminating (no kubelet)");
      for (const list of [left.sas, left.roles, left.bindings, left.secrets])
        assert.ok(!idsOf(list).has(slow.inst.instanceId), "its identity is purged");
      await kube.admin.delete(kubePaths.pods(NS, slow.inst.podName), { gracePeriodSeconds: 0 });
      assert.equal((await call(quick.path, { method: "DELETE", token: admin })).status, 200);
      await waitFor("nothing left", async () =>
        Object.values(await everything(kube)).every((l) => l.length === 0),
      );
    },
  );

  await t.test("an agent that may not list pods fails its start and says why", async () => {
    await agent.close();
    await kube.admin.create(kubePaths.serviceAccounts(CONTROL_NS), {
      apiVersion: "v1",
      kind: "ServiceAccount",
      metadata: { name: "nobody", namespace: CONTROL_NS },
    });
    const nobody = kube.writeTokenFile(await kube.tokenFor(CONTROL_NS, "nobody"));
    agent = agentFor(api, kube, nobody, logs);
    await assert.rejects(agent.listen(), /cannot list the pods in callplane-workers: .*403 Forbidden/);
  });

  await t.test("instance types are found on the nodes' GPU labels, and follow them", async () => {
    await agent.close();
    const found = (agent = agentFor(api, kube, tokenFile, logs, { instanceTypes: [] }));
    await found.listen();
    const backend = found.backend as KubernetesBackend;
    assert.deepEqual(backend.instanceTypes, []);
    const node = (name: string, product: string, count: string) =>
      kube.admin.create(kubePaths.nodes(), {
        apiVersion: "v1",
        kind: "Node",
        metadata: { name, labels: { "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": count } },
      });
    await node("gpu-1", "NVIDIA-A100-SXM4-80GB", "8");
    await node("gpu-2", "NVIDIA-A100-SXM4-80GB", "8");
    await node("gpu-3", "NVIDIA-L40S", "2");
    await kube.admin.create(kubePaths.nodes(), {
      apiVersion: "v1",
      kind: "Node",
      metadata: { name: "cpu-1" },
    });
    await waitFor("two types found", () => backend.instanceTypes.length === 2);
    assert.deepEqual(backend.instanceTypes, [
      {
        name: "nvidia-a100-sxm4-80gb.x8",
        gpu: "NVIDIA-A100-SXM4-80GB",
        gpuCount: 8,
        nodeSelector: { "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8" },
      },
      {
        name: "nvidia-l40s.x2",
        gpu: "NVIDIA-L40S",
        gpuCount: 2,
        nodeSelector: { "nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.count": "2" },
      },
    ]);
    await kube.admin.delete(kubePaths.nodes("gpu-3"));
    await waitFor("the L40S type gone with its node", () => backend.instanceTypes.length === 1);
    await waitFor("the change registered", () => found.instanceTypes.registered?.length === 1);
    assert.equal(found.instanceTypes.registered?.[0].name, "nvidia-a100-sxm4-80gb.x8");
    // a deployment naming a found type gets a pod with affinity on its labels
    const gpu = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction("found-type", { containerImage: "nvcr.io/example/echo:1.0" }),
    });
    const gpuPath = `${api.url}/v2/nvcf/deployments/functions/${gpu.body.function.id}/versions/${gpu.body.function.versionId}`;
    const r = await call(gpuPath, {
      token: admin,
      body: deploymentOf(1, { name: "nvidia-a100-sxm4-80gb.x8", gpu: "NVIDIA-A100-SXM4-80GB" }),
    });
    assert.equal(r.status, 200, r.text);
    const pod = (await waitFor("its pod", async () => (await listOf(kube, kubePaths.pods(NS)))[0])) as IPod &
      KubeObject;
    assert.deepEqual(pod.spec?.containers[0].resources?.limits, { "nvidia.com/gpu": "8" });
    assert.deepEqual(
      pod.spec?.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms?.[0].matchExpressions?.map(
        (e) => `${e.key}=${e.values?.join()}`,
      ),
      ["nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count=8"],
    );
    const del = await call(gpuPath, { method: "DELETE", token: admin });
    assert.equal(del.status, 200, del.text);
    await waitFor("its pod gone", async () => (await listOf(kube, kubePaths.pods(NS))).length === 0);
    await agent.close();
  });
});

test("the Role and ClusterRole `callplane render` gives the agent hold every verb the backend uses", () => {
  const covers = (
    rendered: readonly {
      apiGroups: readonly string[];
      resources: readonly string[];
      verbs: readonly string[];
    }[],
    used: typeof AGENT_RULES,
  ) => {
    for (const rule of used)
      for (const group of rule.apiGroups)
        for (const resource of rule.resources)
          for (const verb of rule.verbs)
            assert.ok(
              rendered.some(
                (r) =>
                  r.apiGroups.includes(group) && r.resources.includes(resource) && r.verbs.includes(verb),
              ),
              `the rendered rules allow ${verb} on ${group || "core"}/${resource}`,
            );
  };
  covers(COMPUTE_AGENT_RULES, AGENT_RULES);
  covers(COMPUTE_AGENT_CLUSTER_RULES, NODE_RULES);
});

test("with the cluster's garbage collector running, a pod's identity objects go with it, no agent needed", async (t) => {
  const ctx = lifo(t);
  const kube = await startKubeApiServer(ctx, { controllerManager: true });
  const tokenFile = await agentAccount(kube);
  const api = await startApi(ctx, { workerAuth: "token", clusterId: CLUSTER, computeBackend: "kubernetes" });
  const admin = await api.adminToken();
  const logs = captureLogs();
  const agent = agentFor(api, kube, tokenFile, logs);
  ctx.after(() => agent.destroy());
  await agent.listen();
  await waitFor("the registration", () => agent.instanceTypes.registered);
  const f = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
    token: admin,
    body: sampleFunction("collected", { containerImage: "nvcr.io/example/echo:1.0" }),
  });
  const { id, versionId } = f.body.function;
  const r = await call(`${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`, {
    token: admin,
    body: deploymentOf(1, CPU),
  });
  assert.equal(r.status, 200, r.text);
  const inst = await waitFor("the instance", () => agent.instances()[0]);
  await waitFor("its identity objects owned by its pod", async () => {
    const all = await everything(kube);
    const mine = [...all.sas, ...all.roles, ...all.bindings, ...all.secrets];
    return mine.length === 5 && mine.every((o) => o.metadata?.ownerReferences?.[0]?.name === inst.podName);
  });
  // the agent goes (its pods stay), then someone deletes the pod: nothing of the agent's runs
  await agent.close();
  await kube.admin.delete(kubePaths.pods(NS, inst.podName), { gracePeriodSeconds: 0 });
  await waitFor("the garbage collector removed the account, role, binding and Secrets", async () =>
    Object.values(await everything(kube)).every((l) => l.length === 0),
  );
});
