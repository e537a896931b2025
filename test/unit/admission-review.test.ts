// The admission webhook (src/services/admission-webhook/): the decision on every pod-bearing kind,
// both account fields, CREATE and UPDATE, the compute agent, the nodes and TokenRequests; then the
// HTTPS server in-process: an answer the API server can read, and a clear 400 for what is not a
// review; and the rendered registration, which must send the webhook every kind it checks.
import assert from "node:assert/strict";
import { request as httpsRequest } from "node:https";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { computeAgentUsername } from "../../src/lib/config/index.js";
import { parseAdmissionReview } from "../../src/services/admission-webhook/review-request.js";
import { OTHER_REVIEWED, reviewAdmission } from "../../src/services/admission-webhook/review.js";
import {
  ACCOUNT_FIELDS,
  POD_SPEC_PATHS,
  type PodBearingKind,
} from "../../src/services/admission-webhook/reserved-names.js";
import { MAX_REVIEW_BYTES, createAdmissionWebhook } from "../../src/services/admission-webhook/service.js";
import { OTHER_RESOURCES, POD_BEARING_RESOURCES } from "../../src/deploy/render/admission-webhook.js";
import { COMPUTE_AGENT_CLUSTER_RULES, COMPUTE_AGENT_RULES } from "../../src/deploy/render/compute.js";
import { renderFile } from "../../src/deploy/index.js";
import { repoRoot } from "../testkit/index.js";
import { startTestWebhook } from "../testkit/kube-setup.js";

const AGENT = "system:serviceaccount:nvcf:compute-agent";
const policy = { agentUsername: AGENT };

const GROUPS: Record<PodBearingKind, string> = {
  Pod: "",
  ReplicationController: "",
  PodTemplate: "",
  Deployment: "apps",
  StatefulSet: "apps",
  ReplicaSet: "apps",
  DaemonSet: "apps",
  Job: "batch",
  CronJob: "batch",
};
const KINDS = Object.keys(POD_SPEC_PATHS) as PodBearingKind[];

/** An object of `kind` whose pod spec sets `field` to `account`. */
function objectOf(kind: PodBearingKind, field: string, account: string): Record<string, unknown> {
  const spec: Record<string, unknown> = {
    containers: [{ name: "c", image: "example.com/x:1" }],
    [field]: account,
  };
  let inner: Record<string, unknown> = spec;
  for (const key of [...POD_SPEC_PATHS[kind]].reverse()) inner = { [key]: inner };
  return { apiVersion: "v1", kind, metadata: { name: "x", namespace: "workers" }, ...inner };
}

interface Req {
  kind: string;
  group?: string;
  operation?: string;
  object?: unknown;
  oldObject?: unknown;
  user?: string;
  groups?: string[];
  name?: string;
  resource?: { group: string; version: string; resource: string };
  subResource?: string;
  uid?: string;
}

function review(r: Req): Record<string, unknown> {
  return {
    apiVersion: "admission.k8s.io/v1",
    kind: "AdmissionReview",
    request: {
      uid: r.uid ?? "705ab4f5-6393-11e8-b7cc-42010a800002",
      kind: { group: r.group ?? "", version: "v1", kind: r.kind },
      resource: r.resource ?? { group: r.group ?? "", version: "v1", resource: `${r.kind.toLowerCase()}s` },
      ...(r.subResource ? { subResource: r.subResource } : {}),
      requestKind: { group: r.group ?? "", version: "v1", kind: r.kind },
      name: r.name ?? "x",
      namespace: "workers",
      operation: r.operation ?? "CREATE",
      userInfo: {
        username: r.user ?? "admin",
        groups: r.groups ?? ["system:masters", "system:authenticated"],
      },
      object: r.object,
      oldObject: r.oldObject ?? null,
      dryRun: false,
    },
  };
}

const decide = (r: Req) => reviewAdmission(parseAdmissionReview(review(r)), policy);

function tokenRequest(account: string, user: string, groups: string[] = ["system:authenticated"]): Req {
  return {
    kind: "TokenRequest",
    group: "authentication.k8s.io",
    resource: { group: "", version: "v1", resource: "serviceaccounts" },
    subResource: "token",
    name: account,
    user,
    groups,
    object: { apiVersion: "authentication.k8s.io/v1", kind: "TokenRequest", spec: { audiences: ["x"] } },
  };
}

// ---------------------------------------------------------------- the decision

void test("every pod-bearing kind, either account field, CREATE and UPDATE: refused, naming the field path", () => {
  for (const kind of KINDS)
    for (const field of ACCOUNT_FIELDS)
      for (const operation of ["CREATE", "UPDATE"]) {
        const what = `${operation} ${kind} ${field}`;
        const r = decide({
          kind,
          group: GROUPS[kind],
          operation,
          object: objectOf(kind, field, "nvcf-worker-x"),
          uid: `uid-${kind}-${field}-${operation}`,
        });
        assert.equal(r.outcome, "refused", what);
        assert.equal(r.kind, kind, what);
        assert.equal(r.answer.apiVersion, "admission.k8s.io/v1");
        assert.equal(r.answer.kind, "AdmissionReview");
        assert.equal(
          r.answer.response.uid,
          `uid-${kind}-${field}-${operation}`,
          `${what}: the uid is copied`,
        );
        assert.equal(r.answer.response.allowed, false, what);
        assert.equal(r.answer.response.status?.code, 403, what);
        const path = [...POD_SPEC_PATHS[kind], field].join(".");
        assert.equal(
          r.answer.response.status?.message,
          `${path} "nvcf-worker-x": service accounts starting with nvcf-worker- are reserved for callplane's worker pods; only the compute agent (${AGENT}) may use them`,
          what,
        );
      }
});

