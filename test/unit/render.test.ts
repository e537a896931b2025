// `callplane render`: the manifests of the example environments, kept stable by golden files
// (test/fixtures/render/<example>/, rewritten with UPDATE_GOLDEN=1 when a change is intended: review
// the diff), what they must contain (replica counts, pod DNS names, annotations, the issuer's route,
// the NATS cluster, no Secret values), and the refusals, each of which must name its keys.
//
//   UPDATE_GOLDEN=1 node --test dist/test/unit/render.test.js
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { stringify } from "yaml";
import { Deployment } from "kubernetes-models/apps/v1";
import { ConfigError } from "../../src/lib/config/index.js";
import { natsServerBinary } from "../../src/lib/nats/index.js";
import { haproxyBinary } from "../../src/services/callback-proxy/haproxy.js";
import { createCa, issueServerCert } from "../../src/lib/tls/index.js";
import { RenderError, renderFile, writeRendered } from "../../src/deploy/index.js";
import type { K8sObject, RenderResult } from "../../src/deploy/render/index.js";
import { fileText, objectProblems, validateFiles } from "../../src/deploy/validate.js";
import { runCli, tmpDir } from "../testkit/index.js";

// compiled to dist/test/unit/, so the repository root is three levels up
const repoRoot = join(import.meta.dirname, "..", "..", "..");
const examplesDir = join(repoRoot, "examples");
const goldenDir = join(repoRoot, "test", "fixtures", "render");
const VERSION = "0.0.0-golden";
const EXAMPLES = ["one-machine", "split-plane", "kubernetes"];

/** A JSON view of every object, for assertions on fields. */
type Json = Record<string, unknown> & {
  kind: string;
  metadata: { name: string; namespace?: string; annotations?: Record<string, string> };
  spec?: Record<string, unknown>;
};
function objects(r: RenderResult): Json[] {
  return r.files.flatMap((f) => f.objects.map((o: K8sObject) => o.toJSON() as Json));
}
function find(r: RenderResult, kind: string, name: string): Json {
  const o = objects(r).find((x) => x.kind === kind && x.metadata.name === name);
  assert.ok(o, `no ${kind} ${name}`);
  return o;
}
function has(r: RenderResult, kind: string, name: string): boolean {
  return objects(r).some((x) => x.kind === kind && x.metadata.name === name);
}
interface PodTemplate {
  metadata: { annotations: Record<string, string> };
  spec: {
    terminationGracePeriodSeconds?: number;
    containers: Array<{ readinessProbe?: { httpGet?: { path: string } } }>;
  };
}
const template = (o: Json) => (o.spec as { template: PodTemplate }).template;

function renderExample(name: string): RenderResult {
  return renderFile(join(examplesDir, `${name}.yaml`), { version: VERSION });
}

/** Renders an environment given as an object (written to a file, as the CLI reads it). */
function renderDoc(t: TestContext, doc: unknown): RenderResult {
  const file = join(tmpDir(t, "callplane-render-"), "env.yaml");
  writeFileSync(file, stringify(doc));
  return renderFile(file, { version: VERSION });
}

/** The refusal's full message (fails when the render succeeds). */
function refusal(t: TestContext, doc: unknown): string {
  try {
    renderDoc(t, doc);
  } catch (err) {
    assert.ok(err instanceof ConfigError || err instanceof RenderError, `not a refusal: ${String(err)}`);
    return err.message;
  }
  assert.fail(`rendered: ${JSON.stringify(doc)}`);
}

function assertNames(text: string, keys: string[]): void {
  for (const k of keys) assert.ok(text.includes(k), `the message does not name ${k}:\n${text}`);
}

// ---------------------------------------------------------------- the examples

