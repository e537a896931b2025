// Benchmark: the kubernetes compute backend at scale, against a real kube-apiserver 1.20.2 with
// etcd (the testkit's) and no kubelet (pods stay Pending: what is measured is the agent and the API
// server, not containers). One deployment of N instances (1,000 by default) on a CPU-only
// instance type; the agent runs as a child process with the rendered Role's permissions and the
// rendered admission webhook registered (called for every pod and identity object, as in a
// cluster). Measured:
//   - provisioning: the time until all N pods exist (each with its account, role, binding and two
//     Secrets first), the agent's API requests per pod (counted by the API server itself, its
//     apiserver_request_total, less this benchmark's own polling), the agent's peak RSS;
//   - adoption: the agent stopped and started again with the N pods present: the time until its
//     first report to the control plane holds all N, and that no pod was created or deleted (every
//     pod's uid the same before and after).
// Baseline in the same run: the API server alone creating N bare pods (one POST each, 16 at a
// time, from this process): what the cluster costs without callplane's identity objects.
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { kubePaths, type KubeClient } from "../src/lib/kube/index.js";
import { call } from "../test/testkit/client.js";
import { distRoot, startApi, startNats, tmpDir } from "../test/testkit/index.js";
import { startKubeApiServer } from "../test/testkit/kube-apiserver.js";
import { WORKERS_NS, applyRenderedSetup, startTestWebhook } from "../test/testkit/kube-setup.js";
import { Scope, startService, type ChildHandle } from "../test/testkit/processes.js";
import { machine } from "./harness.js";

export interface KubernetesBenchOptions {
  instances: number;
}

const CLUSTER = "bench";
const TYPE = { name: "cpu.small", gpu: "CPU", gpuCount: 0 };
const MANAGED = "app.kubernetes.io/managed-by=callplane-compute";

/**
 * How many objects a collection holds: without a selector in one cheap request (a list of one item
 * carries the rest's count), with one by listing them (the API server counts no selected rest).
 */
async function count(client: KubeClient, path: string, labelSelector?: string): Promise<number> {
  if (labelSelector) return (await client.list(path, { query: { labelSelector } })).items.length;
  const l = await client.list(path, { query: { limit: 1 } });
  return l.items.length + Number((l.metadata as { remainingItemCount?: number }).remainingItemCount ?? 0);
}

const say = (what: string) => console.error(`[bench kubernetes] ${what}`);

/** apiserver_request_total summed over everything but WATCH (one long request each). */
async function apiRequests(client: KubeClient): Promise<number> {
  const res = await client.send("GET", "/metrics");
  const text = await res.body.text();
  let n = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith("apiserver_request_total{")) continue;
    if (/verb="(WATCH|CONNECT)"/.test(line)) continue;
    n += Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return n;
}

function peakRssMiB(pid: number): number {
  const m = /^VmHWM:\s+(\d+)\s+kB$/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Math.round(Number(m[1]) / 1024) : NaN;
}