void test("the field paths: spec, spec.template.spec, spec.jobTemplate.spec.template.spec, template.spec", () => {
  const path = (kind: PodBearingKind) =>
    decide({ kind, object: objectOf(kind, "serviceAccountName", "nvcf-worker-a") }).reserved[0];
  assert.equal(path("Pod"), 'spec.serviceAccountName "nvcf-worker-a"');
  for (const k of [
    "Deployment",
    "StatefulSet",
    "ReplicaSet",
    "DaemonSet",
    "Job",
    "ReplicationController",
  ] as const)
    assert.equal(path(k), 'spec.template.spec.serviceAccountName "nvcf-worker-a"', k);
  assert.equal(path("CronJob"), 'spec.jobTemplate.spec.template.spec.serviceAccountName "nvcf-worker-a"');
  assert.equal(path("PodTemplate"), 'template.spec.serviceAccountName "nvcf-worker-a"');
});

void test("both fields set: both are named", () => {
  const object = objectOf("Pod", "serviceAccountName", "nvcf-worker-a");
  (object.spec as Record<string, unknown>).serviceAccount = "nvcf-worker-b";
  const r = decide({ kind: "Pod", object });
  assert.equal(r.outcome, "refused");
  assert.match(
    r.message ?? "",
    /^spec\.serviceAccountName "nvcf-worker-a", spec\.serviceAccount "nvcf-worker-b": /,
  );
});

void test("the compute agent may use the reserved accounts: every kind, both fields, CREATE and UPDATE", () => {
  for (const kind of KINDS)
    for (const field of ACCOUNT_FIELDS)
      for (const operation of ["CREATE", "UPDATE"]) {
        const r = decide({
          kind,
          operation,
          user: AGENT,
          groups: [],
          object: objectOf(kind, field, "nvcf-worker-x"),
        });
        assert.equal(r.outcome, "allowed", `${operation} ${kind} ${field}`);
        assert.deepEqual(r.answer.response, { uid: "705ab4f5-6393-11e8-b7cc-42010a800002", allowed: true });
      }
});

void test("only the agent's exact username counts: another account of its namespace, or of the same name elsewhere, is refused", () => {
  for (const user of [
    "system:serviceaccount:nvcf:compute-agent2",
    "system:serviceaccount:other:compute-agent",
    "compute-agent",
    "system:serviceaccount:nvcf:compute-agent ",
  ]) {
    const r = decide({ kind: "Pod", user, object: objectOf("Pod", "serviceAccountName", "nvcf-worker-x") });
    assert.equal(r.outcome, "refused", user);
  }
});

void test("a node may not run a pod as a reserved account (the nodes are allowed TokenRequests only)", () => {
  const r = decide({
    kind: "Pod",
    user: "system:node:n1",
    groups: ["system:nodes", "system:authenticated"],
    object: objectOf("Pod", "serviceAccountName", "nvcf-worker-x"),
  });
  assert.equal(r.outcome, "refused");
});

void test("objects without a reserved account are allowed, whoever sends them", () => {
  for (const kind of KINDS)
    for (const account of [
      "default",
      "nvcf-worker",
      "nvcf-workerx",
      "my-nvcf-worker-x",
      "NVCF-WORKER-x",
      "",
    ]) {
      const r = decide({ kind, object: objectOf(kind, "serviceAccountName", account) });
      assert.equal(r.outcome, "allowed", `${kind} ${JSON.stringify(account)}`);
    }
  // no account at all
  assert.equal(decide({ kind: "Pod", object: { spec: { containers: [] } } }).outcome, "allowed");
});

void test("kinds the webhook does not check are allowed, as are DELETE, CONNECT and subresources", () => {
  for (const kind of ["ConfigMap", "Service", "ServiceAccount", "Scale", "Binding"]) {
    const r = decide({ kind, object: { spec: { serviceAccountName: "nvcf-worker-x" } } });
    assert.equal(r.outcome, "allowed", kind);
    assert.equal(r.kind, "other", kind);
  }
  for (const operation of ["DELETE", "CONNECT"])
    assert.equal(
      decide({ kind: "Pod", operation, object: objectOf("Pod", "serviceAccountName", "nvcf-worker-x") })
        .outcome,
      "allowed",
      operation,
    );
  // the kubelet writes pods/status of the worker pods
  const status = decide({
    kind: "Pod",
    operation: "UPDATE",
    subResource: "status",
    user: "system:node:n1",
    object: objectOf("Pod", "serviceAccountName", "nvcf-worker-x"),
  });
  assert.equal(status.outcome, "allowed");
});