for (const name of EXAMPLES) {
  void test(`golden: examples/${name}.yaml renders the files in test/fixtures/render/${name}/`, () => {
    const r = renderExample(name);
    assert.deepEqual(validateFiles(r.files), [], "every object validates");
    const dir = join(goldenDir, name);
    const texts = new Map(r.files.map((f) => [f.name, fileText(f, `${name}.yaml`)]));
    if (process.env.UPDATE_GOLDEN) {
      rmSync(dir, { recursive: true, force: true });
      mkdirSync(dir, { recursive: true });
      for (const [f, text] of texts) writeFileSync(join(dir, f), text);
      return;
    }
    assert.ok(existsSync(dir), `no golden files in ${dir}: run with UPDATE_GOLDEN=1`);
    assert.deepEqual(readdirSync(dir).sort(), [...texts.keys()].sort(), "the files rendered");
    for (const [f, text] of texts)
      assert.equal(
        text,
        readFileSync(join(dir, f), "utf8"),
        `${name}/${f} differs from its golden file (UPDATE_GOLDEN=1 to accept an intended change)`,
      );
  });
}

void test("rendering is deterministic: the same file twice gives the same bytes", () => {
  const a = renderExample("split-plane").files.map((f) => fileText(f, "x"));
  const b = renderExample("split-plane").files.map((f) => fileText(f, "x"));
  assert.deepEqual(a, b);
});

void test("the validator catches an object that breaks its schema", () => {
  const bad = new Deployment({
    metadata: { name: "Not_A_Name" },
    spec: { selector: {}, template: {}, replicas: "three" as unknown as number },
  });
  const p = objectProblems(bad).join("\n");
  assert.match(p, /replicas/);
  assert.match(p, /name is not a valid DNS subdomain/);
});