export async function benchKubernetes(o: KubernetesBenchOptions): Promise<Record<string, unknown>> {
  const scope = new Scope();
  try {
    const k = await startKubeApiServer(scope);
    const webhook = await startTestWebhook(scope);
    const setup = await applyRenderedSetup(k, { webhook });
    const dir = tmpDir(scope, "callplane-bench-k8s-");

    // the baseline: N bare pods, straight to the API server, 16 at a time
    await k.createNamespace("bench-baseline");
    await k.createServiceAccount("bench-baseline", "plain");
    const bareStart = performance.now();
    let next = 0;
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (next < o.instances) {
          const i = next++;
          await k.admin.create(kubePaths.pods("bench-baseline"), {
            apiVersion: "v1",
            kind: "Pod",
            metadata: { name: `bare-${i}` },
            spec: {
              serviceAccountName: "plain",
              automountServiceAccountToken: false,
              containers: [{ name: "c", image: "example.invalid/none:1" }],
            },
          });
        }
      }),
    );
    const bareSeconds = (performance.now() - bareStart) / 1000;
    say(`baseline: ${o.instances} bare pods in ${bareSeconds.toFixed(1)} s`);

    const nats = await startNats(scope);
    const api = await startApi(scope, { nats, computeBackend: "kubernetes", clusterId: CLUSTER });
    const admin = await api.adminToken();
    const agentEnv = {
      CALLPLANE__GLOBAL__DATA_DIR: dir,
      CALLPLANE__LOG__LEVEL: "warn",
      ...nats.serviceEnv(),
      CALLPLANE__API__URL: api.url,
      CALLPLANE__AUTH__SERVICE_TOKEN_DIR: api.serviceTokenDir,
      CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "false",
      CALLPLANE__COMPUTE__LISTEN: "127.0.0.1:0",
      CALLPLANE__COMPUTE__BACKEND: "kubernetes",
      CALLPLANE__COMPUTE__KUBERNETES__API_SERVER: k.url,
      CALLPLANE__COMPUTE__KUBERNETES__CA_FILE: k.caFile,
      CALLPLANE__COMPUTE__KUBERNETES__TOKEN_FILE: setup.agentTokenFile,
      CALLPLANE__COMPUTE__KUBERNETES__INSTANCE_TYPES: JSON.stringify([{ ...TYPE, nodeSelector: {} }]),
      CALLPLANE__COMPUTE__WORKER_IDENTITY__CLUSTER_ID: CLUSTER,
      CALLPLANE__KUBERNETES__IMAGE: "registry.example/callplane:bench",
      CALLPLANE__KUBERNETES__WORKER_NAMESPACE: WORKERS_NS,
    };
    const script = join(distRoot, "src", "services", "compute", "main.js");
    const startAgent = (name: string): Promise<ChildHandle> =>
      startService(scope, name, script, agentEnv, { readyTimeoutMs: 120_000 });

    let agent = await startAgent("compute");
    // the agent registers its instance type; then one deployment of N instances
    const created = await call<{ function: { id: string; versionId: string } }>(
      `${api.url}/v2/nvcf/functions`,
      {
        token: admin,
        body: {
          name: `k8s-bench-${randomBytes(3).toString("hex")}`,
          inferenceUrl: "/echo",
          containerImage: "local/echo",
          health: { uri: "/health" },
        },
      },
    );
    if (created.status !== 200) throw new Error(`create function: ${created.text}`);
    const { id, versionId } = created.body.function;
    const path = `${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`;
    const spec = {
      gpu: TYPE.gpu,
      instanceType: TYPE.name,
      minInstances: o.instances,
      maxInstances: o.instances,
      maxRequestConcurrency: 1,
    };
    // the agent's requests from here on are the provisioning's (it reads no nodes: its type is configured)
    const ownPolls = { n: 0 };
    const before = await apiRequests(k.admin);
    for (let tries = 0; ; tries++) {
      const dep = await call(path, { token: admin, body: { deploymentSpecifications: [spec] } });
      if (dep.status === 200) break;
      // the agent's registration may not have landed yet
      if (tries > 100) throw new Error(`deploy: ${dep.text}`);
      await sleep(200);
    }
    const selector = `${MANAGED},function-id=${id}`;
    const started = performance.now();
    let pods = 0;
    say(`deployed ${o.instances} instances; waiting for their pods`);
    while (pods < o.instances) {
      await sleep(250);
      ownPolls.n++;
      // (only this deployment's pods are in the workers' namespace)
      pods = await count(k.admin, kubePaths.pods(WORKERS_NS));
      if (performance.now() - started > 30 * 60_000) throw new Error(`only ${pods} pods after 30 minutes`);
    }
    const provisionSeconds = (performance.now() - started) / 1000;
    say(`${o.instances} pods in ${provisionSeconds.toFixed(1)} s`);
    // then each pod's account, role, binding and Secrets are pointed at it (owner references): done
    // when every one of them has its owner
    const owned = async () => {
      let n = 0;
      for (const p of [
        kubePaths.serviceAccounts(WORKERS_NS),
        kubePaths.roles(WORKERS_NS),
        kubePaths.roleBindings(WORKERS_NS),
        kubePaths.secrets(WORKERS_NS),
      ]) {
        ownPolls.n++;
        const items = (await k.admin.list(p, { query: { labelSelector: MANAGED } })).items;
        n += items.filter((x) => x.metadata?.ownerReferences?.length).length;
      }
      return n;
    };
    while ((await owned()) < 5 * o.instances) {
      if (performance.now() - started > 30 * 60_000) throw new Error("owner references never all set");
      await sleep(500);
    }
    const completeSeconds = (performance.now() - started) / 1000;
    say(`every identity object owned by its pod after ${completeSeconds.toFixed(1)} s`);
    // the metrics read itself is one request more
    ownPolls.n++;
    const after = await apiRequests(k.admin);
    // this benchmark's own requests in between: its counts and lists
    const agentRequests = after - before - ownPolls.n;
    const peakRss = peakRssMiB(agent.pid);
    const objects = {
      serviceAccounts: await count(k.admin, kubePaths.serviceAccounts(WORKERS_NS), MANAGED),
      roles: await count(k.admin, kubePaths.roles(WORKERS_NS), MANAGED),
      roleBindings: await count(k.admin, kubePaths.roleBindings(WORKERS_NS), MANAGED),
      secrets: await count(k.admin, kubePaths.secrets(WORKERS_NS), MANAGED),
    };
    const uidsOf = async () =>
      new Map(
        (await k.admin.list(kubePaths.pods(WORKERS_NS), { query: { labelSelector: selector } })).items.map(
          (p) => [p.metadata!.name!, p.metadata!.uid!],
        ),
      );
    const beforeRestart = await uidsOf();

    // adoption: the agent stopped (its pods stay) and started again
    say("restarting the agent");
    await agent.stop();
    const restarted = performance.now();
    agent = await startAgent("compute-restarted");
    // its first sync (adoption, then the desired state matched, then its report) makes it ready
    const health = `${agent.urls.compute}/health`;
    for (;;) {
      const ok = await fetch(health).then(
        (r) => r.status === 200,
        () => false,
      );
      if (ok) break;
      if (performance.now() - restarted > 10 * 60_000) throw new Error("the restarted agent never synced");
      await sleep(100);
    }
    const adoptSeconds = (performance.now() - restarted) / 1000;
    const reported =
      (await call<{ deployment: { instances: unknown[] } }>(path, { token: admin })).body.deployment
        ?.instances?.length ?? 0;
    await sleep(2000);
    const afterRestart = await uidsOf();
    let same = 0;
    for (const [name, uid] of beforeRestart) if (afterRestart.get(name) === uid) same++;
    return {
      machine: machine(),
      instances: o.instances,
      baseline: { barePodsSeconds: round(bareSeconds), barePodsPerSecond: round(o.instances / bareSeconds) },
      provisioning: {
        seconds: round(provisionSeconds),
        completeSeconds: round(completeSeconds),
        podsPerSecond: round(o.instances / provisionSeconds),
        ratioToBarePods: round(bareSeconds / provisionSeconds),
        apiRequestsPerPod: round(agentRequests / o.instances),
        agentPeakRssMiB: peakRss,
        objects,
      },
      adoption: {
        seconds: round(adoptSeconds),
        podsBefore: beforeRestart.size,
        podsAfter: afterRestart.size,
        sameUid: same,
        reported,
        agentPeakRssMiB: peakRssMiB(agent.pid),
      },
    };
  } finally {
    await scope.close();
  }
}

const round = (x: number) => Math.round(x * 100) / 100;