void test("UPDATE: a reserved account already at its path passes (a label, a finalizer, the garbage collector); a new one is refused", () => {
  for (const kind of KINDS)
    for (const field of ACCOUNT_FIELDS) {
      const what = `${kind} ${field}`;
      const old = objectOf(kind, field, "nvcf-worker-x");
      const labelled = structuredClone(old);
      (labelled.metadata as Record<string, unknown>).labels = { touched: "yes" };
      (labelled.metadata as Record<string, unknown>).finalizers = ["example.com/hold"];
      const kept = decide({
        kind,
        group: GROUPS[kind],
        operation: "UPDATE",
        object: labelled,
        oldObject: old,
      });
      assert.equal(kept.outcome, "allowed", `${what}: kept`);
      assert.deepEqual(kept.reserved, [], what);
      // and the finalizer removed again
      assert.equal(
        decide({ kind, operation: "UPDATE", object: old, oldObject: labelled }).outcome,
        "allowed",
        `${what}: finalizer removed`,
      );
      // brought in by the update: from another account, or from none
      for (const before of [objectOf(kind, field, "plain"), objectOf(kind, field, "nvcf-worker-y"), {}]) {
        const r = decide({ kind, operation: "UPDATE", object: old, oldObject: before });
        assert.equal(r.outcome, "refused", `${what}: introduced`);
        assert.deepEqual(r.reserved, [`${[...POD_SPEC_PATHS[kind], field].join(".")} "nvcf-worker-x"`]);
      }
      // the same name at the other field is another path: new there
      const other = field === "serviceAccountName" ? "serviceAccount" : "serviceAccountName";
      assert.equal(
        decide({ kind, operation: "UPDATE", object: old, oldObject: objectOf(kind, other, "nvcf-worker-x") })
          .outcome,
        "refused",
        `${what}: moved`,
      );
    }
  // an UPDATE without its oldObject is judged as a CREATE
  assert.equal(
    decide({
      kind: "Pod",
      operation: "UPDATE",
      object: objectOf("Pod", "serviceAccountName", "nvcf-worker-x"),
    }).outcome,
    "refused",
  );
});

/** A pod spec that references `secret` in each of the places a pod can take a Secret from. */
function specReferencing(secret: string): Record<string, unknown> {
  const container = (name: string) => ({
    name,
    image: "example.com/x:1",
    env: [
      { name: "A", value: "a" },
      { name: "S", valueFrom: { secretKeyRef: { name: secret, key: "k" } } },
    ],
    envFrom: [{ configMapRef: { name: "c" } }, { secretRef: { name: secret } }],
  });
  return {
    serviceAccountName: "plain",
    volumes: [
      { name: "e", emptyDir: {} },
      { name: "s", secret: { secretName: secret } },
      {
        name: "p",
        projected: { sources: [{ configMap: { name: "c" } }, { secret: { name: secret } }] },
      },
    ],
    containers: [container("c")],
    initContainers: [container("i")],
    ephemeralContainers: [container("d")],
  };
}

function objectWithSpec(kind: PodBearingKind, spec: Record<string, unknown>): Record<string, unknown> {
  let inner: Record<string, unknown> = spec;
  for (const key of [...POD_SPEC_PATHS[kind]].reverse()) inner = { [key]: inner };
  return { apiVersion: "v1", kind, metadata: { name: "x", namespace: "workers" }, ...inner };
}

void test("a worker pod's Secrets (cp-*-worker, cp-*-secrets): every place a pod spec names a Secret, every kind, refused naming each field path", () => {
  const places = [
    "volumes[1].secret.secretName",
    "volumes[2].projected.sources[1].secret.name",
    ...["containers", "initContainers", "ephemeralContainers"].flatMap((c) => [
      `${c}[0].env[1].valueFrom.secretKeyRef.name`,
      `${c}[0].envFrom[1].secretRef.name`,
    ]),
  ];
  for (const secret of ["cp-0b5e-worker", "cp-0b5e-secrets"])
    for (const kind of KINDS)
      for (const operation of ["CREATE", "UPDATE"]) {
        const what = `${operation} ${kind} ${secret}`;
        const object = objectWithSpec(kind, specReferencing(secret));
        const r = decide({ kind, group: GROUPS[kind], operation, object });
        assert.equal(r.outcome, "refused", what);
        const path = POD_SPEC_PATHS[kind].join(".");
        assert.deepEqual(
          r.reserved,
          places.map((p) => `${path}.${p} ${JSON.stringify(secret)}`),
          what,
        );
        assert.equal(
          r.message,
          `${r.reserved.join(", ")}: the Secrets cp-<id>-worker and cp-<id>-secrets hold a worker pod's NATS credential and its function's secrets; only the compute agent (${AGENT}) may use them`,
          what,
        );
        // the agent's own pods take them; an update that keeps them passes (the garbage collector)
        assert.equal(decide({ kind, operation, object, user: AGENT, groups: [] }).outcome, "allowed", what);
        const labelled = structuredClone(object);
        (labelled.metadata as Record<string, unknown>).labels = { touched: "yes" };
        assert.equal(
          decide({ kind, operation: "UPDATE", object: labelled, oldObject: object }).outcome,
          "allowed",
          `${what}: kept`,
        );
      }
  // other names are anyone's
  for (const secret of [
    "cp-worker",
    "cp--worker",
    "worker",
    "x-cp-a-worker",
    "cp-a-worker-2",
    "cp-a-other",
    "CP-A-WORKER",
  ])
    assert.equal(
      decide({ kind: "Pod", object: objectWithSpec("Pod", specReferencing(secret)) }).outcome,
      "allowed",
      secret,
    );
  // an account and a Secret: both named, each with its reason
  const both = objectWithSpec("Pod", {
    ...specReferencing("cp-a-worker"),
    serviceAccountName: "nvcf-worker-a",
  });
  const r = decide({ kind: "Pod", object: both });
  assert.match(
    r.message ?? "",
    /^spec\.serviceAccountName "nvcf-worker-a": service accounts starting with nvcf-worker- are reserved for callplane's worker pods; spec\.volumes\[1\]\.secret\.secretName "cp-a-worker", .*: the Secrets cp-<id>-worker and cp-<id>-secrets hold .*; only the compute agent \(system:serviceaccount:nvcf:compute-agent\) may use them$/,
  );
});