void test("split plane: three replicas of each front door, pod DNS names, budgets, probes, proxy and NATS", () => {
  const r = renderExample("split-plane");
  for (const d of ["invocation-service", "grpc-proxy-deployment", "worker-callback-proxy"]) {
    const dep = find(r, "Deployment", d);
    assert.equal((dep.spec as { replicas: number }).replicas, 3, `${d} replicas`);
    assert.ok(has(r, "PodDisruptionBudget", d), `${d} PDB`);
  }
  assert.equal((find(r, "Deployment", "nvcf-api").spec as { replicas: number }).replicas, 2);
  // the headless Services whose names make <dashed-ip>.invocation.<serviceDomain> and
  // <dashed-ip>.grpc-headless.<serviceDomain> resolve to a pod
  for (const s of ["invocation", "grpc-headless", "nats-headless"])
    assert.equal((find(r, "Service", s).spec as { clusterIP: string }).clusterIP, "None", s);
  // /health probes on every callplane Deployment
  for (const o of objects(r).filter(
    (x) => x.kind === "Deployment" && x.metadata.name !== "nats-auth-callout-service",
  ))
    assert.equal(template(o).spec.containers[0].readinessProbe?.httpGet?.path, "/health", o.metadata.name);
  // stop: drain delay + shutdown grace + margin
  assert.equal(
    template(find(r, "Deployment", "invocation-service")).spec.terminationGracePeriodSeconds,
    5 + 30 + 10,
  );
  const sts = find(r, "StatefulSet", "nats").spec as { replicas: number };
  assert.equal(sts.replicas, 3);
  const natsConf = (find(r, "ConfigMap", "nats-config") as unknown as { data: Record<string, string> }).data[
    "nats.conf"
  ];
  assert.match(natsConf, /jetstream \{/);
  assert.match(natsConf, /include \.\.\/auth\/auth\.conf/);
  assert.equal((natsConf.match(/nats:\/\/nats-\d\.nats-headless/g) ?? []).length, 3);
  // certificates: the stack CA, the proxy's *.<workerDomain> frontend, the pods' certificates
  const dns = (n: string) => (find(r, "Certificate", n).spec as { dnsNames?: string[] }).dnsNames ?? [];
  assert.ok(has(r, "Certificate", "callplane-ca"));
  assert.ok(dns("worker-callback-proxy-frontend").includes("*.worker.callplane.example.com"));
  assert.deepEqual(dns("invocation-service-worker-tls"), ["*.invocation.nvcf.svc.cluster.local"]);
  assert.deepEqual(dns("grpc-proxy-worker-tls"), ["*.grpc-headless.nvcf.svc.cluster.local"]);
  // no RBAC for the compute agent: the local backend never calls the API server
  assert.ok(!has(r, "Role", "compute-agent"));
  assert.ok(!has(r, "RoleBinding", "compute-agent"));
  // with the kubernetes backend, in the workers' namespace (test/unit/admission-review.test.ts)
  const kube = renderExample("kubernetes");
  assert.equal(find(kube, "Role", "compute-agent").metadata.namespace, "callplane-workers");
  assert.ok(has(kube, "RoleBinding", "compute-agent"));
});

void test("the compute agent's own identity token: projected for nvcf-icms:<clusterId> on kubernetes only", (t) => {
  type AgentPod = {
    volumes: Array<{ name: string; projected?: unknown }>;
    containers: Array<{ volumeMounts: Array<{ name: string; mountPath: string; readOnly?: boolean }> }>;
  };
  const agentPod = (r: RenderResult) =>
    (find(r, "Deployment", "compute-agent").spec as { template: { spec: AgentPod } }).template.spec;
  const kube = agentPod(
    renderDoc(t, {
      compute: { backend: "kubernetes", workerIdentity: { clusterId: "east-1" } },
      kubernetes: { image: "registry.example.com/callplane:0.1.0" },
    }),
  );
  assert.deepEqual(kube.volumes.find((v) => v.name === "identity-token")?.projected, {
    sources: [
      { serviceAccountToken: { audience: "nvcf-icms:east-1", expirationSeconds: 3600, path: "token" } },
    ],
  });
  assert.deepEqual(
    kube.containers[0].volumeMounts.find((m) => m.name === "identity-token"),
    // compute.kubernetes.identityTokenFile's default is <this>/token (cluster-keys.test.ts)
    { name: "identity-token", mountPath: "/var/run/secrets/callplane/identity", readOnly: true },
  );
  // the local agent never talks to the API server: no token of it reaches its pod
  const local = agentPod(renderExample("split-plane"));
  assert.ok(!local.volumes.some((v) => v.name === "identity-token"));
  assert.ok(!local.containers[0].volumeMounts.some((m) => m.name === "identity-token"));
});

void test("no Secret is rendered; each one the pods reference is listed by name", () => {
  for (const name of EXAMPLES) {
    const r = renderExample(name);
    assert.ok(!objects(r).some((o) => o.kind === "Secret"), `${name}: a Secret was rendered`);
    const text = r.files.map((f) => fileText(f, name)).join("\n");
    assert.doesNotMatch(text, /BEGIN [A-Z ]*PRIVATE KEY|SU[A-Z2-7]{50,}/, `${name}: key material`);
    const referenced = new Set([...text.matchAll(/secretName: ([a-z0-9-]+)/g)].map((m) => m[1]));
    const listed = new Set(r.secrets.map((s) => s.name));
    const issued = new Set(
      objects(r)
        .filter((o) => o.kind === "Certificate")
        .map((o) => (o.spec as { secretName: string }).secretName),
    );
    for (const s of referenced)
      assert.ok(listed.has(s) || issued.has(s), `${name}: ${s} is neither listed nor issued`);
  }
  const split = renderExample("split-plane");
  assert.ok(split.secrets.some((s) => s.name === "callplane-database" && s.keys.includes("url")));
  assert.doesNotMatch(
    (find(split, "ConfigMap", "callplane-config") as unknown as { data: Record<string, string> }).data[
      "callplane.yaml"
    ],
    /database:\s*\n\s*url/,
  );
});

void test("workers may reach only the proxy and NATS (and DNS)", () => {
  const r = renderExample("split-plane");
  const np = find(r, "NetworkPolicy", "callplane-workers-egress");
  assert.equal(np.metadata.namespace, "callplane-workers");
  const egress = (
    np.spec as { egress: Array<{ to: Array<{ podSelector: { matchLabels: Record<string, string> } }> }> }
  ).egress;
  const targets = egress.flatMap((e) =>
    e.to.map(
      (t) => t.podSelector.matchLabels["app.kubernetes.io/name"] ?? t.podSelector.matchLabels["k8s-app"],
    ),
  );
  assert.deepEqual(targets.sort(), ["kube-dns", "nats", "worker-callback-proxy"]);
});

// ---------------------------------------------------------------- pod annotations

void test("pod annotations pass through unchanged; unset renders nothing but the config checksum", (t) => {
  const r = renderExample("split-plane");
  const inv = template(find(r, "Deployment", "invocation-service")).metadata.annotations;
  assert.deepEqual(Object.keys(inv).sort(), [
    "checksum/config",
    "prometheus.io/port",
    "prometheus.io/scrape",
  ]);
  assert.equal(inv["prometheus.io/scrape"], "true");
  assert.match(inv["checksum/config"], /^[0-9a-f]{64}$/);
  const compute = template(find(r, "Deployment", "compute-agent")).metadata.annotations;
  assert.deepEqual(Object.keys(compute), ["checksum/config"]);
  const nats = (find(r, "StatefulSet", "nats").spec as { template: PodTemplate }).template.metadata
    .annotations;
  assert.equal(nats["prometheus.io/port"], "8222");

  // every section the seed names, and one per other service, lands on its pods
  const doc = {
    api: { podAnnotations: { "a.example.com/api": "1" } },
    apikeys: { podAnnotations: { "a.example.com/apikeys": "2" } },
    ess: { podAnnotations: { "a.example.com/ess": "3" } },
    invocation: { podAnnotations: { "a.example.com/inv": "4" } },
    grpcproxy: { podAnnotations: { "a.example.com/grpc": "5" } },
    natsAuthCalloutService: { podAnnotations: { "a.example.com/callout": "6" } },
    nats: { podAnnotations: { "a.example.com/nats": "7" } },
    workerCallbackProxy: { podAnnotations: { "a.example.com/proxy": "8" } },
    adminIssuerProxy: { podAnnotations: { "a.example.com/issuer": "9" } },
    compute: { podAnnotations: { "a.example.com/compute": "10" } },
  };
  const all = renderDoc(t, doc);
  const on = (kind: string, name: string) =>
    (find(all, kind, name).spec as { template: PodTemplate }).template.metadata.annotations;
  assert.equal(on("Deployment", "nvcf-api")["a.example.com/api"], "1");
  assert.equal(on("Deployment", "nvcf-api")["a.example.com/apikeys"], "2");
  assert.equal(on("Deployment", "nvcf-api")["a.example.com/ess"], "3");
  assert.equal(on("Deployment", "invocation-service")["a.example.com/inv"], "4");
  assert.equal(on("Deployment", "grpc-proxy-deployment")["a.example.com/grpc"], "5");
  assert.equal(on("Deployment", "nats-auth-callout-service")["a.example.com/callout"], "6");
  assert.equal(on("StatefulSet", "nats")["a.example.com/nats"], "7");
  assert.equal(on("Deployment", "worker-callback-proxy")["a.example.com/proxy"], "8");
  assert.equal(on("Deployment", "admin-token-issuer-proxy")["a.example.com/issuer"], "9");
  assert.equal(on("Deployment", "compute-agent")["a.example.com/compute"], "10");
  assert.equal(on("Deployment", "compute-agent")["a.example.com/api"], undefined);
});

void test("the config checksum follows the pods' configuration, not the manifest-only keys", (t) => {
  const sum = (r: RenderResult) =>
    template(find(r, "Deployment", "invocation-service")).metadata.annotations["checksum/config"];
  const base = sum(renderDoc(t, {}));
  assert.equal(
    sum(renderDoc(t, { invocation: { podAnnotations: { "x.example.com/y": "z" }, replicaCount: 5 } })),
    base,
  );
  assert.notEqual(sum(renderDoc(t, { log: { level: "debug" } })), base);
});

void test("reserved, malformed and non-string annotations are refused by key", (t) => {
  const cases: Array<[unknown, string[]]> = [
    [
      { invocation: { podAnnotations: { "checksum/config": "x" } } },
      ["invocation.podAnnotations", "checksum/config"],
    ],
    [
      { nats: { podAnnotations: { "nvcf.nvidia.com/nats-worker-auth-mode": "x" } } },
      ["nats.podAnnotations", "nvcf.nvidia.com/nats-worker-auth-mode"],
    ],
    [
      { grpcproxy: { podAnnotations: { "example.com/port": 8080 } } },
      ["grpcproxy.podAnnotations", "example.com/port", "string"],
    ],
    [{ ess: { podAnnotations: { "example.com/on": true } } }, ["ess.podAnnotations", "example.com/on"]],
    [{ compute: { podAnnotations: { "bad key!": "x" } } }, ["compute.podAnnotations", "bad key!"]],
    [
      {
        api: { podAnnotations: { "example.com/t": "a" } },
        apikeys: { podAnnotations: { "example.com/t": "b" } },
      },
      ["api.podAnnotations.example.com/t", "apikeys.podAnnotations.example.com/t"],
    ],
  ];
  for (const [doc, keys] of cases) assertNames(refusal(t, doc), keys);
});

// ---------------------------------------------------------------- the edge

void test("nothing inside the cluster reaches the admin issuer; with its route on, the Gateway's namespace may", (t) => {
  type Policy = { ingress: Array<{ from: Array<{ namespaceSelector: { matchExpressions: unknown[] } }> }> };
  const routed = find(renderDoc(t, {}), "NetworkPolicy", "admin-token-issuer-proxy-ingress").spec as Policy;
  assert.equal(routed.ingress.length, 1);
  assert.deepEqual(routed.ingress[0].from[0].namespaceSelector.matchExpressions, [
    { key: "kubernetes.io/metadata.name", operator: "NotIn", values: ["nvcf", "callplane-workers"] },
  ]);
  const split = find(renderExample("split-plane"), "NetworkPolicy", "admin-token-issuer-proxy-ingress")
    .spec as Policy;
  assert.deepEqual(split.ingress, [], "no route: no one");
  assert.ok(
    !has(
      renderDoc(t, { adminIssuerProxy: { enabled: false } }),
      "NetworkPolicy",
      "admin-token-issuer-proxy-ingress",
    ),
  );
});

void test("the admin issuer's route exists only with adminIssuerProxy.gateway.enabled (and the issuer on)", (t) => {
  assert.ok(has(renderDoc(t, {}), "HTTPRoute", "admin-token-issuer-proxy"));
  const split = renderExample("split-plane");
  assert.ok(!has(split, "HTTPRoute", "admin-token-issuer-proxy"));
  assert.ok(
    has(split, "Service", "admin-token-issuer-proxy"),
    "the Service stays, for callplane init in the cluster",
  );
  const off = renderDoc(t, { adminIssuerProxy: { enabled: false } });
  assert.ok(!has(off, "HTTPRoute", "admin-token-issuer-proxy"));
  assert.ok(!has(off, "Deployment", "admin-token-issuer-proxy"));
});

void test("Gateway listeners: the proxy's TLS passthrough, and worker-tcp for a shared tunnel address", (t) => {
  const listeners = (r: RenderResult) =>
    (
      find(r, "Gateway", "callplane").spec as {
        listeners: Array<{ name: string; protocol: string; port: number }>;
      }
    ).listeners;
  const split = listeners(renderExample("split-plane"));
  assert.ok(split.some((l) => l.name === "worker-tls" && l.protocol === "TLS"));
  assert.ok(has(renderExample("split-plane"), "TLSRoute", "worker-callback-proxy"));
  const shared = renderDoc(t, {
    workerCallbackProxy: { enabled: false },
    grpcproxy: { workerConnectBaseURL: "http://grpc.callplane.example.com:10086" },
    ingress: { gatewayApi: { routes: { grpcWorker: { enabled: true, listenerName: "worker-tcp" } } } },
  });
  const l = listeners(shared).find((x) => x.name === "worker-tcp");
  assert.ok(l, "a worker-tcp listener");
  assert.equal(l.protocol, "TCP");
  assert.equal(l.port, 10086);
  assert.ok(has(shared, "TCPRoute", "grpc-worker"));
});

void test("an autoscaler renders an HPA and leaves the replica count to it", (t) => {
  const r = renderDoc(t, { invocation: { autoscaling: { enabled: true, minReplicas: 2, maxReplicas: 6 } } });
  const hpa = find(r, "HorizontalPodAutoscaler", "invocation-service").spec as {
    minReplicas: number;
    maxReplicas: number;
  };
  assert.deepEqual([hpa.minReplicas, hpa.maxReplicas], [2, 6]);
  assert.equal(
    (find(r, "Deployment", "invocation-service").spec as { replicas?: number }).replicas,
    undefined,
  );
  assert.ok(!has(renderDoc(t, {}), "HorizontalPodAutoscaler", "invocation-service"));
});

// ---------------------------------------------------------------- refusals

void test("render refuses what start-up refuses, naming the fields (the config loader's own rules)", (t) => {
  const cases: Array<[unknown, string[]]> = [
    [
      {
        workerCallbackProxy: { enabled: false },
        invocation: { replicaCount: 3, selfAddress: "http://lb.example.com:8080", relay: { enabled: false } },
      },
      ["invocation.replicaCount", "invocation.relay.enabled"],
    ],
    [
      { grpcproxy: { workerConnectBaseURL: "http://grpc.example.com:10086" } },
      ["grpcproxy.workerConnectBaseURL"],
    ],
    [{ nats: { workerAuth: "anonymous" } }, ["nats.workerAuth"]],
    [{ invocation: { replicas: 3 } }, ["invocation.replicas"]],
  ];
  for (const [doc, keys] of cases) {
    const msg = refusal(t, doc);
    assert.match(msg, /invalid configuration/, "the config loader's message");
    assertNames(msg, keys);
  }
});

void test("render refuses what only matters on Kubernetes, naming the fields", (t) => {
  const cases: Array<[unknown, string[]]> = [
    [{ api: { replicaCount: 2 } }, ["api.replicaCount", "api.database.driver"]],
    [{ global: { serviceDomain: "callplane.example.com" } }, ["global.serviceDomain"]],
    [{ api: { url: "http://127.0.0.1:8080" } }, ["api.url", "loopback"]],
    [{ workerCallbackProxy: { podNetworks: ["127.0.1.0/24"] } }, ["workerCallbackProxy.podNetworks"]],
    [{ nats: { stream: { replicas: 5 } } }, ["nats.stream.replicas"]],
    [{ kubernetes: { workerNamespace: "nvcf" } }, ["kubernetes.workerNamespace"]],
    [{ invocation: { port: 0 } }, ["invocation.port"]],
    [
      { ingress: { gatewayApi: { routes: { grpcWorker: { enabled: true } } } } },
      ["ingress.gatewayApi.routes.grpcWorker.enabled", "grpcproxy.workerConnectBaseURL"],
    ],
    [
      {
        workerCallbackProxy: { tls: { frontend: { certFile: "/etc/proxy.crt", keyFile: "/etc/proxy.key" } } },
      },
      ["workerCallbackProxy.tls.frontend.certFile"],
    ],
  ];
  for (const [doc, keys] of cases) {
    const msg = refusal(t, doc);
    assert.match(msg, /^cannot render env\.yaml:/);
    assertNames(msg, keys);
  }
});

void test("the output folder: written files, a stale one removed, a foreign one refused", (t) => {
  const dir = tmpDir(t, "callplane-render-out-");
  const r = renderExample("split-plane");
  writeRendered(r, dir, "split-plane.yaml");
  assert.deepEqual(readdirSync(dir).sort(), r.files.map((f) => f.name).sort());
  // the one-machine plane has no callback proxy: its file from the previous render goes
  const out = writeRendered(renderExample("one-machine"), dir, "one-machine.yaml");
  assert.ok(out.removed.includes("32-worker-callback-proxy.yaml"));
  writeFileSync(join(dir, "mine.yaml"), "kind: ConfigMap\n");
  assert.throws(() => writeRendered(r, dir, "split-plane.yaml"), /mine\.yaml/);
});

void test("bin/callplane render: writes YAML files, and exits non-zero with the key named", async (t) => {
  const dir = tmpDir(t, "callplane-render-cli-");
  const ok = await runCli(["render", "-f", join(examplesDir, "split-plane.yaml"), "-o", join(dir, "out")]);
  assert.equal(ok.code, 0, ok.stderr);
  assert.match(readFileSync(join(dir, "out", "30-invocation.yaml"), "utf8"), /^kind: Deployment$/m);
  assert.match(ok.stdout, /callplane-database/, "the Secrets to create are listed");
  const bad = join(dir, "bad.yaml");
  writeFileSync(bad, 'invocation:\n  podAnnotations:\n    checksum/config: "x"\n');
  const refused = await runCli(["render", "-f", bad, "-o", join(dir, "bad")]);
  assert.notEqual(refused.code, 0);
  assert.match(refused.stderr, /invocation\.podAnnotations\.checksum\/config/);
  assert.ok(!existsSync(join(dir, "bad")), "nothing written");
  const k8s = join(dir, "k8s.yaml");
  writeFileSync(k8s, "api:\n  replicaCount: 3\n");
  const refusedK8s = await runCli(["render", "-f", k8s, "-o", join(dir, "k8s")]);
  assert.notEqual(refusedK8s.code, 0);
  assert.match(refusedK8s.stderr, /api\.replicaCount/);
});

void test("bin/callplane credentials generate writes a folder for every callplane-* Secret the manifests mount", async (t) => {
  const dir = tmpDir(t, "callplane-credentials-");
  const r = await runCli(["credentials", "generate", "-f", join(examplesDir, "split-plane.yaml"), "-o", dir]);
  assert.equal(r.code, 0, r.stderr);
  const rendered = renderExample("split-plane");
  for (const s of rendered.secrets.filter(
    (x) =>
      x.name.startsWith("callplane-") &&
      x.name !== "callplane-database" &&
      x.name !== "callplane-gateway-tls",
  )) {
    const have = readdirSync(join(dir, s.name));
    for (const k of s.keys) assert.ok(have.includes(k), `${s.name}/${k}`);
  }
  assert.match(r.stdout, /kubectl create secret generic callplane-database -n nvcf/);
  // the stack's admin signing key stays with the operator: the cluster gets its public key only
  assert.ok(readdirSync(join(dir, "private")).includes("admin-signing.key.pem"));
  assert.ok(!readdirSync(join(dir, "callplane-admin-key")).some((f) => f.includes(".key.")));
});

void test("the rendered nats.conf, with the auth block its init container writes, passes nats-server -t", async (t) => {
  const dir = tmpDir(t, "callplane-render-nats-");
  const r = renderExample("split-plane");
  const conf = (find(r, "ConfigMap", "nats-config") as unknown as { data: Record<string, string> }).data[
    "nats.conf"
  ];
  // the pod's mounts, moved into the folder: config/, auth/ (beside it, as ../auth), tls/, data, run
  for (const d of ["config", "auth", "tls", "data", "run"]) mkdirSync(join(dir, d));
  const local = conf
    .replaceAll("/etc/nats/tls/", `${join(dir, "tls")}/`)
    .replaceAll('"/data/', `"${join(dir, "data")}/`)
    .replaceAll("/var/run/nats/", `${join(dir, "run")}/`);
  assert.doesNotMatch(local, /"\/(etc|data|var)\//, "every pod path was moved");
  writeFileSync(join(dir, "config", "nats.conf"), local);
  // the init container's command, on keys from credentials generate
  const creds = join(dir, "creds");
  const gen = await runCli([
    "credentials",
    "generate",
    "-f",
    join(examplesDir, "split-plane.yaml"),
    "-o",
    creds,
  ]);
  assert.equal(gen.code, 0, gen.stderr);
  const auth = await runCli([
    "nats",
    "auth-config",
    "--credentials-dir",
    join(creds, "callplane-nats-keys"),
    "--region",
    "us-west-2",
    "--out",
    join(dir, "auth", "auth.conf"),
  ]);
  assert.equal(auth.code, 0, auth.stderr);
  const authConf = readFileSync(join(dir, "auth", "auth.conf"), "utf8");
  assert.match(authConf, /auth_callout/);
  assert.doesNotMatch(authConf, /\bSU[A-Z2-7]{20,}/, "no seed in the server's configuration");
  const ca = await createCa();
  const cert = await issueServerCert(ca, ["nats.nvcf.svc.cluster.local"]);
  writeFileSync(join(dir, "tls", "tls.crt"), cert.certPem);
  writeFileSync(join(dir, "tls", "tls.key"), cert.keyPem);
  writeFileSync(join(dir, "tls", "ca.crt"), ca.certPem);
  const check = spawnSync(natsServerBinary(), ["-t", "-c", join(dir, "config", "nats.conf")], {
    encoding: "utf8",
    env: { ...process.env, POD_NAME: "nats-0" },
  });
  assert.equal(check.status, 0, `nats-server -t: ${check.stdout}${check.stderr}`);
});

void test("the rendered haproxy.cfg, with its error files and the pod's certificates, passes haproxy -c", async (t) => {
  const dir = tmpDir(t, "callplane-render-haproxy-");
  const r = renderExample("split-plane");
  const data = (
    find(r, "ConfigMap", "worker-callback-proxy-haproxy") as unknown as { data: Record<string, string> }
  ).data;
  assert.deepEqual(Object.keys(data).sort(), ["400.http", "408.http", "haproxy.cfg"]);
  // the pod's mounts, moved into the folder: the ConfigMap, the frontend Secret, the stack CA, the
  // shared runtime API folder
  const moves: Array<[string, string]> = [
    ["/usr/local/etc/haproxy/", "config"],
    ["/etc/callplane/pki/proxy/", "frontend"],
    ["/etc/callplane/ca/", "ca"],
    ["/run/haproxy/", "run"],
  ];
  let cfg = data["haproxy.cfg"];
  for (const [from, to] of moves) {
    assert.ok(cfg.includes(from), `haproxy.cfg names ${from}`);
    mkdirSync(join(dir, to));
    cfg = cfg.replaceAll(from, `${join(dir, to)}/`);
  }
  assert.doesNotMatch(cfg, / \/(etc|usr|run)\//, "every pod path was moved");
  writeFileSync(join(dir, "config", "haproxy.cfg"), cfg);
  for (const f of ["400.http", "408.http"]) writeFileSync(join(dir, "config", f), data[f]);
  const ca = await createCa();
  const cert = await issueServerCert(ca, ["*.worker.callplane.example.com"]);
  // a kubernetes.io/tls Secret: the key beside the certificate
  writeFileSync(join(dir, "frontend", "tls.crt"), cert.certPem);
  writeFileSync(join(dir, "frontend", "tls.key"), cert.keyPem);
  writeFileSync(join(dir, "ca", "ca.crt"), ca.certPem);
  const check = spawnSync(haproxyBinary(), ["-c", "-f", join(dir, "config", "haproxy.cfg")], {
    encoding: "utf8",
  });
  assert.equal(check.status, 0, `haproxy -c: ${check.stdout}${check.stderr}`);
  // the pod starts HAProxy on that file, beside the keeper on the same socket
  const pod = template(find(r, "Deployment", "worker-callback-proxy")).spec as unknown as {
    containers: Array<{ name: string; image: string; command: string[] }>;
  };
  assert.deepEqual(
    pod.containers.map((c) => c.name),
    ["haproxy", "certificates"],
  );
  assert.equal(pod.containers[0].image, "haproxy:2.6");
  assert.deepEqual(pod.containers[0].command.slice(-2), ["-f", "/usr/local/etc/haproxy/haproxy.cfg"]);
  assert.deepEqual(pod.containers[1].command.slice(-2), ["--runtime-api", "/run/haproxy/admin.sock"]);
});
