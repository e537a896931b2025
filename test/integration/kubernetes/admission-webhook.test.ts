// The admission webhook called for real by a kube-apiserver 1.20.2 (testkit/kube-apiserver.ts): the
// webhook runs in-process with a certificate from a test CA, and the registration is the one
// `callplane render` writes for examples/kubernetes.yaml, with its clientConfig pointed at
// https://127.0.0.1:<port>/validate (the API server on loopback reaches no Service) and that CA as
// its caBundle (what cert-manager would inject). So are the namespaces (labelled for the namespace
// selector) and the compute agent's ServiceAccount, Role, RoleBinding, ClusterRole and its binding.
// Proved: every pod-bearing kind with either account field is refused by the API server, the
// webhook's message reaches the client and nothing reaches etcd; the agent's own token creates a
// worker pod, which an admin may then label and give a finalizer and take it off again (what the
// garbage collector does in a foreground deletion); a pod of an ordinary account that mounts a
// worker's Secret is refused; a legacy token Secret for a worker account is refused for an admin
// and created by the agent; a TokenRequest for a worker account is refused for an admin and
// allowed for a node;
// other namespaces are not reviewed; with no webhook answering, the workers' namespace takes no pod
// (failure policy Fail).
import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { renderFile } from "../../../src/deploy/index.js";
import {
  KubeError,
  isNotFound,
  kubePaths,
  type KubeClient,
  type KubeObject,
} from "../../../src/lib/kube/index.js";
import { startKubeApiServer } from "../../testkit/kube-apiserver.js";
import { waitFor } from "../../testkit/client.js";
import { repoRoot } from "../../testkit/index.js";
import { startTestWebhook } from "../../testkit/kube-setup.js";

// examples/kubernetes.yaml: control plane in nvcf, workers in callplane-workers
const NS = "nvcf";
const WORKERS = "callplane-workers";
const AGENT = `system:serviceaccount:${NS}:compute-agent`;
const WEBHOOK = "reserved-worker-accounts.callplane.io";
const RESERVED = "nvcf-worker-x";

const podSpec = (account: Record<string, string>, restartPolicy?: string) => ({
  ...account,
  automountServiceAccountToken: false,
  ...(restartPolicy ? { restartPolicy } : {}),
  containers: [{ name: "c", image: "example.invalid/none:1" }],
});
const labels = { app: "x" };
const template = (account: Record<string, string>, restartPolicy?: string) => ({
  metadata: { labels },
  spec: podSpec(account, restartPolicy),
});

/** Each pod-bearing kind as Kubernetes 1.20 serves it: its collection, and an object naming `account`. */
const KINDS: Array<{
  kind: string;
  group: string;
  version: string;
  plural: string;
  path: string;
  object: (name: string, account: Record<string, string>) => KubeObject;
}> = [
  {
    kind: "Pod",
    group: "",
    version: "v1",
    plural: "pods",
    path: "spec",
    object: (name, account) => ({
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name },
      spec: podSpec(account),
    }),
  },
  ...(["Deployment", "ReplicaSet", "DaemonSet", "StatefulSet"] as const).map((kind) => ({
    kind,
    group: "apps",
    version: "v1",
    plural: `${kind.toLowerCase()}s`,
    path: "spec.template.spec",
    object: (name: string, account: Record<string, string>): KubeObject => ({
      apiVersion: "apps/v1",
      kind,
      metadata: { name },
      spec: {
        selector: { matchLabels: labels },
        ...(kind === "StatefulSet" ? { serviceName: "x" } : {}),
        template: template(account),
      },
    }),
  })),
  {
    kind: "Job",
    group: "batch",
    version: "v1",
    plural: "jobs",
    path: "spec.template.spec",
    object: (name, account) => ({
      apiVersion: "batch/v1",
      kind: "Job",
      metadata: { name },
      spec: { template: template(account, "Never") },
    }),
  },
  {
    // batch/v1 CronJob is 1.21's
    kind: "CronJob",
    group: "batch",
    version: "v1beta1",
    plural: "cronjobs",
    path: "spec.jobTemplate.spec.template.spec",
    object: (name, account) => ({
      apiVersion: "batch/v1beta1",
      kind: "CronJob",
      metadata: { name },
      spec: { schedule: "*/5 * * * *", jobTemplate: { spec: { template: template(account, "OnFailure") } } },
    }),
  },
  {
    kind: "ReplicationController",
    group: "",
    version: "v1",
    plural: "replicationcontrollers",
    path: "spec.template.spec",
    object: (name, account) => ({
      apiVersion: "v1",
      kind: "ReplicationController",
      metadata: { name },
      spec: { selector: labels, template: template(account) },
    }),
  },
  {
    kind: "PodTemplate",
    group: "",
    version: "v1",
    plural: "podtemplates",
    path: "template.spec",
    object: (name, account) => ({
      apiVersion: "v1",
      kind: "PodTemplate",
      metadata: { name },
      template: template(account),
    }),
  },
];

