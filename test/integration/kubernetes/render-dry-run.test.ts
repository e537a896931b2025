// `callplane render`'s manifests against a real kube-apiserver 1.20.2 (testkit/kube-apiserver.ts),
// one for the whole file. Each example environment (and split-plane with the invocation autoscaler
// on, for the HorizontalPodAutoscaler) is rendered in-process as the golden test renders it; its
// namespaces are created for real, then every object is POSTed with dryRun=All: the server
// defaults, admits and validates it as it would on `kubectl apply` and stores nothing. So an
// object naming a Service, a ServiceAccount or a Secret that does not exist (the webhook
// registration's Service, the pods' accounts) is checked for its shape alone.
//
// Every object of a kind the server serves must be accepted, and must come back with every field
// it was sent (1.20 drops a field it does not know without a word: there is no strict field
// validation before 1.25). The kinds the server does not serve (newer API versions than 1.20's,
// and the CRDs of the Gateway API and cert-manager, not installed here) are listed with
// t.diagnostic, and must all be in UNSERVED: a newly rendered kind that 1.20 lacks fails here.
// The unserved built-in kinds are also dry-run at the version 1.20 serves (same fields), so at
// least their fields are known good.
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { parse, stringify } from "yaml";
import { renderFile } from "../../../src/deploy/index.js";
import type { RenderResult } from "../../../src/deploy/render/index.js";
import { isAlreadyExists, isNotFound, kubePaths, type KubeObject } from "../../../src/lib/kube/index.js";
import { KUBE_VERSION, startKubeApiServer, type KubeApiServer } from "../../testkit/kube-apiserver.js";
import { repoRoot, tmpDir } from "../../testkit/index.js";

const VERSION = "0.0.0-dryrun";
const EXAMPLES = ["one-machine", "split-plane", "kubernetes"];

/**
 * What 1.20.2 does not serve, "<apiVersion> <kind>" → why; every other kind render writes must be
 * served. `older`: the version 1.20 does serve, with the same fields for what render writes.
 */
const UNSERVED: Record<string, { why: string; older?: string }> = {
  "policy/v1 PodDisruptionBudget": {
    why: "policy/v1 is Kubernetes 1.21's (1.20 serves policy/v1beta1)",
    older: "policy/v1beta1",
  },
  "autoscaling/v2 HorizontalPodAutoscaler": {
    why: "autoscaling/v2 is Kubernetes 1.23's (1.20 serves autoscaling/v2beta2)",
    older: "autoscaling/v2beta2",
  },
  "gateway.networking.k8s.io/v1 Gateway": { why: "a Gateway API CRD (none installed here)" },
  "gateway.networking.k8s.io/v1 HTTPRoute": { why: "a Gateway API CRD (none installed here)" },
  "gateway.networking.k8s.io/v1alpha2 TCPRoute": { why: "a Gateway API CRD (none installed here)" },
  "gateway.networking.k8s.io/v1alpha2 TLSRoute": { why: "a Gateway API CRD (none installed here)" },
  "cert-manager.io/v1 Issuer": { why: "a cert-manager CRD (none installed here)" },
  "cert-manager.io/v1 Certificate": { why: "a cert-manager CRD (none installed here)" },
};

type Obj = KubeObject & { apiVersion: string; kind: string; metadata: { name: string; namespace?: string } };
const typeOf = (o: Obj) => `${o.apiVersion} ${o.kind}`;
const nameOf = (o: Obj) =>
  `${o.kind} ${o.metadata.namespace ? `${o.metadata.namespace}/` : ""}${o.metadata.name}`;

function objectsOf(r: RenderResult): Obj[] {
  return r.files.flatMap((f) => f.objects.map((o) => o.toJSON() as Obj));
}

/**
 * The paths of `sent` that the server's answer lacks or holds another value at. Quantities and
 * defaults may be rewritten by a server, but render writes them canonically, so any difference is
 * listed (and the test says which).
 */
function differences(sent: unknown, got: unknown, path = ""): string[] {
  if (sent === undefined) return [];
  // the server leaves out an empty list (omitempty), which decodes as the absent one does
  if (got === undefined) return Array.isArray(sent) && sent.length === 0 ? [] : [`${path} (dropped)`];
  if (Array.isArray(sent)) {
    if (!Array.isArray(got)) return [`${path} (not a list)`];
    const out = sent.flatMap((s, i) => differences(s, got[i], `${path}[${i}]`));
    return got.length > sent.length ? [...out, `${path} (${got.length - sent.length} more items)`] : out;
  }
  if (sent !== null && typeof sent === "object") {
    if (got === null || typeof got !== "object") return [`${path} (not an object)`];
    return Object.entries(sent).flatMap(([key, s]) =>
      differences(s, (got as Record<string, unknown>)[key], path ? `${path}.${key}` : key),
    );
  }
  return sent === got ? [] : [`${path} (${JSON.stringify(sent)} → ${JSON.stringify(got)})`];
}

