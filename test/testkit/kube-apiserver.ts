// A real Kubernetes control plane for tests: etcd and kube-apiserver 1.20.2 on loopback ports
// (optionally kube-controller-manager with the garbage collector, namespace and service-account
// controllers), in a temporary folder, stopped in reverse order and removed when the test ends.
// The serving certificate and the service-account signing key come from a test CA; the issuer is
// the API server's own URL, so its OIDC discovery document and key set are reachable from tests
// (anonymously, as managed clusters publish them). Binaries: CALLPLANE_KUBE_BIN (else
// ~/.cache/callplane/kubernetes-1.20.2/bin, made by scripts/ensure-kubernetes.sh) and
// CALLPLANE_ETCD (else /usr/bin/etcd).
//
// The signing key can be rotated while the control plane runs, as an operator does it
// (rotateServiceAccountKey): a new key, kube-apiserver restarted on the same port and etcd with the
// new key signing and the old and new keys both accepted (or the new one alone). serviceAccountKeyIds
// reads the key set the API server publishes; reviewToken asks it (TokenReview) whether a token is
// still accepted. Clients made before a restart keep working: undici opens new connections.
import { spawn, type ChildProcess } from "node:child_process";
import { createHash, createPublicKey, generateKeyPairSync, randomBytes } from "node:crypto";
import { accessSync, constants, existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { homedir, tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import { KubeClient, KubeError, kubePaths, type KubeObject } from "../../src/lib/kube/index.js";
import { freePort } from "./plane.js";
import { removeDir } from "./scope.js";
import { testPki } from "./tls.js";

type Ctx = Pick<TestContext, "after">;

export const KUBE_VERSION = "v1.20.2";

/** What apply did with one object: the server's answer, or its refusal. */
export interface ApplyResult {
  /** The collection the object was POSTed to. */
  path: string;
  object?: KubeObject;
  error?: KubeError;
}

export interface KubeApiServer {
  /** https://127.0.0.1:<port> */
  url: string;
  /** The test CA that signed the serving certificate (and its file, for caFile settings). */
  caPem: string;
  caFile: string;
  /** The service-account token issuer: the API server's own URL. */
  issuer: string;
  /** A system:masters user's token, and a client with it. */
  adminToken: string;
  admin: KubeClient;
  /**
   * system:node:test-node, in the group system:nodes only (the test kubelet): the Node authorizer
   * limits it as it limits a kubelet (its own Node, the pods bound to it, their Secrets and tokens).
   */
  nodeToken: string;
  node: KubeClient;
  /** system:kube-scheduler (the default RBAC lets it bind pods): the test kubelet's scheduler part. */
  schedulerToken: string;
  scheduler: KubeClient;
  etcdUrl: string;
  /** The temporary folder (removed when the test ends). */
  dir: string;
  /** Creates a namespace labelled kubernetes.io/metadata.name=<name> (1.20 does not add it). */
  createNamespace(name: string, labels?: Record<string, string>): Promise<KubeObject>;
  createServiceAccount(ns: string, name: string): Promise<KubeObject>;
  /** A TokenRequest for the account: the JWT. */
  tokenFor(
    ns: string,
    serviceAccount: string,
    opts?: { audiences?: string[]; boundPod?: { name: string; uid: string }; expirationSeconds?: number },
  ): Promise<string>;
  /** A client that authenticates with `token` (closed when the test ends). */
  clientAs(token: string): KubeClient;
  /** Writes a token to a file in the folder (for tokenFile settings) and returns its path. */
  writeTokenFile(token: string): string;
  /** Creates each object in its collection (found by discovery); never throws for one object. */
  apply(objects: KubeObject[], opts?: { dryRun?: boolean }): Promise<ApplyResult[]>;
  /**
   * Rotates the service-account signing key as an operator does: a new key of the kind the harness
   * starts with (ECDSA P-256, so ES256 tokens), written to the folder; kube-apiserver stopped and
   * started again on the same port and etcd with the same flags, except
   * --service-account-signing-key-file (the new key) and --service-account-key-file, given once per
   * key it accepts: those accepted until now and the new one (keepOld, the default), or the new one
   * alone (keepOld false: tokens signed before are refused from then on). Resolves with the new
   * key's kid once /readyz answers 200. Clients made before keep working (undici reconnects), but a
   * request in flight during the restart fails, and a watch sees an error and resumes. Rotations run
   * one after the other. kube-controller-manager keeps its --service-account-private-key-file: it
   * signs only legacy Secret tokens, and its tokens controller is not among those the harness runs.
   */
  rotateServiceAccountKey(opts?: { keepOld?: boolean }): Promise<string>;
  /** The kid of the key signing new tokens now (kube-apiserver's: base64url(sha256(DER SPKI))). */
  signingKeyId(): string;
  /**
   * The kids in the key set the API server publishes (/openid/v1/jwks, asked with Accept
   * application/jwk-set+json: 1.20 answers 406 to application/json).
   */
  serviceAccountKeyIds(): Promise<string[]>;
  /**
   * A TokenReview as admin: whether the API server accepts `token` now, for `audiences` (default:
   * the API server's own); `error` is the server's reason when it does not.
   */
  reviewToken(
    token: string,
    audiences?: string[],
  ): Promise<{ authenticated: boolean; username?: string; audiences?: string[]; error?: string }>;
  /** The last lines each process wrote (for a failing test's message). */
  logs(): Record<string, string>;
  /** Stops every process it runs (the kube-apiserver started last, after rotations). */
  stop(): Promise<void>;
}

export interface KubeApiServerOptions {
  /** Also run kube-controller-manager (garbagecollector, namespace, serviceaccount). */
  controllerManager?: boolean;
  extraApiServerArgs?: string[];
}

function kubeBinDir(): string {
  const dir =
    process.env.CALLPLANE_KUBE_BIN || join(homedir(), ".cache", "callplane", "kubernetes-1.20.2", "bin");
  if (!existsSync(join(dir, "kube-apiserver")))
    throw new Error(
      `no kube-apiserver in ${dir}: run scripts/ensure-kubernetes.sh (or set CALLPLANE_KUBE_BIN to the folder holding kube-apiserver and kube-controller-manager)`,
    );
  return dir;
}

function etcdBinary(): string {
  const etcd = process.env.CALLPLANE_ETCD || "/usr/bin/etcd";
  if (!existsSync(etcd)) throw new Error(`no etcd at ${etcd}: install etcd-server or set CALLPLANE_ETCD`);
  return etcd;
}

/** etcd writes and fsyncs a lot: memory is much faster than disk, when there is a writable /dev/shm. */
function scratchRoot(): string {
  try {
    accessSync("/dev/shm", constants.W_OK);
    return "/dev/shm";
  } catch {
    return tmpdir();
  }
}

interface Proc {
  name: string;
  child: ChildProcess;
  tail: () => string;
}

/** `history`: what an earlier run of the same process wrote (kept in its tail, cut first). */
function startProcess(name: string, bin: string, args: string[], history = ""): Proc {
  const child = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = history;
  const keep = (d: Buffer) => (out = (out + d.toString()).slice(-16_384));
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  return { name, child, tail: () => out };
}

async function stopProcess(p: Proc): Promise<void> {
  const { child } = p;
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGTERM");
  const k = setTimeout(() => child.kill("SIGKILL"), 5000);
  await exited;
  clearTimeout(k);
}

/** Polls `probe` until it answers true; fails early when the process it waits on has exited. */
async function waitUntil(what: string, p: Proc, probe: () => Promise<boolean>, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (p.child.exitCode !== null || p.child.signalCode !== null)
      throw new Error(
        `${p.name} exited (${p.child.exitCode ?? p.child.signalCode}) before ${what}:\n${p.tail()}`,
      );
    if (await probe().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`${p.name}: no ${what} after ${ms} ms:\n${p.tail()}`);
    await sleep(100);
  }
}

/** A service-account key as kube-apiserver names it: base64url(sha256(the DER SubjectPublicKeyInfo)). */
export function serviceAccountKeyId(keyPem: string): string {
  const der = createPublicKey(keyPem).export({ type: "spki", format: "der" });
  return createHash("sha256").update(der).digest("base64url");
}

interface SigningKey {
  kid: string;
  keyFile: string;
  pubFile: string;
}

// Used when discovery does not know a kind (yet): the plurals of the kinds callplane renders.
const PLURALS: Record<string, { plural: string; namespaced: boolean }> = {
  Namespace: { plural: "namespaces", namespaced: false },
  Node: { plural: "nodes", namespaced: false },
  Pod: { plural: "pods", namespaced: true },
  Service: { plural: "services", namespaced: true },
  ServiceAccount: { plural: "serviceaccounts", namespaced: true },
  Secret: { plural: "secrets", namespaced: true },
  ConfigMap: { plural: "configmaps", namespaced: true },
  Endpoints: { plural: "endpoints", namespaced: true },
  PersistentVolumeClaim: { plural: "persistentvolumeclaims", namespaced: true },
  Deployment: { plural: "deployments", namespaced: true },
  StatefulSet: { plural: "statefulsets", namespaced: true },
  DaemonSet: { plural: "daemonsets", namespaced: true },
  ReplicaSet: { plural: "replicasets", namespaced: true },
  Job: { plural: "jobs", namespaced: true },
  CronJob: { plural: "cronjobs", namespaced: true },
  Role: { plural: "roles", namespaced: true },
  RoleBinding: { plural: "rolebindings", namespaced: true },
  ClusterRole: { plural: "clusterroles", namespaced: false },
  ClusterRoleBinding: { plural: "clusterrolebindings", namespaced: false },
  NetworkPolicy: { plural: "networkpolicies", namespaced: true },
  Ingress: { plural: "ingresses", namespaced: true },
  PodDisruptionBudget: { plural: "poddisruptionbudgets", namespaced: true },
  HorizontalPodAutoscaler: { plural: "horizontalpodautoscalers", namespaced: true },
  ValidatingWebhookConfiguration: { plural: "validatingwebhookconfigurations", namespaced: false },
  MutatingWebhookConfiguration: { plural: "mutatingwebhookconfigurations", namespaced: false },
};

/**
 * Starts etcd and kube-apiserver (RBAC and Node authorization; NamespaceLifecycle, ServiceAccount
 * and ValidatingAdmissionWebhook on top of 1.20's default admission plugins) on free loopback ports.
 */
export async function startKubeApiServer(t: Ctx, opts: KubeApiServerOptions = {}): Promise<KubeApiServer> {
  const bin = kubeBinDir();
  const etcd = etcdBinary();
  const host = "127.0.0.1";
  const dir = mkdtempSync(join(scratchRoot(), "callplane-kube-"));
  const procs: Proc[] = [];
  const clients: KubeClient[] = [];
  const killAll = () => {
    for (const p of procs)
      if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill("SIGKILL");
  };
  process.on("exit", killAll);
  let stopped: Promise<void> | undefined;
  const stop = () =>
    (stopped ??= (async () => {
      // closing waits for requests in flight: a watch a test left open ends when kube-apiserver does
      const closed = Promise.all(clients.map((c) => c.close().catch(() => undefined)));
      for (const p of [...procs].reverse()) await stopProcess(p);
      await closed;
      process.off("exit", killAll);
      removeDir(dir);
    })());
  t.after(stop);

  try {
    const [etcdPort, etcdPeerPort, port] = [await freePort(host), await freePort(host), await freePort(host)];
    const etcdUrl = `http://${host}:${etcdPort}`;
    const url = `https://${host}:${port}`;
    const issuer = url;

    const e = startProcess("etcd", etcd, [
      "--name=test",
      `--data-dir=${join(dir, "etcd")}`,
      `--listen-client-urls=${etcdUrl}`,
      `--advertise-client-urls=${etcdUrl}`,
      `--listen-peer-urls=http://${host}:${etcdPeerPort}`,
      `--initial-advertise-peer-urls=http://${host}:${etcdPeerPort}`,
      `--initial-cluster=test=http://${host}:${etcdPeerPort}`,
      "--unsafe-no-fsync",
      "--log-level=warn",
    ]);
    procs.push(e);

    // certificates while etcd starts
    const pki = await testPki();
    const serving = await pki.issue([host, "localhost", "kubernetes", "kubernetes.default.svc"]);
    const signer = await pki.issue(["service-account-issuer"]);
    const files = {
      ca: join(dir, "ca.crt"),
      cert: join(dir, "apiserver.crt"),
      key: join(dir, "apiserver.key"),
      saKey: join(dir, "sa.key"),
      tokens: join(dir, "tokens.csv"),
      kubeconfig: join(dir, "admin.kubeconfig"),
    };
    writeFileSync(files.ca, pki.ca.certPem);
    writeFileSync(files.cert, serving.certPem);
    writeFileSync(files.key, serving.keyPem, { mode: 0o600 });
    const writeSigningKey = (keyPem: string, keyFile: string): SigningKey => {
      const pubFile = keyFile.replace(/\.key$/, ".pub");
      writeFileSync(keyFile, keyPem, { mode: 0o600 });
      writeFileSync(pubFile, createPublicKey(keyPem).export({ type: "spki", format: "pem" }).toString());
      return { kid: serviceAccountKeyId(keyPem), keyFile, pubFile };
    };
    let signing = writeSigningKey(signer.keyPem, files.saKey);
    let accepted = [signing];
    const adminToken = randomBytes(24).toString("hex");
    const nodeToken = randomBytes(24).toString("hex");
    const schedulerToken = randomBytes(24).toString("hex");
    writeFileSync(
      files.tokens,
      `${adminToken},admin,admin,"system:masters"\n` +
        `${nodeToken},system:node:test-node,node-test-node,"system:nodes"\n` +
        `${schedulerToken},system:kube-scheduler,kube-scheduler\n`,
      { mode: 0o600 },
    );

    await waitUntil("health", e, async () => {
      const r = await fetch(`${etcdUrl}/health`);
      return r.ok && ((await r.json()) as { health?: string }).health === "true";
    });

    const apiServerArgs = () => [
      `--etcd-servers=${etcdUrl}`,
      `--bind-address=${host}`,
      `--advertise-address=${host}`,
      `--secure-port=${port}`,
      "--insecure-port=0",
      // the kubernetes Service's endpoints would be 127.0.0.1, which Endpoints refuse (loopback)
      "--endpoint-reconciler-type=none",
      `--tls-cert-file=${files.cert}`,
      `--tls-private-key-file=${files.key}`,
      `--cert-dir=${join(dir, "certs")}`,
      `--token-auth-file=${files.tokens}`,
      "--authorization-mode=Node,RBAC",
      "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,ValidatingAdmissionWebhook",
      `--service-account-issuer=${issuer}`,
      `--service-account-jwks-uri=${issuer}/openid/v1/jwks`,
      // repeatable in 1.20: a token verifies if any of these keys verifies it
      ...accepted.map((k) => `--service-account-key-file=${k.pubFile}`),
      `--service-account-signing-key-file=${signing.keyFile}`,
      `--api-audiences=${issuer}`,
      "--service-cluster-ip-range=10.96.0.0/16",
      "--profiling=false",
      "--v=0",
      ...(opts.extraApiServerArgs ?? []),
    ];
    let apiServer = startProcess("kube-apiserver", join(bin, "kube-apiserver"), apiServerArgs());
    procs.push(apiServer);

    const clientAs = (token: string) => {
      const c = new KubeClient({ server: url, caPem: pki.ca.certPem, token });
      clients.push(c);
      return c;
    };
    const admin = clientAs(adminToken);
    const node = clientAs(nodeToken);
    const scheduler = clientAs(schedulerToken);
    const ready = (p: Proc) =>
      waitUntil("/readyz", p, async () => {
        const r = await admin.send("GET", "/readyz", { timeoutMs: 5_000 });
        await r.body.text();
        return r.statusCode === 200;
      });
    await ready(apiServer);
    // managed clusters publish discovery and keys; in 1.20 only service accounts may read them
    await admin.create(kubePaths.cluster("rbac.authorization.k8s.io", "v1", "clusterrolebindings"), {
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "ClusterRoleBinding",
      metadata: { name: "callplane-test:public-issuer-discovery" },
      roleRef: {
        apiGroup: "rbac.authorization.k8s.io",
        kind: "ClusterRole",
        name: "system:service-account-issuer-discovery",
      },
      subjects: [{ apiGroup: "rbac.authorization.k8s.io", kind: "Group", name: "system:unauthenticated" }],
    });

    if (opts.controllerManager) {
      writeFileSync(
        files.kubeconfig,
        JSON.stringify({
          apiVersion: "v1",
          kind: "Config",
          clusters: [
            {
              name: "test",
              cluster: {
                server: url,
                "certificate-authority-data": Buffer.from(pki.ca.certPem).toString("base64"),
              },
            },
          ],
          users: [{ name: "admin", user: { token: adminToken } }],
          contexts: [{ name: "test", context: { cluster: "test", user: "admin" } }],
          "current-context": "test",
        }),
        { mode: 0o600 },
      );
      const cm = startProcess("kube-controller-manager", join(bin, "kube-controller-manager"), [
        `--kubeconfig=${files.kubeconfig}`,
        "--controllers=garbagecollector,namespace,serviceaccount",
        "--leader-elect=false",
        "--secure-port=0",
        "--port=0",
        `--service-account-private-key-file=${files.saKey}`,
        `--root-ca-file=${files.ca}`,
        "--v=0",
      ]);
      procs.push(cm);
      // the serviceaccount controller is running once `default` has its account
      await waitUntil("the default ServiceAccount", cm, async () => {
        await admin.get(kubePaths.serviceAccounts("default", "default"), { timeoutMs: 5_000 });
        return true;
      });
    }

    const discovered = new Map<string, Map<string, { plural: string; namespaced: boolean }>>();
    const resourceOf = async (apiVersion: string, kind: string) => {
      let kinds = discovered.get(apiVersion);
      if (!kinds) {
        kinds = new Map();
        try {
          const list = await admin.request<{
            resources: Array<{ name: string; kind: string; namespaced: boolean }>;
          }>("GET", apiVersion.includes("/") ? `/apis/${apiVersion}` : `/api/${apiVersion}`);
          for (const r of list.resources)
            if (!r.name.includes("/")) kinds.set(r.kind, { plural: r.name, namespaced: r.namespaced });
          discovered.set(apiVersion, kinds);
        } catch {
          // an unknown group (a CRD not yet served): the table below, and discovery again next time
        }
      }
      const found = kinds.get(kind) ?? PLURALS[kind];
      if (!found) throw new Error(`no resource for ${apiVersion} ${kind}`);
      return found;
    };

    let rotations = 0;
    let rotating: Promise<unknown> = Promise.resolve();
    const rotate = async (keepOld: boolean) => {
      const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
      const keyPem = privateKey.export({ type: "pkcs8", format: "pem" }).toString();
      const key = writeSigningKey(keyPem, join(dir, `sa-${++rotations}.key`));
      [signing, accepted] = [key, keepOld ? [...accepted, key] : [key]];
      const old = apiServer;
      await stopProcess(old);
      // stop() began meanwhile: it has passed (or is stopping) the old process; start none behind it
      if (stopped) throw new Error("kube-apiserver: the harness stopped during a key rotation");
      apiServer = startProcess(
        "kube-apiserver",
        join(bin, "kube-apiserver"),
        apiServerArgs(),
        `${old.tail()}\n`,
      );
      procs[procs.indexOf(old)] = apiServer;
      await ready(apiServer);
      return key.kid;
    };
    const jwks = async () => {
      const res = await request(`${url}/openid/v1/jwks`, {
        dispatcher: admin.dispatcher,
        headers: { accept: "application/jwk-set+json" },
      });
      const text = await res.body.text();
      if (res.statusCode !== 200) throw new Error(`GET /openid/v1/jwks: ${res.statusCode} ${text}`);
      return JSON.parse(text) as { keys: Array<{ kid: string }> };
    };

    return {
      url,
      caPem: pki.ca.certPem,
      caFile: files.ca,
      issuer,
      adminToken,
      admin,
      nodeToken,
      node,
      schedulerToken,
      scheduler,
      etcdUrl,
      dir,
      createNamespace: (name, labels = {}) =>
        admin.create(kubePaths.namespaces(), {
          apiVersion: "v1",
          kind: "Namespace",
          metadata: { name, labels: { "kubernetes.io/metadata.name": name, ...labels } },
        }),
      createServiceAccount: (ns, name) =>
        admin.create(kubePaths.serviceAccounts(ns), {
          apiVersion: "v1",
          kind: "ServiceAccount",
          metadata: { name, namespace: ns },
        }),
      async tokenFor(ns, serviceAccount, o = {}) {
        const res = await admin.create<KubeObject & { status: { token: string } }>(
          `${kubePaths.serviceAccounts(ns, serviceAccount)}/token`,
          {
            apiVersion: "authentication.k8s.io/v1",
            kind: "TokenRequest",
            spec: {
              ...(o.audiences ? { audiences: o.audiences } : {}),
              ...(o.expirationSeconds ? { expirationSeconds: o.expirationSeconds } : {}),
              ...(o.boundPod
                ? {
                    boundObjectRef: {
                      apiVersion: "v1",
                      kind: "Pod",
                      name: o.boundPod.name,
                      uid: o.boundPod.uid,
                    },
                  }
                : {}),
            },
          },
        );
        return res.status.token;
      },
      clientAs,
      writeTokenFile(token) {
        const f = join(dir, `token-${randomBytes(6).toString("hex")}`);
        writeFileSync(f, token, { mode: 0o600 });
        return f;
      },
      async apply(objects, o = {}) {
        const results: ApplyResult[] = [];
        for (const obj of objects) {
          const apiVersion = obj.apiVersion ?? "";
          const kind = obj.kind ?? "";
          const r = await resourceOf(apiVersion, kind);
          const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
          const path = r.namespaced
            ? kubePaths.namespaced(group, version, r.plural, obj.metadata?.namespace ?? "default")
            : kubePaths.cluster(group, version, r.plural);
          try {
            const object = await admin.create(path, obj, o.dryRun ? { query: { dryRun: "All" } } : {});
            results.push({ path, object });
          } catch (err) {
            if (!(err instanceof KubeError)) throw err;
            results.push({ path, error: err });
          }
        }
        return results;
      },
      rotateServiceAccountKey(o = {}) {
        const next = rotating.catch(() => undefined).then(() => rotate(o.keepOld ?? true));
        rotating = next;
        return next;
      },
      signingKeyId: () => signing.kid,
      serviceAccountKeyIds: async () => (await jwks()).keys.map((k) => k.kid),
      async reviewToken(token, audiences) {
        const review = await admin.create<
          KubeObject & {
            status: {
              authenticated?: boolean;
              user?: { username?: string };
              audiences?: string[];
              error?: string;
            };
          }
        >(kubePaths.cluster("authentication.k8s.io", "v1", "tokenreviews"), {
          apiVersion: "authentication.k8s.io/v1",
          kind: "TokenReview",
          spec: { token, ...(audiences ? { audiences } : {}) },
        });
        const st = review.status;
        return {
          authenticated: st.authenticated === true,
          ...(st.user?.username ? { username: st.user.username } : {}),
          ...(st.audiences ? { audiences: st.audiences } : {}),
          ...(st.error ? { error: st.error } : {}),
        };
      },
      logs: () => Object.fromEntries(procs.map((p) => [p.name, p.tail()])),
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