void test("pods/ephemeralcontainers: refused for anyone but the agent in a pod that runs a reserved account", () => {
  const ephemeral = {
    name: "debug",
    image: "busybox",
    volumeMounts: [{ name: "nvcf-worker-token", mountPath: "/t" }],
  };
  // Kubernetes 1.20 to 1.22: the review's object is an EphemeralContainers, without the pod's account
  const v120 = (user: string, groups: string[] = ["system:masters"]) =>
    decide({
      kind: "EphemeralContainers",
      operation: "UPDATE",
      resource: { group: "", version: "v1", resource: "pods" },
      subResource: "ephemeralcontainers",
      name: "cp-1",
      user,
      groups,
      object: {
        apiVersion: "v1",
        kind: "EphemeralContainers",
        metadata: { name: "cp-1" },
        ephemeralContainers: [ephemeral],
      },
      oldObject: {
        apiVersion: "v1",
        kind: "EphemeralContainers",
        metadata: { name: "cp-1" },
        ephemeralContainers: [],
      },
    });
  const refused = v120("admin");
  assert.equal(refused.outcome, "refused");
  assert.equal(refused.kind, "EphemeralContainers");
  assert.match(
    refused.message ?? "",
    /^pods\/cp-1\/ephemeralcontainers: this review \(kind EphemeralContainers\) does not carry the pod's service account.*only the compute agent \(system:serviceaccount:nvcf:compute-agent\) may add ephemeral containers here$/,
  );
  assert.equal(v120("system:node:n1", ["system:nodes"]).outcome, "refused", "a node");
  assert.equal(v120(AGENT, []).outcome, "allowed", "the agent");
  // 1.23 and later: the review's object is the Pod
  const pod = (account: string, ephemeralContainers: unknown[]) => ({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name: "cp-1" },
    spec: { serviceAccountName: account, containers: [{ name: "c", image: "x" }], ephemeralContainers },
  });
  const v123 = (account: string, user = "admin", added: unknown = ephemeral) =>
    decide({
      kind: "Pod",
      operation: "UPDATE",
      resource: { group: "", version: "v1", resource: "pods" },
      subResource: "ephemeralcontainers",
      user,
      object: pod(account, [added]),
      oldObject: pod(account, []),
    });
  const worker = v123("nvcf-worker-cp-1");
  assert.equal(worker.outcome, "refused");
  assert.equal(worker.kind, "EphemeralContainers");
  assert.match(
    worker.message ?? "",
    /^spec\.serviceAccountName "nvcf-worker-cp-1": .*could read its token; only the compute agent .* may add ephemeral containers to it$/,
  );
  assert.equal(v123("nvcf-worker-cp-1", AGENT).outcome, "allowed");
  assert.equal(v123("plain").outcome, "allowed", "a pod of an ordinary account");
  const secretRef = { name: "d", image: "x", envFrom: [{ secretRef: { name: "cp-1-worker" } }] };
  const r = v123("plain", "admin", secretRef);
  assert.equal(r.outcome, "refused", "a worker's Secret, from an ephemeral container");
  assert.deepEqual(r.reserved, ['spec.ephemeralContainers[0].envFrom[0].secretRef.name "cp-1-worker"']);
});

void test("a legacy token Secret (kubernetes.io/service-account-token) for a worker account: refused for anyone but the agent", () => {
  const secret = (account: string | undefined, type = "kubernetes.io/service-account-token") => ({
    apiVersion: "v1",
    kind: "Secret",
    type,
    metadata: {
      name: "t",
      annotations: account === undefined ? {} : { "kubernetes.io/service-account.name": account },
    },
  });
  const r = decide({ kind: "Secret", object: secret("nvcf-worker-x") });
  assert.equal(r.outcome, "refused");
  assert.equal(r.kind, "Secret");
  assert.equal(
    r.message,
    `metadata.annotations["kubernetes.io/service-account.name"] "nvcf-worker-x": service accounts starting with nvcf-worker- are reserved for callplane's worker pods, and a Secret of type kubernetes.io/service-account-token for one gets a token that never expires; only the compute agent (${AGENT}) may create such a Secret`,
  );
  assert.equal(
    decide({
      kind: "Secret",
      operation: "UPDATE",
      object: secret("nvcf-worker-x"),
      oldObject: secret("plain"),
    }).outcome,
    "refused",
    "renamed to a worker account",
  );
  assert.equal(
    decide({ kind: "Secret", object: secret("nvcf-worker-x"), user: AGENT, groups: [] }).outcome,
    "allowed",
  );
  // the token controller fills in the token of a Secret the agent made
  const filled = { ...secret("nvcf-worker-x"), data: { token: "dA==" } };
  assert.equal(
    decide({
      kind: "Secret",
      operation: "UPDATE",
      object: filled,
      oldObject: secret("nvcf-worker-x"),
      user: "system:serviceaccount:kube-system:token-controller",
    }).outcome,
    "allowed",
  );
  for (const [what, o] of [
    ["another account", secret("plain")],
    ["no annotation", secret(undefined)],
    ["an Opaque Secret", secret("nvcf-worker-x", "Opaque")],
  ] as const)
    assert.equal(decide({ kind: "Secret", object: o }).outcome, "allowed", what);
  assert.equal(decide({ kind: "Secret", operation: "DELETE", object: null }).outcome, "allowed");
});

