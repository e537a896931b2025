// Functions on Kubernetes, end to end: a real kube-apiserver 1.20.2 with etcd
// (testkit/kube-apiserver.ts), what `callplane render` writes for the agent applied to it (its Role
// and ClusterRole, the admission webhook's registration, called for real by the API server), the
// compute agent as a child process started from its environment file settings (compute.backend
// kubernetes, its token a TokenRequest for its own service account), NATS, the API, an invocation
// replica and a grpc-proxy replica as child processes. The one part played is the kubelet
// (testkit/test-kubelet.ts): it binds the pods to its node, requests each pod's projected token
// bound to the pod, and runs the pods' containers as local processes on their own loopback address
// (the function's image mapped to the example servers, the callplane image to the worker).
//
// Proved: the agent registers its instance types; an HTTP function and a gRPC function deployed on
// an instance type with a GPU run as pods of the contract (their own service account, the token
// projected into the worker only, the GPU requested) and answer invocations through the plane; the
// API shows each instance ACTIVE with the pod's WorkerAuth; undeploying removes pod, account, role,
// binding and Secrets. Worker auth is the default token mode: the cluster is enrolled with
// `callplane cluster enroll`, each worker logs in to NATS with its pod's projected token (no shared
// key anywhere in the pod), and the API server's signing key is rotated while the workers run: the
// agent pushes the new key set with its own token as proof, the pods' tokens are renewed with the new
// key, every worker is made to log in again, and none is refused.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import type { IPod } from "kubernetes-models/v1";
import { kubePaths, type KubeObject } from "../../src/lib/kube/index.js";
import { createLogger } from "../../src/lib/log.js";
import { closeConnections, connectNats } from "../../src/lib/nats/index.js";
import { call, waitFor } from "../testkit/client.js";
import { GRPC_FUNCTION, echoMessage, grpcClient, meta, unary } from "../testkit/grpc.js";
import { distRoot, repoRoot, runCli, startApi, startNats, tmpDir } from "../testkit/index.js";
import { startKubeApiServer } from "../testkit/kube-apiserver.js";
import {
  AGENT_ACCOUNT,
  CONTROL_NS,
  WORKERS_NS,
  applyRenderedSetup,
  startTestWebhook,
} from "../testkit/kube-setup.js";
import { startCallout } from "../testkit/trust.js";
import { reverseScope, scripts, startService } from "../testkit/processes.js";
import { startTestKubelet, type ContainerContext } from "../testkit/test-kubelet.js";

const CLUSTER = "e2e";
const INSTANCE_TYPE = { name: "a100.x1", gpu: "A100", gpuCount: 1 };
const POD_NETWORK = "127.0.176.0/24";
const MANAGED = "app.kubernetes.io/managed-by=callplane-compute";

interface InstanceDto {
  instanceId: string;
  instanceStatus: string;
  location: string;
  message?: string;
  workerAuth?: { sub: string; serviceAccountUid: string; pods: Array<{ name: string; uid: string }> };
}

const exampleServer =
  (script: string) =>
  (c: ContainerContext): { command: string; args: string[] } => ({
    command: process.execPath,
    args: [join(distRoot, "examples", script), "--listen", `${c.podIP}:${c.env.INFERENCE_PORT}`],
  });

function jwtPayload(token: string): Record<string, unknown> {
  return JSON.parse(Buffer.from(token.split(".")[1], "base64url").toString()) as Record<string, unknown>;
}

