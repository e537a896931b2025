// A test kubelet: plays the kubelet, the one part of Kubernetes that cannot run here (there is no
// container runtime and no image to pull). Everything else a test runs is real: the kube-apiserver,
// its authorizers and admission, etcd. Like a kubelet it talks to the API server as its node
// (system:node:<name>, so the Node authorizer decides which Secrets and tokens it may have), and:
//   - registers its Node (labels and capacity from the test, e.g. nvidia.com/gpu) and heartbeats it;
//   - plays the scheduler's bind too (POST pods/<name>/binding, with a client allowed to bind), after
//     checking nodeSelector, required node affinity and extended resources against its one node; a
//     pod that does not fit stays Pending with PodScheduled=False, reason Unschedulable;
//   - gives each pod a loopback address of its own (host n of podNetwork) and a folder holding its
//     volumes: projected service-account tokens from a TokenRequest bound to the pod (renewed at
//     80% of their life, or at once by renewTokens(), e.g. after a signing-key rotation), Secrets
//     (rewritten when the watched Secret changes), emptyDirs;
//   - runs each container as a local process: `images` maps an image to a command; a container whose
//     command is `node /app/...` (the callplane image) runs `process.execPath <repoRoot>/...`; any
//     other image waits with ErrImagePull. The environment is built as a kubelet builds it (envFrom
//     secretRef, then env: values with $(VAR), fieldRef, secretKeyRef); an exited container restarts
//     by restartPolicy with a backoff (CrashLoopBackOff while it waits); httpGet readiness probes
//     run every second;
//   - reports the pod's status through the status subresource (phase, IPs, conditions, container
//     states); on deletion: SIGTERM, SIGKILL after the grace period (capped), then the final delete
//     with gracePeriodSeconds 0; the folder goes when the pod object is gone.
// The one liberty it takes: processes cannot see mount paths, so every environment value that starts
// with a container's volume mountPath is rewritten to the same path under that volume's folder.
import { spawn, type ChildProcess } from "node:child_process";
import {
  appendFileSync,
  closeSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  renameSync,
  writeFileSync,
} from "node:fs";
import { constants, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import type { IContainer, INodeSelectorTerm, IPod, ISecret } from "kubernetes-models/v1";
import {
  isAlreadyExists,
  isConflict,
  isNotFound,
  kubePaths,
  watchCollection,
  type CollectionWatch,
  type KubeClient,
  type KubeObject,
} from "../../src/lib/kube/index.js";
import { removeDir } from "./scope.js";

type Pod = IPod & KubeObject;
type Secret = ISecret & KubeObject;

export interface ContainerContext {
  pod: Pod;
  container: IContainer;
  podIP: string;
  /** The container's environment as resolved from the pod (mount paths already rewritten). */
  env: Record<string, string>;
  repoRoot: string;
}
/** How an image becomes a local process (its `env` is added to the pod's). */
export type ImageMapping = (ctx: ContainerContext) => {
  command: string;
  args: string[];
  env?: Record<string, string>;
};

export interface TestKubeletOptions {
  /** Authenticated as the node: user system:node:<nodeName>, group system:nodes. */
  client: KubeClient;
  /** Binds pods and marks them Unschedulable: the scheduler's part (the Node authorizer does not let
   * a node bind; give a client for system:kube-scheduler). Default: `client`. */
  scheduler?: KubeClient;
  namespace: string;
  nodeName?: string;
  nodeLabels?: Record<string, string>;
  /** Capacity (= allocatable); default cpu 8, memory 32Gi, pods 110 and, when the labels have
   * nvidia.com/gpu.count, that many nvidia.com/gpu. */
  capacity?: Record<string, string>;
  /** Pods get host 1, 2, ... of this network (default 127.0.6.0/24): give each test file its own. */
  podNetwork?: string;
  images?: Record<string, ImageMapping>;
  repoRoot: string;
  /** Containers' output (<ns>_<pod>_<container>.log) and test-kubelet.log; default: a folder removed
   * on stop. */
  logDir?: string;
  /** Caps each pod's termination grace period (seconds, default 3). */
  maxGraceSeconds?: number;
}

export interface TestKubeletPod {
  name: string;
  uid: string;
  ip: string;
  /** The pod's folder: volumes/<volume name>/... */
  dir: string;
  /** Running containers' pids, by container name. */
  pids: Record<string, number>;
  restarts: Record<string, number>;
  ready: boolean;
}

export interface TestKubelet {
  nodeName: string;
  logDir: string;
  /** The pods it runs (admitted to the node and not yet gone). */
  pods(): TestKubeletPod[];
  /**
   * Requests every projected service-account token of the pods it runs (not those terminating)
   * again now, as the kubelet does at 80 % of a token's life, and resolves once each file holds its
   * new token: after the API server's signing key was rotated, the files hold tokens of the new key
   * without waiting for the renewal. Each file's renewal timer is set again from the new token.
   * Rejects with the first TokenRequest that failed (that file is retried in 5 s, as a renewal is).
   */
  renewTokens(): Promise<void>;
  /** Kills every container and stops watching; pod objects stay as they are. */
  stop(): Promise<void>;
}

type Ctx = Pick<TestContext, "after">;
type Terminated = { exitCode: number; reason: string; startedAt: string; finishedAt: string };

interface Ctr {
  spec: IContainer;
  proc?: ChildProcess;
  exited?: Promise<void>;
  startedAt?: string;
  restarts: number;
  backoffMs: number;
  timer?: NodeJS.Timeout;
  waiting?: { reason: string; message?: string };
  last?: Terminated;
  /** A start is scheduled or under way. */
  pending?: boolean;
  /** Exited for good (restartPolicy Never or OnFailure). */
  done?: boolean;
  ready: boolean;
  probeFails: number;
}

interface PodRun {
  uid: string;
  name: string;
  ip: string;
  host: number;
  dir: string;
  startTime: string;
  ctrs: Ctr[];
  mounted: boolean;
  mountError?: string;
  terminating: boolean;
  deleted: boolean;
  timers: NodeJS.Timeout[];
  /** Projected token files, by path. */
  tokens: Map<string, ProjectedToken>;
  secrets: Set<string>;
  transitions: Map<string, { status: string; at: string }>;
  sent: string;
}

/** One projected token file of a pod. */
interface ProjectedToken {
  /** Requests the token now and writes it; resolves once the file holds the newest token asked for. */
  refresh(): Promise<void>;
  /** The renewal at 80 % of the token's life (or the retry after a failed request). */
  timer?: NodeJS.Timeout;
  /** Requests made so far: only the latest one writes the file. */
  seq: number;
  current?: Promise<void>;
}

interface SecretEntry {
  /** undefined: not read yet; null: there is no such Secret. */
  data?: Record<string, Buffer> | null;
  watch: CollectionWatch;
  users: Set<string>;
}

const now = () => new Date().toISOString().replace(/\.\d+Z$/, "Z");
const MAX_BACKOFF_MS = 5000;
const OPERATORS: Record<string, (v: string | undefined, values: string[]) => boolean> = {
  In: (v, vs) => v !== undefined && vs.includes(v),
  NotIn: (v, vs) => v === undefined || !vs.includes(v),
  Exists: (v) => v !== undefined,
  DoesNotExist: (v) => v === undefined,
  Gt: (v, vs) => v !== undefined && Number(v) > Number(vs[0]),
  Lt: (v, vs) => v !== undefined && Number(v) < Number(vs[0]),
};
const termMatches = (term: INodeSelectorTerm, labels: Record<string, string>) =>
  !!term.matchExpressions?.length &&
  term.matchExpressions.every((e) => OPERATORS[e.operator]?.(labels[e.key], e.values ?? []) ?? false);
/** Extended resources (vendor-domain names such as nvidia.com/gpu) a pod asks for. */
const extendedRequests = (p: Pod) => {
  const sum: Record<string, number> = {};
  for (const c of p.spec?.containers ?? [])
    for (const [k, v] of Object.entries(c.resources?.requests ?? c.resources?.limits ?? {}))
      if (k.includes("/")) sum[k] = (sum[k] ?? 0) + Number(v);
  return sum;
};
/** Running, and passing its httpGet readiness probe if it has one (exec and tcpSocket probes are not run). */
const isReady = (c: Ctr) => !!c.proc && (!c.spec.readinessProbe?.httpGet || c.ready);

export async function startTestKubelet(t: Ctx, o: TestKubeletOptions): Promise<TestKubelet> {
  const { client, namespace: ns, repoRoot } = o;
  const scheduler = o.scheduler ?? client;
  const node = o.nodeName ?? "test-node";
  const labels: Record<string, string> = { "kubernetes.io/hostname": node, ...o.nodeLabels };
  const gpus = labels["nvidia.com/gpu.count"];
  const capacity: Record<string, string> = o.capacity ?? {
    cpu: "8",
    memory: "32Gi",
    pods: "110",
    ...(gpus ? { "nvidia.com/gpu": gpus } : {}),
  };
  const root = mkdtempSync(join(tmpdir(), "test-kubelet-"));
  const logDir = o.logDir ?? join(root, "logs");
  mkdirSync(logDir, { recursive: true });
  const log = (line: string) => appendFileSync(join(logDir, "test-kubelet.log"), `${now()} ${line}\n`);
  const [net, bits] = (o.podNetwork ?? "127.0.6.0/24").split("/");
  const netBase = net.split(".").reduce((a, b) => a * 256 + Number(b), 0);
  const hostIP = "127.0.0.1";

  const known = new Map<string, Pod>(); // by uid: pods not yet bound, or bound to this node
  const runs = new Map<string, PodRun>();
  const syncers = new Map<string, () => void>();
  const secrets = new Map<string, SecretEntry>();
  let stopped = false;

  // --- the Node ----------------------------------------------------------------------------------
  const ready = { type: "Ready", status: "True", reason: "KubeletReady", message: "test kubelet" };
  const nodeStatus = () => ({
    capacity,
    allocatable: capacity,
    addresses: [{ type: "InternalIP", address: hostIP }],
    conditions: [{ ...ready, lastHeartbeatTime: now() }],
  });
  try {
    const meta = { name: node, labels };
    await client.create(kubePaths.nodes(), {
      apiVersion: "v1",
      kind: "Node",
      metadata: meta,
      status: nodeStatus(),
    });
  } catch (err) {
    if (!isAlreadyExists(err)) throw err;
    await client.patch(kubePaths.nodes(node), { metadata: { labels } });
  }
  const heartbeat = () =>
    client.patch(`${kubePaths.nodes(node)}/status`, { status: nodeStatus() }, "strategic");
  await heartbeat();
  // a controller manager's node lifecycle controller would taint a node that stops reporting
  const heartbeats = setInterval(() => void heartbeat().catch((e: Error) => log(e.message)), 10_000).unref();

  // --- the scheduler's part ----------------------------------------------------------------------
  const unfit = (pod: Pod): string | undefined => {
    const why: string[] = [];
    const terms =
      pod.spec?.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms;
    const selected = Object.entries(pod.spec?.nodeSelector ?? {}).every(([k, v]) => labels[k] === v);
    if (!selected || (terms && !terms.some((term) => termMatches(term, labels))))
      why.push("node(s) didn't match node selector");
    const used = [...known.values()]
      .filter((p) => p.spec?.nodeName === node && !["Succeeded", "Failed"].includes(p.status?.phase ?? ""))
      .map(extendedRequests);
    for (const [res, want] of Object.entries(extendedRequests(pod)))
      if (used.reduce((a, u) => a + (u[res] ?? 0), want) > Number(capacity[res] ?? 0))
        why.push(`Insufficient ${res}`);
    return why.length ? `0/1 nodes are available: ${why.map((w) => `1 ${w}`).join(", ")}.` : undefined;
  };
  const schedule = async (pod: Pod) => {
    const { name, uid } = pod.metadata as { name: string; uid: string };
    const why = unfit(pod);
    if (!why) {
      const binding = { apiVersion: "v1", kind: "Binding", metadata: { name, uid } };
      const target = { apiVersion: "v1", kind: "Node", name: node };
      try {
        await scheduler.create(`${kubePaths.pods(ns, name)}/binding`, { ...binding, target });
      } catch (err) {
        if (!isConflict(err) && !isNotFound(err)) throw err; // bound already, or gone
      }
      return;
    }
    const had = pod.status?.conditions?.find((c) => c.type === "PodScheduled");
    if (had?.status === "False" && had.message === why) return;
    const cond = {
      type: "PodScheduled",
      status: "False",
      reason: "Unschedulable",
      message: why,
      lastTransitionTime: now(),
    };
    await scheduler.patch(
      `${kubePaths.pods(ns, name)}/status`,
      { status: { conditions: [cond] } },
      "strategic",
    );
  };

  // --- volumes -----------------------------------------------------------------------------------
  const writeAtomic = (file: string, data: string | Buffer) => {
    mkdirSync(dirname(file), { recursive: true });
    writeFileSync(`${file}.tmp`, data);
    renameSync(`${file}.tmp`, file);
  };
  const volDir = (run: PodRun, volume: string) => join(run.dir, "volumes", volume);
  /** Writes the keys of the pod's Secret volumes (or of those from Secret `only`). */
  const writeSecretFiles = (pod: Pod, run: PodRun, only?: string) => {
    for (const v of pod.spec?.volumes ?? []) {
      const sources = v.secret
        ? [{ name: v.secret.secretName, items: v.secret.items, optional: v.secret.optional }]
        : (v.projected?.sources ?? []).flatMap((s) => (s.secret ? [s.secret] : []));
      for (const s of sources) {
        if (!s.name || (only && s.name !== only)) continue;
        const data = secrets.get(s.name)?.data;
        if (data === undefined || (data === null && !s.optional))
          throw new Error(`secret "${s.name}" not found`);
        const files = s.items?.map((i) => [i.key, i.path]) ?? Object.keys(data ?? {}).map((k) => [k, k]);
        for (const [key, path] of files)
          if (data?.[key]) writeAtomic(join(volDir(run, v.name), path), data[key]);
      }
    }
  };
  /** A Secret's data, from a watch on it by name: the only list the Node authorizer allows a node. */
  const secretData = async (name: string, run: PodRun): Promise<Record<string, Buffer> | null> => {
    let s = secrets.get(name);
    if (!s) {
      const entry = { users: new Set<string>() } as SecretEntry;
      const update = (sec?: Secret) => {
        const data = Object.entries(sec?.data ?? {}).map(([k, v]) => [k, Buffer.from(v, "base64")] as const);
        entry.data = sec ? Object.fromEntries(data) : null;
        for (const uid of entry.users) {
          const [pod, r] = [known.get(uid), runs.get(uid)];
          try {
            if (pod && r?.mounted) writeSecretFiles(pod, r, name);
          } catch (e) {
            log(`rewriting secret ${name} for ${r?.name}: ${(e as Error).message}`);
          }
        }
      };
      entry.watch = watchCollection<Secret>(
        client,
        kubePaths.secrets(ns),
        { fieldSelector: `metadata.name=${name}` },
        {
          onList: (items) => update(items[0]),
          onEvent: (type, sec) => update(type === "DELETED" ? undefined : sec),
          onError: (e) => log(`watching secret ${name}: ${e.message}`),
        },
      );
      secrets.set(name, (s = entry));
    }
    s.users.add(run.uid);
    run.secrets.add(name);
    if (s.data === undefined) await Promise.race([s.watch.synced, sleep(5000, undefined, { ref: false })]);
    if (s.data === undefined) throw new Error(`secret "${name}" not readable`);
    return s.data;
  };
  /**
   * Requests the projected token for `file` and writes it; the file's one renewal timer is set again
   * each time (a mount that is retried, or renewTokens, replaces it: no second timer).
   */
  const requestToken = (pod: Pod, run: PodRun, file: string, audience?: string, seconds = 3600) => {
    let tok = run.tokens.get(file);
    if (!tok) {
      const entry: ProjectedToken = { seq: 0, refresh: () => Promise.resolve() };
      const renew = () =>
        void entry.refresh().catch((e: Error) => log(`renewing the token of ${run.name}: ${e.message}`));
      const once = async (mine: number): Promise<void> => {
        let tr: KubeObject & { status: { token: string; expirationTimestamp: string } };
        try {
          tr = await client.create(
            `${kubePaths.serviceAccounts(ns, pod.spec?.serviceAccountName ?? "default")}/token`,
            {
              apiVersion: "authentication.k8s.io/v1",
              kind: "TokenRequest",
              spec: {
                audiences: audience ? [audience] : [], // none: the API server's own
                expirationSeconds: seconds,
                boundObjectRef: { kind: "Pod", apiVersion: "v1", name: run.name, uid: run.uid },
              },
            },
          );
        } catch (err) {
          if (mine === entry.seq && !run.deleted && !stopped) entry.timer = setTimeout(renew, 5000).unref();
          throw err;
        }
        // a later request is under way: its token is the newer one, and the file waits for it
        if (mine !== entry.seq) return entry.current;
        if (run.deleted || stopped) return;
        writeAtomic(file, tr.status.token);
        const life = Date.parse(tr.status.expirationTimestamp) - Date.now();
        entry.timer = setTimeout(renew, Math.max(life * 0.8, 1000)).unref();
      };
      entry.refresh = () => {
        clearTimeout(entry.timer);
        return (entry.current = once(++entry.seq));
      };
      run.tokens.set(file, (tok = entry));
    }
    return tok.refresh();
  };
  const mount = async (pod: Pod, run: PodRun) => {
    for (const v of pod.spec?.volumes ?? []) {
      mkdirSync(volDir(run, v.name), { recursive: true }); // an emptyDir is nothing more
      if (v.secret?.secretName) await secretData(v.secret.secretName, run);
      for (const s of v.projected?.sources ?? []) {
        if (s.secret?.name) await secretData(s.secret.name, run);
        const tok = s.serviceAccountToken;
        if (tok)
          await requestToken(
            pod,
            run,
            join(volDir(run, v.name), tok.path),
            tok.audience,
            tok.expirationSeconds,
          );
      }
    }
    writeSecretFiles(pod, run);
  };

  // --- containers --------------------------------------------------------------------------------
  const failure = (reason: string, message: string) => Object.assign(new Error(message), { reason });
  const fieldRef = (pod: Pod, run: PodRun, path: string): string => {
    const fields: Record<string, string | undefined> = {
      "metadata.name": run.name,
      "metadata.namespace": ns,
      "metadata.uid": run.uid,
      "spec.nodeName": node,
      "spec.serviceAccountName": pod.spec?.serviceAccountName,
      "status.podIP": run.ip,
      "status.hostIP": hostIP,
    };
    if (!(path in fields))
      throw failure("CreateContainerConfigError", `fieldPath ${path}: not in the test kubelet`);
    return fields[path] ?? "";
  };
  const resolveEnv = async (pod: Pod, run: PodRun, c: IContainer) => {
    const env: Record<string, string> = {};
    for (const { secretRef: ref, prefix = "" } of c.envFrom ?? []) {
      if (!ref?.name) continue;
      const data = await secretData(ref.name, run);
      if (!data && !ref.optional)
        throw failure("CreateContainerConfigError", `secret "${ref.name}" not found`);
      for (const [k, v] of Object.entries(data ?? {})) env[prefix + k] = v.toString();
    }
    for (const { name, value = "", valueFrom: from } of c.env ?? []) {
      const ref = from?.secretKeyRef;
      if (from?.fieldRef) env[name] = fieldRef(pod, run, from.fieldRef.fieldPath);
      else if (ref) {
        const v = (await secretData(ref.name!, run))?.[ref.key];
        if (v) env[name] = v.toString();
        else if (!ref.optional)
          throw failure(
            "CreateContainerConfigError",
            `couldn't find key ${ref.key} in Secret ${ns}/${ref.name}`,
          );
      } else if (from) throw failure("CreateContainerConfigError", `env ${name}: not in the test kubelet`);
      else
        env[name] = value.replace(/\$\$|\$\(([A-Za-z_][\w.-]*)\)/g, (s, n?: string) =>
          n ? (env[n] ?? s) : "$",
        );
    }
    // the liberty: a path under a mount is the same path under the volume's folder
    const mounts = [...(c.volumeMounts ?? [])].sort((a, b) => b.mountPath.length - a.mountPath.length);
    for (const [k, v] of Object.entries(env)) {
      const m = mounts.find((m) => v === m.mountPath || v.startsWith(`${m.mountPath.replace(/\/$/, "")}/`));
      if (m) env[k] = join(volDir(run, m.name), m.subPath ?? "", v.slice(m.mountPath.length));
    }
    return env;
  };
  const commandOf = (pod: Pod, run: PodRun, c: IContainer, env: Record<string, string>) => {
    const mapped = o.images?.[c.image ?? ""];
    if (mapped) return mapped({ pod, container: c, podIP: run.ip, env, repoRoot });
    const argv = [...(c.command ?? []), ...(c.args ?? [])];
    const app = (a: string) => (a.startsWith("/app/") ? join(repoRoot, a.slice(5)) : a);
    if (argv[0] === "node" && argv[1]?.startsWith("/app/"))
      return { command: process.execPath, args: argv.slice(1).map(app) };
    throw failure("ErrImagePull", `test kubelet: no mapping for image "${c.image}"`);
  };
  /** Starts a container; what keeps it from starting becomes its waiting reason, tried again in 1 s. */
  const start = async (pod: Pod, run: PodRun, c: Ctr) => {
    c.pending = true;
    let proc: ChildProcess;
    try {
      const env = await resolveEnv(pod, run, c.spec);
      const how = commandOf(pod, run, c.spec, env);
      if (run.terminating || stopped) return void (c.pending = false);
      const out = openSync(join(logDir, `${ns}_${run.name}_${c.spec.name}.log`), "a");
      proc = spawn(how.command, how.args, {
        env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...env, ...how.env },
        cwd: run.dir,
        stdio: ["ignore", out, out],
      });
      closeSync(out);
    } catch (err) {
      const e = err as Error & { reason?: string };
      c.waiting = { reason: e.reason ?? "CreateContainerConfigError", message: e.message };
      const retry = () => {
        c.pending = false; // until then a sync only reports the reason
        kick(run.uid);
      };
      if (!run.deleted) run.timers.push(setTimeout(retry, 1000).unref());
      return kick(run.uid);
    }
    const startedAt = now();
    Object.assign(c, { proc, startedAt, pending: false, waiting: undefined, ready: false, probeFails: 0 });
    c.exited = new Promise<void>((resolve) => {
      const exit = (code: number | null, signal: NodeJS.Signals | null) => {
        if (c.proc !== proc) return; // "error" and "exit" both came
        c.proc = undefined;
        const exitCode = code ?? 128 + (signal ? constants.signals[signal] : 0);
        c.last = { exitCode, reason: exitCode === 0 ? "Completed" : "Error", startedAt, finishedAt: now() };
        resolve();
        restart(known.get(run.uid) ?? pod, run, c, Date.now() - Date.parse(startedAt));
      };
      proc.on("exit", exit);
      proc.on("error", (e) => {
        log(`${run.name}/${c.spec.name}: ${e.message}`);
        exit(127, null);
      });
    });
    kick(run.uid);
  };
  const restart = (pod: Pod, run: PodRun, c: Ctr, ranMs: number) => {
    if (run.terminating || stopped) return;
    const policy = pod.spec?.restartPolicy ?? "Always";
    if (policy === "Never" || (policy === "OnFailure" && c.last?.exitCode === 0)) {
      c.done = true;
      return kick(run.uid);
    }
    // the first restart is at once, then 250 ms doubling to 5 s; 10 s of running forgives
    const delay = ranMs > 10_000 ? 0 : c.backoffMs;
    c.backoffMs = Math.min(delay ? delay * 2 : 250, MAX_BACKOFF_MS);
    if (delay > 0) {
      const message = `back-off ${delay}ms restarting failed container=${c.spec.name} pod=${run.name}`;
      c.waiting = { reason: "CrashLoopBackOff", message };
    }
    c.pending = true;
    c.timer = setTimeout(() => {
      c.restarts++;
      void start(pod, run, c);
    }, delay);
    kick(run.uid);
  };
  /** SIGTERM to every container, SIGKILL to those still there after graceMs (0: SIGKILL at once). */
  const kill = async (run: PodRun, graceMs: number) => {
    run.terminating = true;
    for (const c of run.ctrs) clearTimeout(c.timer);
    const signal = (sig: NodeJS.Signals) => {
      for (const c of run.ctrs) c.proc?.kill(sig);
    };
    const all = Promise.all(run.ctrs.flatMap((c) => (c.proc && c.exited ? [c.exited] : [])));
    signal(graceMs > 0 ? "SIGTERM" : "SIGKILL");
    if ((await Promise.race([all, sleep(graceMs, "late", { ref: false })])) === "late") signal("SIGKILL");
    await all;
  };
  const probe = async (run: PodRun, c: Ctr) => {
    const p = c.spec.readinessProbe;
    const get = p?.httpGet;
    if (!get || !c.proc || Date.now() - Date.parse(c.startedAt!) < (p.initialDelaySeconds ?? 0) * 1000)
      return;
    const port =
      typeof get.port === "number" ? get.port : c.spec.ports?.find((q) => q.name === get.port)?.containerPort;
    const ok = await fetch(`http://${get.host ?? run.ip}:${port}${get.path ?? "/"}`, {
      headers: Object.fromEntries((get.httpHeaders ?? []).map((h) => [h.name, h.value])),
      signal: AbortSignal.timeout((p.timeoutSeconds ?? 1) * 1000),
    }).then(
      async (r) => (await r.body?.cancel(), r.status >= 200 && r.status < 400),
      () => false,
    );
    c.probeFails = ok ? 0 : c.probeFails + 1;
    const ready = ok || (c.ready && c.probeFails < (p.failureThreshold ?? 3));
    if (ready !== c.ready && c.proc) {
      c.ready = ready;
      kick(run.uid);
    }
  };

  // --- the pod -----------------------------------------------------------------------------------
  const pushStatus = async (run: PodRun) => {
    const allReady = run.ctrs.every(isReady) ? "True" : "False";
    const cond = (type: string, status: string) => {
      if (run.transitions.get(type)?.status !== status) run.transitions.set(type, { status, at: now() });
      return { type, status, lastTransitionTime: run.transitions.get(type)!.at };
    };
    const exited = run.ctrs.every((c) => c.done);
    const phase = run.ctrs.some((c) => !c.proc && !c.last)
      ? "Pending" // a container never ran
      : !exited
        ? "Running"
        : run.ctrs.every((c) => c.last?.exitCode === 0)
          ? "Succeeded"
          : "Failed";
    const creating = { reason: "ContainerCreating", ...(run.mountError ? { message: run.mountError } : {}) };
    const status = {
      phase,
      hostIP,
      podIP: run.ip,
      podIPs: [{ ip: run.ip }],
      startTime: run.startTime,
      conditions: [
        cond("PodScheduled", "True"),
        cond("Initialized", "True"),
        cond("ContainersReady", allReady),
        cond("Ready", allReady),
      ],
      containerStatuses: run.ctrs.map((c) => ({
        name: c.spec.name,
        image: c.spec.image ?? "",
        imageID: "",
        ...(c.proc ? { containerID: `test-kubelet://${c.proc.pid}` } : {}),
        ready: isReady(c),
        started: !!c.proc,
        restartCount: c.restarts,
        state: c.proc
          ? { running: { startedAt: c.startedAt } }
          : c.done
            ? { terminated: c.last }
            : { waiting: c.waiting ?? creating },
        lastState: c.last && !c.done ? { terminated: c.last } : {},
      })),
    };
    const text = JSON.stringify(status);
    if (text === run.sent) return;
    await client.patch(`${kubePaths.pods(ns, run.name)}/status`, { status }, "strategic");
    run.sent = text;
  };
  const admit = (pod: Pod): PodRun => {
    const { name, uid } = pod.metadata as { name: string; uid: string };
    const taken = new Set([...runs.values()].map((r) => r.host));
    let host = 1;
    while (taken.has(host)) host++;
    if (host >= 2 ** (32 - Number(bits)) - 1) throw new Error(`podNetwork ${o.podNetwork} is full`);
    const n = netBase + host;
    const ctr = (spec: IContainer): Ctr => ({ spec, restarts: 0, backoffMs: 0, ready: false, probeFails: 0 });
    const run: PodRun = {
      uid,
      name,
      ip: [24, 16, 8, 0].map((s) => (n >>> s) & 255).join("."),
      host,
      dir: join(root, "pods", uid),
      startTime: now(),
      ctrs: (pod.spec?.containers ?? []).map(ctr),
      mounted: false,
      terminating: false,
      deleted: false,
      timers: [],
      tokens: new Map(),
      secrets: new Set(),
      transitions: new Map(),
      sent: "",
    };
    mkdirSync(run.dir, { recursive: true });
    runs.set(uid, run);
    let probing = false;
    const probeAll = () => {
      if (probing) return;
      probing = true;
      void Promise.all(run.ctrs.map((c) => probe(run, c))).finally(() => (probing = false));
    };
    run.timers.push(setInterval(probeAll, 1000).unref());
    return run;
  };
  const teardown = async (run: PodRun) => {
    run.deleted = true;
    for (const tm of run.timers) clearTimeout(tm);
    for (const tok of run.tokens.values()) clearTimeout(tok.timer);
    await kill(run, 0);
    for (const name of run.secrets) {
      const s = secrets.get(name);
      s?.users.delete(run.uid);
      if (s?.users.size === 0) {
        s.watch.stop();
        secrets.delete(name);
      }
    }
    removeDir(run.dir);
    runs.delete(run.uid);
  };
  /** Brings one pod where its object says it should be; runs again on every change (level-triggered). */
  const syncPod = async (uid: string) => {
    const pod = known.get(uid);
    let run = runs.get(uid);
    if (!pod) return void (run && (await teardown(run)));
    if (!pod.spec?.nodeName) return void (pod.metadata?.deletionTimestamp || (await schedule(pod)));
    if (pod.metadata?.deletionTimestamp) {
      if (run?.deleted) return;
      if (run) {
        const grace = pod.metadata.deletionGracePeriodSeconds ?? pod.spec.terminationGracePeriodSeconds ?? 30;
        await kill(run, Math.min(grace, o.maxGraceSeconds ?? 3) * 1000);
        run.deleted = true;
      }
      // the kubelet's final delete: the containers are gone, the object may go now
      const path = kubePaths.pods(ns, pod.metadata.name);
      return void (await client.delete(path, { gracePeriodSeconds: 0, preconditionUid: uid }));
    }
    if (!run && ["Succeeded", "Failed"].includes(pod.status?.phase ?? "")) return;
    run ??= admit(pod);
    if (run.terminating) return;
    if (!run.mounted) {
      try {
        await mount(pod, run);
        [run.mounted, run.mountError] = [true, undefined];
      } catch (err) {
        run.mountError = `MountVolume.SetUp failed: ${(err as Error).message}`;
        await pushStatus(run);
        throw err;
      }
    }
    const r = run;
    await Promise.all(r.ctrs.filter((c) => !c.proc && !c.pending && !c.done).map((c) => start(pod, r, c)));
    await pushStatus(run);
  };
  /** Runs syncPod(uid), one at a time per pod; a kick while it runs runs it once more after. */
  function kick(uid: string): void {
    if (stopped) return;
    let sync = syncers.get(uid);
    if (!sync) {
      let [running, again] = [false, false];
      sync = () => {
        if (running) return void (again = true);
        running = true;
        void (async () => {
          do {
            again = false;
            try {
              await syncPod(uid);
            } catch (err) {
              if (stopped) break;
              log(`pod ${known.get(uid)?.metadata?.name ?? uid}: ${(err as Error).message}`);
              setTimeout(() => kick(uid), 1000).unref();
            }
          } while (again && !stopped);
          running = false;
          if (!known.has(uid) && !runs.has(uid)) syncers.delete(uid);
        })();
      };
      syncers.set(uid, sync);
    }
    sync();
  }

  // --- the watch: every pod of the namespace not bound elsewhere ---------------------------------
  const ours = (p: Pod) => !p.spec?.nodeName || p.spec.nodeName === node;
  const watch = watchCollection<Pod>(
    client,
    kubePaths.pods(ns),
    {},
    {
      onList: (items) => {
        known.clear();
        for (const p of items) if (ours(p)) known.set(p.metadata!.uid!, p);
        for (const uid of new Set([...known.keys(), ...runs.keys()])) kick(uid);
      },
      onEvent: (type, p) => {
        const uid = p.metadata!.uid!;
        if (type === "DELETED" || !ours(p)) known.delete(uid);
        else known.set(uid, p);
        kick(uid);
        // what it held is free: a pod that did not fit may now
        if (type === "DELETED") for (const [u, q] of known) if (!q.spec?.nodeName) kick(u);
      },
      onError: (e) => log(`watching pods: ${e.message}`),
    },
  );
  await watch.synced;

  const killAll = () => {
    for (const run of runs.values()) for (const c of run.ctrs) c.proc?.kill("SIGKILL");
  };
  process.on("exit", killAll);
  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      stopped = true;
      watch.stop();
      clearInterval(heartbeats);
      for (const s of secrets.values()) s.watch.stop();
      for (const run of runs.values()) {
        for (const tm of run.timers) clearTimeout(tm);
        for (const tok of run.tokens.values()) clearTimeout(tok.timer);
      }
      await Promise.all([...runs.values()].map((run) => kill(run, 2000)));
      process.off("exit", killAll);
      removeDir(root);
    })());
  t.after(stop);

  return {
    nodeName: node,
    logDir,
    pods: () =>
      [...runs.values()].map((run) => ({
        name: run.name,
        uid: run.uid,
        ip: run.ip,
        dir: run.dir,
        pids: Object.fromEntries(run.ctrs.flatMap((c) => (c.proc?.pid ? [[c.spec.name, c.proc.pid]] : []))),
        restarts: Object.fromEntries(run.ctrs.map((c) => [c.spec.name, c.restarts])),
        ready: run.ctrs.every(isReady),
      })),
    async renewTokens() {
      const live = [...runs.values()].filter((run) => !run.terminating && !run.deleted);
      await Promise.all(live.flatMap((run) => [...run.tokens.values()].map((tok) => tok.refresh())));
    },
    stop,
  };
}