void test("TokenRequest for a reserved account: the agent and the nodes may, anyone else may not", () => {
  assert.equal(decide(tokenRequest("nvcf-worker-x", AGENT)).outcome, "allowed", "the agent");
  assert.equal(
    decide(tokenRequest("nvcf-worker-x", "system:node:n1", ["system:nodes", "system:authenticated"])).outcome,
    "allowed",
    "a kubelet",
  );
  assert.equal(
    decide(tokenRequest("nvcf-worker-x", "someone", ["system:nodes"])).outcome,
    "allowed",
    "by group",
  );
  for (const [user, groups] of [
    ["admin", ["system:masters", "system:authenticated"]],
    ["system:serviceaccount:workers:nvcf-worker-x", ["system:serviceaccounts"]],
    ["system:serviceaccount:nvcf:nvcf-api", ["system:serviceaccounts"]],
    ["system:nodes", []],
    // a username that looks like a node's is not a node: any authenticator may hand one out
    ["system:node:n1", []],
    ["system:node:n1", ["system:authenticated"]],
  ] as const) {
    const r = decide(tokenRequest("nvcf-worker-x", user, [...groups]));
    assert.equal(r.outcome, "refused", user);
    assert.equal(r.kind, "TokenRequest");
    assert.equal(r.answer.response.status?.code, 403);
    assert.equal(
      r.message,
      `TokenRequest for service account "nvcf-worker-x" (serviceaccounts/nvcf-worker-x/token): service accounts starting with nvcf-worker- are reserved for callplane's worker pods; only the compute agent (${AGENT}) and the nodes (group system:nodes) may request their tokens`,
    );
  }
  // any other account's tokens are not the webhook's business
  assert.equal(decide(tokenRequest("compute-agent", "admin")).outcome, "allowed");
  assert.equal(decide(tokenRequest("default", "someone")).outcome, "allowed");
});

void test("a TokenRequest is recognised by its resource and subresource as well as by its kind", () => {
  const r = tokenRequest("nvcf-worker-x", "admin");
  assert.equal(decide({ ...r, kind: "SomethingElse" }).outcome, "refused");
  assert.equal(
    decide({
      ...r,
      resource: { group: "", version: "v1", resource: "serviceaccounts" },
      kind: "TokenRequest",
      subResource: "",
    }).outcome,
    "refused",
  );
});

void test("malformed reviews are refused by name (ADMISSION_REVIEW_INVALID), never allowed", () => {
  const good = review({ kind: "Pod", object: objectOf("Pod", "serviceAccountName", "x") });
  const cases: Array<[string, unknown, RegExp]> = [
    ["not an object", [good], /not an AdmissionReview/],
    [
      "v1beta1",
      { ...good, apiVersion: "admission.k8s.io/v1beta1" },
      /apiVersion is "admission\.k8s\.io\/v1beta1".*admissionReviewVersions: \[v1\]/,
    ],
    ["no apiVersion", { ...good, apiVersion: undefined }, /apiVersion is null/],
    ["another kind", { ...good, kind: "Pod" }, /kind is "Pod", not AdmissionReview/],
    ["no request", { ...good, request: undefined }, /has no request/],
    ["no uid", { ...good, request: { ...(good.request as object), uid: "" } }, /no uid/],
    ["no kind", { ...good, request: { ...(good.request as object), kind: {} } }, /no kind/],
    [
      "no operation",
      { ...good, request: { ...(good.request as object), operation: undefined } },
      /no operation/,
    ],
    [
      "bad groups",
      { ...good, request: { ...(good.request as object), userInfo: { username: "a", groups: "x" } } },
      /groups must be a list/,
    ],
    [
      "no object",
      { ...good, request: { ...(good.request as object), object: null } },
      /CREATE review of a Pod has no request\.object/,
    ],
    ["TokenRequest without name", review({ ...tokenRequest("x", "admin"), name: "" }), /no request\.name/],
  ];
  for (const [what, body, message] of cases)
    assert.throws(
      () => reviewAdmission(parseAdmissionReview(body), policy),
      (err: unknown) => {
        const e = err as { code?: string; status?: number; message: string };
        assert.equal(e.code, "ADMISSION_REVIEW_INVALID", what);
        assert.equal(e.status, 400, what);
        assert.match(e.message, message, what);
        return true;
      },
      what,
    );
});