test(
  "functions on Kubernetes: deployed as pods on a real kube-apiserver (the kubelet played), they answer HTTP and gRPC invocations through the plane",
  { timeout: 420_000 },
  async (t) => {
    const scope = reverseScope(t);
    const k = await startKubeApiServer(scope);

    // the admission webhook in this process, registered as rendered
    const webhook = await startTestWebhook(scope);
    const setup = await applyRenderedSetup(k, { webhook });
    const dir = tmpDir(scope, "callplane-k8s-e2e-");

    const kubelet = await startTestKubelet(scope, {
      client: k.node,
      scheduler: k.scheduler,
      namespace: WORKERS_NS,
      nodeLabels: { "nvidia.com/gpu.product": "A100", "nvidia.com/gpu.count": "4" },
      podNetwork: POD_NETWORK,
      repoRoot,
      images: {
        "local/echo": exampleServer("inference-server.js"),
        "local/grpc-echo": exampleServer("grpc-server.js"),
      },
    });

    const nats = await startNats(scope);
    const api = await startApi(scope, {
      nats,
      computeBackend: "kubernetes",
      clusterId: CLUSTER,
      workerAuth: "token",
    });
    const callout = await startCallout(scope, nats, api, "token");
    const admin = await api.adminToken();

    // an admin enrolls the cluster, as an operator does: its issuer and the keys it publishes
    const jwksRes = await k.admin.send("GET", "/openid/v1/jwks", { accept: "application/jwk-set+json" });
    const jwksFile = join(dir, "jwks.json");
    writeFileSync(jwksFile, await jwksRes.body.text());
    const enrolled = await runCli(
      [
        "cluster",
        "enroll",
        CLUSTER,
        "--service-account-issuer",
        k.issuer,
        "--jwks",
        jwksFile,
        "--api",
        api.url,
      ],
      { env: { CALLPLANE_TOKEN: admin } },
    );
    assert.equal(enrolled.code, 0, enrolled.stderr + enrolled.stdout);
    assert.match(enrolled.stdout, /Cluster e2e enrolled/);
    // the agent's own projected token (the rendered pod mounts it): its proof when it pushes keys
    const agentIdentity = () =>
      k.tokenFor(CONTROL_NS, AGENT_ACCOUNT, { audiences: [`nvcf-icms:${CLUSTER}`], expirationSeconds: 3600 });
    const agentIdentityFile = k.writeTokenFile(await agentIdentity());
    const serviceEnv = {
      CALLPLANE__GLOBAL__DATA_DIR: dir,
      CALLPLANE__GLOBAL__REGION: "test",
      CALLPLANE__LOG__LEVEL: "info",
      ...nats.serviceEnv(),
      CALLPLANE__API__URL: api.url,
      CALLPLANE__AUTH__SERVICE_TOKEN_DIR: api.serviceTokenDir,
      // workers call the replicas back at their pod addresses; the proxy has its own tests
      CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "false",
    };
    const agent = await startService(
      scope,
      "compute",
      join(distRoot, "src", "services", "compute", "main.js"),
      {
        ...serviceEnv,
        CALLPLANE__COMPUTE__LISTEN: "127.0.0.1:0",
        CALLPLANE__COMPUTE__SYNC_INTERVAL_SECONDS: "0.5",
        CALLPLANE__COMPUTE__BACKEND: "kubernetes",
        CALLPLANE__COMPUTE__KUBERNETES__API_SERVER: k.url,
        CALLPLANE__COMPUTE__KUBERNETES__CA_FILE: k.caFile,
        CALLPLANE__COMPUTE__KUBERNETES__TOKEN_FILE: setup.agentTokenFile,
        CALLPLANE__COMPUTE__KUBERNETES__IDENTITY_TOKEN_FILE: agentIdentityFile,
        CALLPLANE__COMPUTE__KUBERNETES__KEYS_REFRESH_SECONDS: "1",
        CALLPLANE__COMPUTE__KUBERNETES__TERMINATION_GRACE_SECONDS: "5",
        CALLPLANE__COMPUTE__KUBERNETES__INSTANCE_TYPES: JSON.stringify([
          { ...INSTANCE_TYPE, nodeSelector: { "nvidia.com/gpu.product": "A100" } },
        ]),
        CALLPLANE__COMPUTE__WORKER_IDENTITY__CLUSTER_ID: CLUSTER,
        CALLPLANE__KUBERNETES__IMAGE: "registry.example/callplane:test",
        CALLPLANE__KUBERNETES__WORKER_NAMESPACE: WORKERS_NS,
      },
      { readyTimeoutMs: 60_000 },
    );
    const invocation = await startService(scope, "invocation", scripts.invocation, {
      ...serviceEnv,
      POD_IP: "127.0.0.1",
      CALLPLANE__INVOCATION__PORT: "0",
    });
    const grpcProxy = await startService(scope, "grpc-proxy", scripts.grpcProxy, {
      ...serviceEnv,
      POD_IP: "127.0.0.1",
      CALLPLANE__GRPCPROXY__PORT: "0",
      CALLPLANE__GRPCPROXY__CONNECT_PORT: "0",
    });
    const output = () =>
      `--- compute ---\n${agent.output()}\n--- kubelet pods ---\n${JSON.stringify(kubelet.pods(), null, 1)}`;

    // the agent registered the cluster's instance types: a deployment may name one
    await waitFor(
      "the agent's instance types at the API",
      async () => {
        const r = await call<{
          clusterGroups: Array<{
            id: string;
            gpus: Array<{ name: string; instanceTypes: Array<{ name: string }> }>;
          }>;
        }>(`${api.url}/v2/nvcf/clusterGroups`, { token: admin });
        const g = r.body.clusterGroups?.find((x) => x.id === CLUSTER);
        return g?.gpus.some(
          (x) => x.name === "A100" && x.instanceTypes.some((i) => i.name === INSTANCE_TYPE.name),
        );
      },
      { timeoutMs: 60_000 },
    );

    const deploy = async (name: string, fields: Record<string, unknown>) => {
      const created = await call<{ function: { id: string; versionId: string } }>(
        `${api.url}/v2/nvcf/functions`,
        {
          token: admin,
          body: {
            name,
            inferenceUrl: "/echo",
            containerImage: "local/echo",
            health: { uri: "/health" },
            ...fields,
          },
        },
      );
      assert.equal(created.status, 200, created.text);
      const { id, versionId } = created.body.function;
      const path = `${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`;
      const dep = await call(path, {
        token: admin,
        body: {
          deploymentSpecifications: [
            {
              gpu: INSTANCE_TYPE.gpu,
              instanceType: INSTANCE_TYPE.name,
              minInstances: 1,
              maxInstances: 1,
              maxRequestConcurrency: 8,
            },
          ],
        },
      });
      assert.equal(dep.status, 200, dep.text);
      return { functionId: id, versionId, path };
    };
    const active = (path: string) =>
      waitFor(
        "the instance ACTIVE",
        async () => {
          const r = await call<{ deployment: { instances: InstanceDto[] } }>(path, { token: admin });
          const i = r.body.deployment?.instances?.find((x) => x.instanceStatus === "ACTIVE");
          return i;
        },
        { timeoutMs: 180_000, intervalMs: 500, onTimeout: output },
      );
    const key = await call<{ value: string }>(`${api.url}/v1/keys`, {
      token: admin,
      body: { description: "e2e" },
    });
    assert.equal(key.status, 200, key.text);
    const apiKey = key.body.value;

    const http = await deploy(`k8s-http-${randomBytes(3).toString("hex")}`, {});
    const grpc = await deploy(`k8s-grpc-${randomBytes(3).toString("hex")}`, GRPC_FUNCTION);
    const httpInstance = await active(http.path);
    await active(grpc.path);

    await t.test(
      "each instance is a pod of the contract, with its own identity and the GPU requested",
      async () => {
        const pods = await k.admin.list<IPod & KubeObject>(kubePaths.pods(WORKERS_NS), {
          query: { labelSelector: `${MANAGED},function-id=${http.functionId}` },
        });
        assert.equal(pods.items.length, 1, "one pod for one instance");
        const pod = pods.items[0];
        const name = pod.metadata!.name!;
        const spec = pod.spec!;
        assert.equal(pod.metadata?.labels?.["callplane.io/instance-id"], httpInstance.instanceId);
        assert.equal(spec.serviceAccountName, `nvcf-worker-${name}`);
        assert.equal(spec.automountServiceAccountToken, false);
        const inference = spec.containers.find((c) => c.name === "inference");
        const worker = spec.containers.find((c) => c.name === "worker");
        assert.ok(inference && worker, "the inference and worker containers");
        assert.equal(String(inference.resources?.limits?.["nvidia.com/gpu"]), "1");
        assert.equal(String(inference.resources?.requests?.["nvidia.com/gpu"]), "1");
        // the token is the worker's alone
        const mounts = (c: { volumeMounts?: Array<{ mountPath: string }> }) =>
          (c.volumeMounts ?? []).map((m) => m.mountPath);
        assert.ok(mounts(worker).includes("/var/run/secrets/tokens"), "the worker mounts its token");
        assert.ok(
          !mounts(inference).includes("/var/run/secrets/tokens"),
          "the function's own code holds no worker token",
        );
        // the kubelet's TokenRequest: bound to this pod, for this cluster
        const played = kubelet.pods().find((p) => p.name === name);
        assert.ok(played, output());
        const token = readFileSync(join(played.dir, "volumes", "nvcf-worker-token", "token"), "utf8");
        const claims = jwtPayload(token) as {
          aud: string[];
          sub: string;
          "kubernetes.io": { pod: { uid: string } };
        };
        assert.deepEqual(claims.aud, [`nvcf-icms:${CLUSTER}`]);
        assert.equal(claims.sub, `system:serviceaccount:${WORKERS_NS}:nvcf-worker-${name}`);
        assert.equal(claims["kubernetes.io"].pod.uid, pod.metadata.uid);
        // and the API holds the pod's WorkerAuth for this instance
        assert.equal(httpInstance.workerAuth?.sub, claims.sub);
        assert.deepEqual(httpInstance.workerAuth?.pods, [{ name, uid: pod.metadata.uid }]);
        const sa = await k.admin.get(kubePaths.serviceAccounts(WORKERS_NS, `nvcf-worker-${name}`));
        assert.equal(httpInstance.workerAuth?.serviceAccountUid, sa.metadata?.uid);
      },
    );

    await t.test("an HTTP invocation through the plane reaches the function's pod", async () => {
      const body = `hello from ${randomBytes(6).toString("hex")}`;
      const res = await fetch(`${invocation.urls.invocation}/v2/nvcf/pexec/functions/${http.functionId}`, {
        method: "POST",
        headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/octet-stream" },
        body,
      });
      const text = await res.text();
      assert.equal(res.status, 200, `${text}\n${output()}`);
      assert.equal(text, body);
    });

    await t.test("a gRPC invocation through the plane reaches the function's pod", async () => {
      const client = grpcClient(scope, new URL(grpcProxy.urls.grpc).host);
      const payload = `grpc ${randomBytes(6).toString("hex")}`;
      const r = await unary(
        client,
        echoMessage(payload),
        meta({ functionId: grpc.functionId, versionId: grpc.versionId, apiKey }),
        {
          deadline: Date.now() + 60_000,
        },
      );
      assert.equal(r.err, null, `${r.err?.details}\n${output()}`);
      assert.equal(Buffer.from(r.value!.payload).toString(), payload);
    });

    const workerLogins = () =>
      callout
        .log()
        .filter(
          (l) =>
            l.msg === "Authentication successful" &&
            typeof l.user === "string" &&
            l.user.startsWith("worker-"),
        );
    // nobody else logs in through the callout here: any refusal is a worker's
    const refusals = () =>
      callout.log().filter((l) => l.msg === "Authentication denied" || l.msg === "Authentication failed");
    const invokeBoth = async (what: string) => {
      const body = `${what} ${randomBytes(6).toString("hex")}`;
      const res = await fetch(`${invocation.urls.invocation}/v2/nvcf/pexec/functions/${http.functionId}`, {
        method: "POST",
        headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/octet-stream" },
        body,
      });
      assert.equal(res.status, 200, `${await res.clone().text()}\n${output()}`);
      assert.equal(await res.text(), body);
      const client = grpcClient(scope, new URL(grpcProxy.urls.grpc).host);
      const r = await unary(
        client,
        echoMessage(body),
        meta({ functionId: grpc.functionId, versionId: grpc.versionId, apiKey }),
        { deadline: Date.now() + 60_000 },
      );
      assert.equal(r.err, null, `${r.err?.details}\n${output()}`);
    };

    await t.test("each worker's only credential is its pod's token, which the plane verified", async () => {
      for (const s of (
        await k.admin.list(kubePaths.secrets(WORKERS_NS), { query: { labelSelector: MANAGED } })
      ).items as Array<KubeObject & { data?: Record<string, string> }>)
        assert.ok(!("NKEY_SEED" in (s.data ?? {})), `no shared key in ${s.metadata?.name}`);
      const users = new Set(workerLogins().map((l) => String(l.user)));
      assert.ok(
        users.has(`worker-${http.versionId}.${httpInstance.instanceId}`),
        `the HTTP worker logged in as itself: ${[...users].join(", ")}`,
      );
      assert.deepEqual(refusals(), []);
    });

    await t.test(
      "the API server's signing key rotated while the workers run: the agent pushes the new keys, workers log in again with new tokens, none is refused",
      async () => {
        const before = (await api.store.clusterKeys(CLUSTER))!.jwks.keys.map((x) => x.kid);
        const kid = await k.rotateServiceAccountKey();
        assert.ok(!before.includes(kid));
        // the kubelet renews the agent's token with the new key (so it proves with its previous one)
        writeFileSync(agentIdentityFile, await agentIdentity());
        await waitFor(
          "the new key registered by the agent",
          async () => (await api.store.clusterKeys(CLUSTER))?.jwks.keys.some((x) => x.kid === kid),
          { timeoutMs: 60_000, onTimeout: output },
        );
        const rec = (await api.store.clusterKeys(CLUSTER))!;
        assert.match(
          rec.updatedBy,
          new RegExp(`^agent:system:serviceaccount:${CONTROL_NS}:${AGENT_ACCOUNT}$`),
        );
        assert.ok(
          before.every((b) => rec.jwks.keys.some((x) => x.kid === b)),
          "the old key stays while published",
        );
        // the workers' token files now hold tokens of the new key; every worker logs in again with one
        await kubelet.renewTokens();
        const logins = workerLogins().length;
        const sys = await connectNats(
          nats.access("api-revoker"),
          "e2e-kick",
          createLogger("test", { level: "silent" }),
        );
        const kicked = await closeConnections(sys, (u) => u.startsWith("worker-"), { servers: nats.servers });
        await sys.close();
        assert.ok(kicked.closed >= 2, `both workers' connections closed (${kicked.closed})`);
        await waitFor("both workers logged in again", () => workerLogins().length >= logins + 2, {
          timeoutMs: 60_000,
          onTimeout: () => `${JSON.stringify(callout.log().slice(-20))}\n${output()}`,
        });
        assert.deepEqual(refusals(), [], "no worker was refused");
        await invokeBoth("after rotation");
      },
    );

    await t.test("undeploying removes the pod and its account, role, binding and Secrets", async () => {
      const del = await call(http.path, { method: "DELETE", token: admin });
      assert.ok(del.status < 300, del.text);
      const selector = `${MANAGED},function-id=${http.functionId}`;
      await waitFor(
        "the pod gone",
        async () =>
          (await k.admin.list(kubePaths.pods(WORKERS_NS), { query: { labelSelector: selector } })).items
            .length === 0,
        { timeoutMs: 60_000, onTimeout: output },
      );
      const leftover = async () => {
        const left: string[] = [];
        for (const path of [
          kubePaths.serviceAccounts(WORKERS_NS),
          kubePaths.roles(WORKERS_NS),
          kubePaths.roleBindings(WORKERS_NS),
          kubePaths.secrets(WORKERS_NS),
        ])
          for (const o of (await k.admin.list(path, { query: { labelSelector: MANAGED } })).items)
            if (o.metadata?.labels?.["callplane.io/instance-id"] === httpInstance.instanceId)
              left.push(`${path}/${o.metadata?.name}`);
        return left;
      };
      await waitFor("no identity object left", async () => (await leftover()).length === 0, {
        timeoutMs: 60_000,
        onTimeout: async () => JSON.stringify(await leftover()),
      });
    });
  },
);