const collection = (k: (typeof KINDS)[number], ns = WORKERS, name?: string) =>
  kubePaths.namespaced(k.group, k.version, k.plural, ns, name);

async function refusal(p: Promise<unknown>): Promise<KubeError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(err instanceof KubeError, `not refused: ${String(err)}`);
  return err;
}

const tokenRequest = { apiVersion: "authentication.k8s.io/v1", kind: "TokenRequest", spec: {} };

test("the admission webhook, called by a real kube-apiserver: reserved worker accounts", async (t) => {
  const k = await startKubeApiServer(t);

  // the webhook, on loopback, with a certificate for 127.0.0.1 from its own test CA
  const { hook, url, caPem } = await startTestWebhook(t, AGENT);
  // what render writes, as render writes it (the registration's address and CA aside)
  const rendered = renderFile(join(repoRoot, "examples", "kubernetes.yaml"), { version: "0.0.0-test" });
  const objects = rendered.files.flatMap((f) => f.objects.map((o) => o.toJSON() as KubeObject));
  const pick = (kind: string, name?: string) => {
    const o = objects.filter((x) => x.kind === kind && (name === undefined || x.metadata?.name === name));
    assert.ok(o.length, `render wrote no ${kind} ${name ?? ""}`);
    return o;
  };
  const [registration] = pick("ValidatingWebhookConfiguration") as Array<
    KubeObject & { webhooks: Array<Record<string, unknown>> }
  >;
  registration.webhooks[0].clientConfig = {
    url: `${url.origin}/validate`,
    caBundle: Buffer.from(caPem).toString("base64"),
  };
  const setup = [
    ...pick("Namespace"),
    ...pick("ServiceAccount", "compute-agent"),
    ...pick("Role", "compute-agent"),
    ...pick("RoleBinding", "compute-agent"),
    ...pick("ClusterRole"),
    ...pick("ClusterRoleBinding"),
    registration,
  ];
  for (const r of await k.apply(setup)) assert.equal(r.error, undefined, `${r.path}: ${r.error?.message}`);
  // the accounts the pods name: the ServiceAccount admission plugin refuses a pod whose account is
  // missing before any webhook is asked
  await k.admin.create(kubePaths.namespaces(), {
    apiVersion: "v1",
    kind: "Namespace",
    metadata: { name: "elsewhere" },
  });
  for (const [ns, sa] of [
    [WORKERS, RESERVED],
    [WORKERS, "plain"],
    ["elsewhere", RESERVED],
  ])
    await k.createServiceAccount(ns, sa);

  // the API server picks the registration up from its informer: a dry run tells when
  const probe = KINDS[0].object("probe", { serviceAccountName: RESERVED });
  const deadline = Date.now() + 30_000;
  for (;;) {
    const err = await k.admin.create(kubePaths.pods(WORKERS), probe, { query: { dryRun: "All" } }).then(
      () => undefined,
      (e: unknown) => e,
    );
    if (err instanceof KubeError && err.message.includes(WEBHOOK)) break;
    if (Date.now() > deadline) assert.fail(`the webhook was never called: ${String(err)}`);
    await sleep(200);
  }

  const agentToken = await k.tokenFor(NS, "compute-agent");
  const agent: KubeClient = k.clientAs(agentToken);

  await t.test(
    "every pod-bearing kind, with either account field, is refused by the API server and not stored",
    async () => {
      for (const kd of KINDS)
        for (const field of ["serviceAccountName", "serviceAccount"]) {
          const name = `${kd.kind.toLowerCase()}-${field.toLowerCase()}`;
          const what = `${kd.kind} ${field}`;
          const err = await refusal(k.admin.create(collection(kd), kd.object(name, { [field]: RESERVED })));
          assert.equal(err.status, 403, `${what}: ${err.message}`);
          // the client sees the webhook's own words, with the field path it set
          assert.ok(
            err.message.includes(`admission webhook "${WEBHOOK}" denied the request: `),
            `${what}: ${err.message}`,
          );
          assert.ok(err.message.includes(`${kd.path}.${field} "${RESERVED}"`), `${what}: ${err.message}`);
          assert.ok(
            err.message.includes(`only the compute agent (${AGENT}) may use them`),
            `${what}: ${err.message}`,
          );
          assert.ok(
            isNotFound(await k.admin.get(collection(kd, WORKERS, name)).catch((e: unknown) => e)),
            `${what} stored`,
          );
        }
    },
  );

  await t.test(
    "an UPDATE that puts a reserved account into a pod template is refused; the stored object keeps its own",
    async () => {
      // (a Pod's account and a Job's template are immutable: the API server's validation, which runs
      // before the validating webhooks, refuses that change itself)
      for (const kd of KINDS.filter((x) => x.kind !== "Pod" && x.kind !== "Job")) {
        const name = `${kd.kind.toLowerCase()}-update`;
        await k.admin.create(collection(kd), kd.object(name, { serviceAccountName: "plain" }));
        const stored = await k.admin.get(collection(kd, WORKERS, name));
        const edited = structuredClone(stored) as Record<string, unknown>;
        let spec = edited;
        for (const key of kd.path.split(".")) spec = spec[key] as Record<string, unknown>;
        spec.serviceAccountName = RESERVED;
        spec.serviceAccount = RESERVED;
        const err = await refusal(k.admin.replace(collection(kd, WORKERS, name), edited));
        assert.equal(err.status, 403, `${kd.kind}: ${err.message}`);
        assert.ok(
          err.message.includes(`${kd.path}.serviceAccountName "${RESERVED}"`),
          `${kd.kind}: ${err.message}`,
        );
        let after: Record<string, unknown> = await k.admin.get(collection(kd, WORKERS, name));
        for (const key of kd.path.split(".")) after = after[key] as Record<string, unknown>;
        assert.equal(after.serviceAccountName, "plain", kd.kind);
      }
    },
  );

  await t.test(
    "the compute agent's service account (its rendered Role) creates a worker pod; an admin's label and finalizer on it pass",
    async () => {
      // as the pod contract has it: the worker's Secret by envFrom, the function's by a volume
      const pod = KINDS[0].object("cp-worker", { serviceAccountName: RESERVED }) as KubeObject & {
        spec: Record<string, unknown> & { containers: Array<Record<string, unknown>> };
      };
      pod.spec.containers[0].envFrom = [{ secretRef: { name: "cp-worker-worker" } }];
      pod.spec.volumes = [{ name: "secrets", secret: { secretName: "cp-worker-secrets" } }];
      const created = await agent.create(kubePaths.pods(WORKERS), pod);
      assert.equal((created.spec as { serviceAccountName: string }).serviceAccountName, RESERVED);
      // an UPDATE by anyone else that brings no reserved name passes: a label, a finalizer (what the
      // garbage collector adds and removes in a foreground deletion), and the finalizer removed
      const podPath = kubePaths.pods(WORKERS, "cp-worker");
      await k.admin.patch(podPath, { metadata: { labels: { touched: "yes" } } });
      await k.admin.patch(podPath, { metadata: { finalizers: ["example.com/hold"] } });
      assert.deepEqual((await k.admin.get(podPath)).metadata?.finalizers, ["example.com/hold"]);
      await k.admin.patch(podPath, [{ op: "remove", path: "/metadata/finalizers" }], "json");
      const after = await k.admin.get(podPath);
      assert.equal(after.metadata?.finalizers, undefined);
      assert.equal(after.metadata?.labels?.touched, "yes");
      await agent.patch(podPath, { metadata: { labels: { touched: "by-agent" } } }).then(
        () => assert.fail("the agent's Role has no pod patch"),
        (e: unknown) =>
          assert.ok(e instanceof KubeError && e.status === 403 && e.reason === "Forbidden", String(e)),
      );
      await k.admin.delete(podPath, { gracePeriodSeconds: 0, tolerateMissing: false });
      // and its ClusterRole reads the nodes (the instance types)
      await agent.list(kubePaths.nodes());
    },
  );

  await t.test(
    "a pod of an ordinary account that takes a worker's Secret (cp-*-worker, cp-*-secrets) is refused, naming the field",
    async () => {
      for (const [secret, edit, field] of [
        [
          "cp-x-worker",
          (spec: Record<string, unknown>) => {
            spec.volumes = [{ name: "s", secret: { secretName: "cp-x-worker" } }];
          },
          "spec.volumes[0].secret.secretName",
        ],
        [
          "cp-x-secrets",
          (spec: Record<string, unknown>) => {
            (spec.containers as Array<Record<string, unknown>>)[0].env = [
              { name: "S", valueFrom: { secretKeyRef: { name: "cp-x-secrets", key: "secrets.json" } } },
            ];
          },
          "spec.containers[0].env[0].valueFrom.secretKeyRef.name",
        ],
      ] as const) {
        const pod = KINDS[0].object("thief", { serviceAccountName: "plain" }) as KubeObject & {
          spec: Record<string, unknown>;
        };
        edit(pod.spec);
        const err = await refusal(k.admin.create(kubePaths.pods(WORKERS), pod));
        assert.equal(err.status, 403, err.message);
        assert.ok(err.message.includes(`${field} "${secret}"`), err.message);
        assert.ok(err.message.includes("hold a worker pod's NATS credential"), err.message);
        assert.ok(isNotFound(await k.admin.get(kubePaths.pods(WORKERS, "thief")).catch((e: unknown) => e)));
      }
    },
  );

  await t.test(
    "a legacy token Secret for a worker account: refused for an admin, created by the agent (its Role has secrets create)",
    async () => {
      const secret = (name: string): KubeObject => ({
        apiVersion: "v1",
        kind: "Secret",
        type: "kubernetes.io/service-account-token",
        metadata: { name, annotations: { "kubernetes.io/service-account.name": RESERVED } },
      });
      const err = await refusal(k.admin.create(kubePaths.secrets(WORKERS), secret("legacy-admin")));
      assert.equal(err.status, 403, err.message);
      assert.ok(
        err.message.includes(
          `metadata.annotations["kubernetes.io/service-account.name"] "${RESERVED}": service accounts starting with nvcf-worker- are reserved`,
        ),
        err.message,
      );
      assert.ok(err.message.includes("a token that never expires"), err.message);
      assert.ok(
        isNotFound(await k.admin.get(kubePaths.secrets(WORKERS, "legacy-admin")).catch((e: unknown) => e)),
      );
      await agent.create(kubePaths.secrets(WORKERS), secret("legacy-agent"));
      // an update that keeps the account (the token controller filling in the token) passes
      await k.admin.patch(kubePaths.secrets(WORKERS, "legacy-agent"), {
        metadata: { labels: { filled: "yes" } },
      });
      await agent.delete(kubePaths.secrets(WORKERS, "legacy-agent"), { tolerateMissing: false });
    },
  );

  await t.test("a TokenRequest for a worker account: refused for an admin, allowed for a node", async () => {
    const path = `${kubePaths.serviceAccounts(WORKERS, RESERVED)}/token`;
    const err = await refusal(k.admin.create(path, tokenRequest));
    assert.equal(err.status, 403, err.message);
    assert.ok(err.message.includes(`TokenRequest for service account "${RESERVED}"`), err.message);
    assert.ok(err.message.includes("only the compute agent"), err.message);
    // a node may ask only for the accounts of pods bound to it (the Node authorizer), as a kubelet
    // does: the agent's pod, bound to the node by the scheduler, the token bound to the pod
    const pod = await agent.create(
      kubePaths.pods(WORKERS),
      KINDS[0].object("cp-token", { serviceAccountName: RESERVED }),
    );
    await k.scheduler.create(`${kubePaths.pods(WORKERS, "cp-token")}/binding`, {
      apiVersion: "v1",
      kind: "Binding",
      metadata: { name: "cp-token" },
      target: { apiVersion: "v1", kind: "Node", name: "test-node" },
    });
    const bound = {
      ...tokenRequest,
      spec: { boundObjectRef: { apiVersion: "v1", kind: "Pod", name: "cp-token", uid: pod.metadata!.uid } },
    };
    // (the authorizer's graph follows the binding a moment later)
    const r = await waitFor(
      "the node's TokenRequest",
      () => k.node.create<KubeObject & { status: { token: string } }>(path, bound),
      { timeoutMs: 15_000, intervalMs: 200 },
    );
    assert.ok(r.status.token.split(".").length === 3, "a JWT");
    await k.admin.delete(kubePaths.pods(WORKERS, "cp-token"), { gracePeriodSeconds: 0 });
    // another account's tokens are the webhook's business for no one
    const plain = await k.admin.create<KubeObject & { status: { token: string } }>(
      `${kubePaths.serviceAccounts(WORKERS, "plain")}/token`,
      tokenRequest,
    );
    assert.ok(plain.status.token);
  });

  await t.test(
    "what does not name a reserved account is allowed, and other namespaces are not reviewed",
    async () => {
      await k.admin.create(
        kubePaths.pods(WORKERS),
        KINDS[0].object("plain", { serviceAccountName: "plain" }),
      );
      await k.admin.create(
        kubePaths.pods("elsewhere"),
        KINDS[0].object("elsewhere", { serviceAccountName: RESERVED }),
      );
      await k.admin.create(`${kubePaths.serviceAccounts("elsewhere", RESERVED)}/token`, tokenRequest);
    },
  );

  await t.test("the webhook counted what it answered", async () => {
    const text = await hook.registry.metrics();
    assert.match(
      text,
      /callplane_admission_reviews_total\{kind="Deployment",outcome="refused",service="admission-webhook"\} [1-9]/,
    );
    assert.match(
      text,
      /callplane_admission_reviews_total\{kind="TokenRequest",outcome="allowed",service="admission-webhook"\} [1-9]/,
    );
  });

  await t.test(
    "with no webhook answering, the workers' namespace takes no pod (failure policy Fail); others still do",
    async () => {
      hook.destroy();
      const err = await refusal(
        k.admin.create(
          kubePaths.pods(WORKERS),
          KINDS[0].object("no-webhook", { serviceAccountName: "plain" }),
        ),
      );
      assert.match(err.message, new RegExp(`failed calling webhook "${WEBHOOK.replaceAll(".", "\\.")}"`));
      assert.ok(
        isNotFound(await k.admin.get(kubePaths.pods(WORKERS, "no-webhook")).catch((e: unknown) => e)),
      );
      await k.admin.create(
        kubePaths.pods("elsewhere"),
        KINDS[0].object("still-fine", { serviceAccountName: RESERVED }),
      );
    },
  );
});