void test("the agent's username: admissionWebhook.agentUsername, else the compute-agent account of global.serviceDomain's namespace", () => {
  const c = (serviceDomain: string, agentUsername = "") => ({
    global: { serviceDomain },
    admissionWebhook: { agentUsername },
  });
  assert.equal(computeAgentUsername(c("nvcf.svc.cluster.local")), "system:serviceaccount:nvcf:compute-agent");
  assert.equal(
    computeAgentUsername(c("plane-2.svc.k8s.example")),
    "system:serviceaccount:plane-2:compute-agent",
  );
  assert.equal(computeAgentUsername(c("nvcf.svc.cluster.local", "tester")), "tester");
  assert.throws(
    () => computeAgentUsername(c("callplane.test")),
    /admissionWebhook\.agentUsername.*global\.serviceDomain/,
  );
});

// ---------------------------------------------------------------- the server

interface Answer {
  status: number;
  type: string | undefined;
  body: Record<string, unknown>;
}

async function startWebhook(t: TestContext) {
  const { hook, url, caPem } = await startTestWebhook(t, AGENT);
  const send = (
    method: string,
    path: string,
    body?: string | Buffer,
    headers: Record<string, string> = { "content-type": "application/json" },
  ) =>
    new Promise<Answer>((resolve, reject) => {
      const req = httpsRequest(
        {
          host: "127.0.0.1",
          port: url.port,
          path,
          method,
          ca: caPem,
          servername: "localhost",
          headers,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("end", () => {
            const text = Buffer.concat(chunks).toString();
            resolve({
              status: res.statusCode ?? 0,
              type: res.headers["content-type"],
              body: text.startsWith("{") ? (JSON.parse(text) as Record<string, unknown>) : { text },
            });
          });
        },
      );
      req.on("error", reject);
      req.end(body);
    });
  return { hook, url, send, post: (body: unknown) => send("POST", "/validate", JSON.stringify(body)) };
}

void test("server: POST /validate answers the API server's review over HTTPS (uid copied, allowed or refused)", async (t) => {
  const w = await startWebhook(t);
  const refused = await w.post(
    review({
      kind: "Deployment",
      group: "apps",
      uid: "u-1",
      object: objectOf("Deployment", "serviceAccount", "nvcf-worker-x"),
    }),
  );
  assert.equal(refused.status, 200);
  assert.equal(refused.type, "application/json");
  assert.deepEqual(refused.body, {
    apiVersion: "admission.k8s.io/v1",
    kind: "AdmissionReview",
    response: {
      uid: "u-1",
      allowed: false,
      status: {
        code: 403,
        message: `spec.template.spec.serviceAccount "nvcf-worker-x": service accounts starting with nvcf-worker- are reserved for callplane's worker pods; only the compute agent (${AGENT}) may use them`,
      },
    },
  });
  const allowed = await w.post(
    review({ kind: "Pod", uid: "u-2", object: objectOf("Pod", "serviceAccountName", "default") }),
  );
  assert.deepEqual(allowed.body, {
    apiVersion: "admission.k8s.io/v1",
    kind: "AdmissionReview",
    response: { uid: "u-2", allowed: true },
  });
  const metrics = await w.send("GET", "/metrics");
  assert.equal(metrics.status, 200);
  const text = String(metrics.body.text);
  assert.match(
    text,
    /callplane_admission_reviews_total\{kind="Deployment",outcome="refused",service="admission-webhook"\} 1/,
  );
  assert.match(
    text,
    /callplane_admission_reviews_total\{kind="Pod",outcome="allowed",service="admission-webhook"\} 1/,
  );
  const health = await w.send("GET", "/health");
  assert.deepEqual([health.status, health.body.status], [200, "ok"]);
});

void test("server: malformed reviews get 400 with a problem naming what is wrong (no request, no uid, wrong apiVersion, ...)", async (t) => {
  const w = await startWebhook(t);
  const good = review({ kind: "Pod", object: objectOf("Pod", "serviceAccountName", "x") });
  const cases: Array<[string, Promise<Answer>, number, string, RegExp]> = [
    ["no request", w.post({ ...good, request: undefined }), 400, "ADMISSION_REVIEW_INVALID", /no request/],
    [
      "no uid",
      w.post({ ...good, request: { ...(good.request as object), uid: undefined } }),
      400,
      "ADMISSION_REVIEW_INVALID",
      /no uid/,
    ],
    [
      "wrong apiVersion",
      w.post({ ...good, apiVersion: "admission.k8s.io/v1beta1" }),
      400,
      "ADMISSION_REVIEW_INVALID",
      /admission\.k8s\.io\/v1 only/,
    ],
    ["empty body", w.send("POST", "/validate"), 400, "ADMISSION_REVIEW_INVALID", /the body is empty/],
    ["not JSON", w.send("POST", "/validate", "{nope"), 400, "MALFORMED_JSON", /not valid JSON/],
    [
      "not an object",
      w.send("POST", "/validate", "[1]"),
      400,
      "ADMISSION_REVIEW_INVALID",
      /not an AdmissionReview/,
    ],
    [
      "form",
      w.send("POST", "/validate", "a=b", { "content-type": "application/x-www-form-urlencoded" }),
      415,
      "UNSUPPORTED_MEDIA_TYPE",
      /application\/json/,
    ],
    [
      "too large",
      w.send("POST", "/validate", Buffer.alloc(MAX_REVIEW_BYTES + 1, 0x20)),
      413,
      "BODY_TOO_LARGE",
      /limit/,
    ],
    ["GET", w.send("GET", "/validate"), 405, "METHOD_NOT_ALLOWED", /use POST/],
    ["another path", w.send("POST", "/mutate", "{}"), 404, "NOT_FOUND", /no route/],
  ];
  for (const [what, answer, status, code, detail] of cases) {
    const a = await answer;
    assert.equal(a.status, status, what);
    assert.equal(a.type, "application/problem+json", what);
    assert.equal(a.body.code, code, what);
    assert.match(String(a.body.detail), detail, what);
  }
  const metrics = await w.send("GET", "/metrics");
  assert.match(
    String(metrics.body.text),
    /callplane_admission_reviews_total\{kind="unknown",outcome="invalid",service="admission-webhook"\} [5-9]/,
  );
});