/** Which "<apiVersion> <kind>" the server serves (its discovery, one request per group version). */
function discovery(k: KubeApiServer): (o: Obj) => Promise<boolean> {
  const groups = new Map<string, Promise<Set<string>>>();
  const kindsOf = async (apiVersion: string): Promise<Set<string>> => {
    try {
      const list = await k.admin.request<{ resources: Array<{ name: string; kind: string }> }>(
        "GET",
        apiVersion.includes("/") ? `/apis/${apiVersion}` : `/api/${apiVersion}`,
      );
      return new Set(list.resources.filter((r) => !r.name.includes("/")).map((r) => r.kind));
    } catch (err) {
      if (isNotFound(err)) return new Set();
      throw err;
    }
  };
  return async (o) => {
    let kinds = groups.get(o.apiVersion);
    if (!kinds) groups.set(o.apiVersion, (kinds = kindsOf(o.apiVersion)));
    return (await kinds).has(o.kind);
  };
}

test(`callplane render's manifests, dry-run on a real Kubernetes ${KUBE_VERSION} API server`, async (t) => {
  const k = await startKubeApiServer(t);
  const served = discovery(k);
  const v = await k.admin.request<{ gitVersion: string }>("GET", "/version");
  assert.equal(v.gitVersion, KUBE_VERSION);

  // split-plane with the invocation service's autoscaler on: the one HorizontalPodAutoscaler render writes
  const autoscaled = join(tmpDir(t, "callplane-dry-run-"), "split-plane-autoscaled.yaml");
  const split = parse(readFileSync(join(repoRoot, "examples", "split-plane.yaml"), "utf8")) as {
    invocation: Record<string, unknown>;
  };
  split.invocation.autoscaling = { enabled: true, minReplicas: 3, maxReplicas: 10 };
  writeFileSync(autoscaled, stringify(split));
  const environments = [
    ...EXAMPLES.map((name) => ({
      name: `examples/${name}.yaml`,
      file: join(repoRoot, "examples", `${name}.yaml`),
    })),
    { name: "examples/split-plane.yaml, invocation.autoscaling.enabled", file: autoscaled },
  ];

  const accepted = new Map<string, Set<string>>(); // "<apiVersion> <kind>" → the environments
  const unserved = new Map<string, Set<string>>();
  const workerObjects = new Set<string>();
  let webhookRegistration: Obj | undefined;
  let aDeployment: Obj | undefined;

  for (const env of environments)
    await t.test(env.name, async (t) => {
      const r = renderFile(env.file, { version: VERSION });
      const objects = objectsOf(r);
      const namespaces = objects.filter((o) => o.kind === "Namespace");

      // every namespace the objects name is rendered too (else `kubectl apply` of the folder fails)
      const named = new Set(objects.flatMap((o) => (o.metadata.namespace ? [o.metadata.namespace] : [])));
      assert.ok(named.has(r.workerNamespace), `no object in the workers' namespace ${r.workerNamespace}`);
      for (const ns of named)
        assert.ok(
          namespaces.some((n) => n.metadata.name === ns),
          `objects are in namespace ${ns}, which is not rendered`,
        );

      // the namespaces for real: a dry run of a namespaced object needs its namespace. An earlier
      // environment may have made them: then the server answers AlreadyExists, which it says only
      // after the object passed admission and validation (see the last subtest)
      for (const n of namespaces) {
        const [res] = await k.apply([n]);
        if (res.error && isAlreadyExists(res.error)) continue;
        assert.equal(res.error, undefined, `${nameOf(n)} refused: ${res.error?.message}`);
        assert.deepEqual(differences(n, res.object), [], `${nameOf(n)}: the server changed fields`);
      }

      const mine = new Set<string>();
      for (const o of objects.filter((x) => x.kind !== "Namespace")) {
        if (!(await served(o))) {
          unserved.set(typeOf(o), (unserved.get(typeOf(o)) ?? new Set()).add(env.name));
          mine.add(typeOf(o));
          continue;
        }
        const [res] = await k.apply([o], { dryRun: true });
        assert.equal(
          res.error,
          undefined,
          `${env.name}: ${typeOf(o)} ${nameOf(o)} refused by the API server: ${res.error?.message}`,
        );
        assert.deepEqual(
          differences(o, res.object),
          [],
          `${env.name}: ${nameOf(o)}: the API server did not keep every field as sent`,
        );
        accepted.set(typeOf(o), (accepted.get(typeOf(o)) ?? new Set()).add(env.name));
        if (o.metadata.namespace === r.workerNamespace) workerObjects.add(`${env.name}: ${nameOf(o)}`);
        if (o.kind === "ValidatingWebhookConfiguration") webhookRegistration = o;
        if (o.kind === "Deployment") aDeployment ??= o;
      }
      if (mine.size)
        t.diagnostic(`not served by ${KUBE_VERSION}, not checked: ${[...mine].sort().join(", ")}`);

      // dry run created nothing
      const ns = r.namespace;
      const deployments = await k.admin.list(kubePaths.namespaced("apps", "v1", "deployments", ns));
      assert.deepEqual(deployments.items, [], "a dry run stored a Deployment");
    });

  await t.test("the kinds not served are only those known not to be, each for its reason", (t) => {
    for (const [type, envs] of [...unserved].sort())
      t.diagnostic(`${type}: ${UNSERVED[type]?.why ?? "UNKNOWN"} (${[...envs].join("; ")})`);
    const unknown = [...unserved.keys()].filter((type) => !UNSERVED[type]);
    assert.deepEqual(
      unknown,
      [],
      `render writes kinds ${KUBE_VERSION} does not serve and UNSERVED does not list: ${unknown.join(", ")}`,
    );
    t.diagnostic(`checked (accepted by a dry run): ${[...accepted.keys()].sort().join(", ")}`);
  });

  await t.test("the objects in the workers' namespace were checked", (t) => {
    const list = [...workerObjects];
    for (const o of list) t.diagnostic(o);
    for (const kind of ["NetworkPolicy", "Role", "RoleBinding"])
      assert.ok(
        list.some((o) => o.includes(`: ${kind} callplane-workers/`)),
        `no ${kind} in the workers' namespace`,
      );
  });

  await t.test("the unserved built-in kinds pass at the version 1.20 serves", async () => {
    for (const env of environments) {
      const objects = objectsOf(renderFile(env.file, { version: VERSION }));
      for (const o of objects) {
        const older = UNSERVED[typeOf(o)]?.older;
        if (!older) continue;
        const old = { ...o, apiVersion: older };
        assert.ok(await served(old), `${older} ${o.kind} is not served either`);
        const [res] = await k.apply([old], { dryRun: true });
        assert.equal(
          res.error,
          undefined,
          `${env.name}: ${older} ${nameOf(o)} refused: ${res.error?.message}`,
        );
        assert.deepEqual(
          differences(old, res.object),
          [],
          `${env.name}: ${older} ${nameOf(o)}: fields changed`,
        );
      }
    }
  });

  await t.test("a dry run does validate: broken objects are refused", async () => {
    // the webhook registration's shape is checked (its Service need not exist): without the
    // side-effect class v1 requires, it is refused
    assert.ok(webhookRegistration, "no ValidatingWebhookConfiguration rendered");
    const webhooks = webhookRegistration.webhooks as Array<Record<string, unknown>>;
    const [noSideEffects] = await k.apply(
      [{ ...webhookRegistration, webhooks: webhooks.map(({ sideEffects: _, ...w }) => w) }],
      { dryRun: true },
    );
    assert.equal(noSideEffects.error?.status, 422, "a webhook without sideEffects was accepted");
    assert.match(noSideEffects.error?.message ?? "", /sideEffects/);

    // a Deployment whose selector does not select its template
    assert.ok(aDeployment);
    const [badSelector] = await k.apply(
      [{ ...aDeployment, spec: { ...(aDeployment.spec as object), selector: { matchLabels: { x: "y" } } } }],
      { dryRun: true },
    );
    assert.equal(badSelector.error?.status, 422, "a Deployment selecting none of its pods was accepted");

    // a field 1.20 does not know is dropped without an error: what differences() is there for
    // (endPort is Kubernetes 1.21's)
    const withEndPort: Obj = {
      apiVersion: "networking.k8s.io/v1",
      kind: "NetworkPolicy",
      metadata: { name: "end-port", namespace: "callplane-workers" },
      spec: {
        podSelector: {},
        policyTypes: ["Egress"],
        egress: [{ ports: [{ protocol: "TCP", port: 8000, endPort: 9000 }] }],
      },
    };
    const [dropped] = await k.apply([withEndPort], { dryRun: true });
    assert.equal(dropped.error, undefined);
    assert.deepEqual(differences(withEndPort, dropped.object), ["spec.egress[0].ports[0].endPort (dropped)"]);

    // AlreadyExists comes after validation: an invalid Namespace of an existing name is Invalid
    const [badNamespace] = await k.apply(
      [{ apiVersion: "v1", kind: "Namespace", metadata: { name: "nvcf", labels: { "bad label": "x" } } }],
      { dryRun: true },
    );
    assert.equal(badNamespace.error?.status, 422, `not Invalid: ${badNamespace.error?.message}`);
  });
});