void test("server: HTTPS only, with both certificate files", () => {
  assert.throws(
    () =>
      createAdmissionWebhook({
        listen: { host: "127.0.0.1", port: 0 },
        tls: { certFile: "", keyFile: "" },
        agentUsername: AGENT,
      }),
    /admissionWebhook\.tls\.certFile and admissionWebhook\.tls\.keyFile/,
  );
});

// ---------------------------------------------------------------- the registration

void test("render (examples/kubernetes.yaml): the registration sends every kind the review checks, and TokenRequests; the agent's RBAC is the constant list", () => {
  const r = renderFile(join(repoRoot, "examples", "kubernetes.yaml"), { version: "0.0.0-test" });
  const objects = r.files.flatMap((f) => f.objects.map((o) => o.toJSON() as Record<string, unknown>));
  const vwc = objects.filter((o) => o.kind === "ValidatingWebhookConfiguration");
  assert.equal(vwc.length, 1);
  const [hook] = (vwc[0] as { webhooks: Array<Record<string, unknown>> }).webhooks;
  assert.equal(hook.failurePolicy, "Fail");
  assert.equal(hook.sideEffects, "None");
  assert.deepEqual(hook.admissionReviewVersions, ["v1"]);
  assert.deepEqual(hook.namespaceSelector, {
    matchLabels: { "kubernetes.io/metadata.name": "callplane-workers" },
  });
  assert.deepEqual(hook.clientConfig, {
    service: { namespace: "nvcf", name: "callplane-admission-webhook", path: "/validate", port: 443 },
  });
  assert.equal(
    (vwc[0] as { metadata: { annotations: Record<string, string> } }).metadata.annotations[
      "cert-manager.io/inject-ca-from"
    ],
    "nvcf/callplane-admission-webhook",
  );
  const rules = hook.rules as Array<{
    apiGroups: string[];
    apiVersions: string[];
    operations: string[];
    resources: string[];
  }>;
  const sent = new Set(
    rules.flatMap((rule) =>
      rule.apiGroups.flatMap((g) => rule.resources.map((res) => `${g}/${res}:${rule.operations.join(",")}`)),
    ),
  );
  // the kind the review checks ↔ the resource the registration sends
  const plural = (kind: string) => `${kind.toLowerCase()}s`;
  for (const kind of KINDS) assert.ok(sent.has(`${GROUPS[kind]}/${plural(kind)}:CREATE,UPDATE`), kind);
  // the review's other kinds ↔ the registration's other resources, in the core group
  assert.deepEqual(
    Object.values(OTHER_REVIEWED).map((x) => `/${x.resource}:${x.operations.join(",")}`),
    OTHER_RESOURCES.map((x) => `/${x.resource}:${x.operations.join(",")}`),
  );
  for (const x of OTHER_RESOURCES)
    assert.ok(sent.has(`/${x.resource}:${x.operations.join(",")}`), x.resource);
  assert.ok(sent.has("/serviceaccounts/token:CREATE"));
  assert.ok(sent.has("/pods/ephemeralcontainers:UPDATE"));
  assert.ok(sent.has("/secrets:CREATE,UPDATE"));
  assert.equal(sent.size, KINDS.length + OTHER_RESOURCES.length, "nothing else is sent");
  assert.equal(POD_BEARING_RESOURCES.flatMap((x) => x.resources).length, KINDS.length);
  for (const rule of rules.slice(0, POD_BEARING_RESOURCES.length)) assert.deepEqual(rule.apiVersions, ["*"]);
  // the workers' namespace carries the label the selector matches (Kubernetes 1.20 does not add it)
  const ns = objects.find(
    (o) => o.kind === "Namespace" && (o.metadata as { name: string }).name === "callplane-workers",
  );
  assert.equal(
    (ns?.metadata as { labels: Record<string, string> }).labels["kubernetes.io/metadata.name"],
    "callplane-workers",
  );
  // the webhook's certificate names what the API server dials, and its pods mount its Secret
  const cert = objects.find(
    (o) =>
      o.kind === "Certificate" && (o.metadata as { name: string }).name === "callplane-admission-webhook",
  );
  assert.ok((cert?.spec as { dnsNames: string[] }).dnsNames.includes("callplane-admission-webhook.nvcf.svc"));
  // the agent's Role and ClusterRole are exactly the constant lists
  const role = objects.find(
    (o) => o.kind === "Role" && (o.metadata as { name: string }).name === "compute-agent",
  );
  assert.deepEqual((role as { rules: unknown }).rules, JSON.parse(JSON.stringify(COMPUTE_AGENT_RULES)));
  const cr = objects.find((o) => o.kind === "ClusterRole");
  assert.deepEqual((cr as { rules: unknown }).rules, JSON.parse(JSON.stringify(COMPUTE_AGENT_CLUSTER_RULES)));
  // nothing may reach the worker pods
  const ingress = objects.find(
    (o) =>
      o.kind === "NetworkPolicy" && (o.metadata as { name: string }).name === "callplane-workers-ingress",
  );
  assert.deepEqual(ingress?.spec, { podSelector: {}, policyTypes: ["Ingress"], ingress: [] });
});

void test("render with the local backend: no webhook and no permission for the agent (it never calls the API server)", () => {
  const r = renderFile(join(repoRoot, "examples", "one-machine.yaml"), { version: "0.0.0-test" });
  const kinds = r.files.flatMap((f) => f.objects.map((o) => (o.toJSON() as { kind: string }).kind));
  for (const kind of [
    "ValidatingWebhookConfiguration",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
  ])
    assert.ok(!kinds.includes(kind), kind);
});

void test("render: the workers' egress reaches the NATS the workers dial: the rendered servers, or an external one's port (to its address when the URL names an IP)", (t) => {
  const dir = mkdtempSync(join(tmpdir(), "callplane-netpol-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const example = readFileSync(join(repoRoot, "examples", "kubernetes.yaml"), "utf8");
  const natsRules = (edit: (text: string) => string) => {
    const file = join(dir, `${Math.random().toString(36).slice(2)}.yaml`);
    writeFileSync(file, edit(example));
    const objects = renderFile(file, { version: "0.0.0-test" }).files.flatMap((f) =>
      f.objects.map((o) => o.toJSON() as Record<string, unknown>),
    );
    const policy = objects.find(
      (o) =>
        o.kind === "NetworkPolicy" && (o.metadata as { name: string }).name === "callplane-workers-egress",
    );
    const egress = (policy?.spec as { egress: Array<{ to?: unknown[]; ports: Array<{ port: number }> }> })
      .egress;
    // DNS first, then NATS, then the front doors (invocation, gRPC: no proxy in this example)
    return egress.filter(
      (r) => !r.ports.some((p) => p.port === 53) && !JSON.stringify(r.to ?? []).match(/invocation|grpc/),
    );
  };
  const sorted = (rules: unknown) => JSON.parse(JSON.stringify(rules)) as unknown;
  // the example: the rendered servers (their pods in the control plane's namespace), by their
  // Service's name in any of its forms
  const rendered = natsRules((x) => x);
  assert.equal(rendered.length, 1);
  const [peer] = rendered[0].to as Array<Record<string, unknown>>;
  assert.deepEqual(peer.namespaceSelector, { matchLabels: { "kubernetes.io/metadata.name": "nvcf" } });
  assert.equal(
    (peer.podSelector as { matchLabels: Record<string, string> }).matchLabels["app.kubernetes.io/name"],
    "nats",
  );
  assert.deepEqual(rendered[0].ports, [{ protocol: "TCP", port: 4222 }]);
  for (const short of ["nats", "nats.nvcf", "nats.nvcf.svc"])
    assert.deepEqual(
      sorted(natsRules((x) => x.replace("nats.nvcf.svc.cluster.local:4222", `${short}:4222`))),
      sorted(rendered),
      short,
    );
  // workerNatsUrl elsewhere: that port, to any address (the host is a DNS name)
  assert.deepEqual(
    sorted(
      natsRules((x) => x.replace("tls://nats.nvcf.svc.cluster.local:4222", "tls://nats.example.com:7422")),
    ),
    [{ ports: [{ protocol: "TCP", port: 7422 }] }],
  );
  // an IP literal: to that address; several servers, each its rule; a missing port is 4222
  assert.deepEqual(
    sorted(
      natsRules((x) =>
        x.replace(
          "tls://nats.nvcf.svc.cluster.local:4222",
          "tls://10.1.2.3:4333,tls://[fd00::7],tls://nats.example.com",
        ),
      ),
    ),
    [
      { to: [{ ipBlock: { cidr: "10.1.2.3/32" } }], ports: [{ protocol: "TCP", port: 4333 }] },
      { to: [{ ipBlock: { cidr: "fd00::7/128" } }], ports: [{ protocol: "TCP", port: 4222 }] },
      { ports: [{ protocol: "TCP", port: 4222 }] },
    ],
  );
  // no NATS StatefulSet: nats.url is the workers' when workerNatsUrl is empty
  assert.deepEqual(
    sorted(
      natsRules((x) =>
        x
          .replace(/workerNatsUrl: .*\n/, 'workerNatsUrl: ""\n')
          .replace(
            /^compute:\n/m,
            "nats:\n  url: tls://nats.example.com:4222\n  server:\n    enabled: false\ncompute:\n",
          ),
      ),
    ),
    [{ ports: [{ protocol: "TCP", port: 4222 }] }],
  );
});
