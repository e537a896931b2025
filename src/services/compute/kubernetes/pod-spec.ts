// What one instance is on Kubernetes (the POD CONTRACT): a pod `cp-<instanceId>` running the
// function's container (`inference`) and the callplane worker beside it (`worker`), its own
// ServiceAccount, empty Role and RoleBinding `nvcf-worker-<pod>` (the worker's identity: the pod's
// projected token names that account), a Secret `<pod>-worker` with the worker's NATS credential
// and a Secret `<pod>-secrets` with the function's secrets.json. Only the worker container mounts
// the projected token: the function's own code never holds the credential its worker logs in with.
// Everything is labelled managed-by, cluster and instance-id, which is how the agent finds it again.
import type { IRole, IRoleBinding } from "kubernetes-models/rbac.authorization.k8s.io/v1";
import type { IContainer, IEnvVar, IPod, ISecret, IServiceAccount } from "kubernetes-models/v1";
import type { KubeObject } from "../../../lib/kube/index.js";
import type { DesiredDeployment } from "../deployment.js";
import { workerEnvironment, workerHealthPort, type WorkerSettings } from "../worker-env.js";
import type { ClusterInstanceType } from "./instance-types.js";

export const MANAGED_BY = "callplane-compute";

/** A pod as the API server answers it (it has a name and a uid). */
export type KubePod = IPod & KubeObject & { metadata: { name: string; uid: string } };

export const LABELS = {
  managedBy: "app.kubernetes.io/managed-by",
  cluster: "callplane.io/cluster",
  instanceId: "callplane.io/instance-id",
  functionId: "function-id",
  versionId: "function-version-id",
  deploymentId: "nvcf.nvidia.io/deployment-id",
  ncaId: "nca-id",
} as const;

export const ANNOTATIONS = {
  functionName: "function-name",
  instanceType: "nvcf.nvidia.io/instance-type-name",
  backend: "nvcf.nvidia.io/backend",
  gpuName: "nvcf.nvidia.io/gpu-name",
  /** On the `<pod>-secrets` Secret: the secrets revision it holds (an adopted instance reads it). */
  secretsRevision: "callplane.io/secrets-revision",
} as const;

/** Where the worker container finds its projected token (NVCF_TOKEN_FILE_PATH). */
export const TOKEN_DIR = "/var/run/secrets/tokens";
export const TOKEN_PATH = `${TOKEN_DIR}/token`;
export const TOKEN_SECONDS = 900;
export const SECRETS_DIR = "/var/secrets";
export const INFERENCE_DATA_DIR = "/var/inf";
export const WORKER_COMMAND = ["node", "/app/dist/src/services/worker/main.js"];
/** The NVIDIA GPU taint GPU nodes carry; a pod with GPUs tolerates it. */
export const GPU_TOLERATION = { key: "nvidia.com/gpu", operator: "Exists", effect: "NoSchedule" } as const;

export const podNameOf = (instanceId: string): string => `cp-${instanceId}`;
/** The ServiceAccount, Role and RoleBinding of a pod all have this name. */
export const identityNameOf = (podName: string): string => `nvcf-worker-${podName}`;
export const workerSecretOf = (podName: string): string => `${podName}-worker`;
export const secretsSecretOf = (podName: string): string => `${podName}-secrets`;
/** The audience of a pod's projected token: the cluster it was issued for. */
export const tokenAudience = (clusterId: string): string => `nvcf-icms:${clusterId}`;

/**
 * A label value made of what Kubernetes allows (at most 63 letters, digits, `-`, `_`, `.`, starting
 * and ending with a letter or digit). The ids the agent reads back (UUIDs) pass unchanged.
 */
export function labelValue(s: string): string {
  return s
    .replace(/[^A-Za-z0-9._-]/g, "-")
    .slice(0, 63)
    .replace(/^[^A-Za-z0-9]+|[^A-Za-z0-9]+$/g, "");
}

/** The label selector of everything this agent's cluster id manages. */
export function managedSelector(clusterId: string): string {
  return `${LABELS.managedBy}=${MANAGED_BY},${LABELS.cluster}=${labelValue(clusterId)}`;
}

/** The labels every object of an instance carries. */
export function instanceLabels(clusterId: string, instanceId: string): Record<string, string> {
  return {
    [LABELS.managedBy]: MANAGED_BY,
    [LABELS.cluster]: labelValue(clusterId),
    [LABELS.instanceId]: instanceId,
  };
}

/** `$` starts a Kubernetes variable reference ($(NAME)) in env values and args; `$$` is a literal one. */
const literal = (s: string): string => s.replaceAll("$", "$$$$");

const podIp: IEnvVar["valueFrom"] = { fieldRef: { fieldPath: "status.podIP" } };

const base64 = (s: string): string => Buffer.from(s, "utf8").toString("base64");

/**
 * containerArgs as the container's args, split as a shell splits words, for quotes only: spaces,
 * tabs and newlines separate arguments; single quotes keep everything literal up to the next one;
 * double quotes keep everything but a backslash before `"`, `\\`, `$` or `` ` `` (which escapes it)
 * and a backslash-newline (removed); outside quotes a backslash escapes the next character
 * (backslash-newline is removed). Nothing is expanded: `$HOME`, `*` and `~` stay as written (NVCF's
 * containerArgs are the container's args, not a shell command line; the local backend's
 * local/command runs them through `sh -c` instead). `''` and `""` are an empty argument. An
 * unterminated quote is an error.
 */
export function splitArgs(line: string): string[] {
  const args: string[] = [];
  let word = "";
  let inWord = false;
  for (let k = 0; k < line.length; k++) {
    const c = line[k];
    if (c === " " || c === "\t" || c === "\n") {
      if (inWord) args.push(word);
      word = "";
      inWord = false;
      continue;
    }
    inWord = true;
    if (c === "'") {
      const end = line.indexOf("'", k + 1);
      if (end < 0) throw new Error(`containerArgs has an unterminated single quote: ${line}`);
      word += line.slice(k + 1, end);
      k = end;
    } else if (c === '"') {
      for (k++; ; k++) {
        if (k >= line.length) throw new Error(`containerArgs has an unterminated double quote: ${line}`);
        const d = line[k];
        if (d === '"') break;
        if (d === "\\" && k + 1 < line.length && '"\\$`\n'.includes(line[k + 1])) {
          k++;
          if (line[k] !== "\n") word += line[k];
        } else word += d;
      }
    } else if (c === "\\") {
      k++;
      if (k >= line.length)
        word += c; // (a trailing backslash is itself)
      else if (line[k] !== "\n") word += line[k];
      // (a backslash-newline joins two lines: it is no argument of its own)
      else if (!word) inWord = false;
    } else word += c;
  }
  if (inWord) args.push(word);
  return args;
}

export interface InstanceObjectsInput {
  instanceId: string;
  namespace: string;
  clusterId: string;
  deployment: DesiredDeployment;
  instanceType: ClusterInstanceType;
  /** compute.kubernetes.gpuResource (nvidia.com/gpu). */
  gpuResource: string;
  terminationGraceSeconds: number;
  /** kubernetes.image: the callplane image the worker runs from. */
  workerImage: string;
  worker: WorkerSettings;
  /** NKEY_SEED or NVCF_NATS_ACCOUNT (what the API said at the last sync): into the `-worker` Secret. */
  workerNatsEnv: Record<string, string>;
  secrets: { revision: number; values: Record<string, unknown> };
}

export interface InstanceObjects {
  podName: string;
  serviceAccount: IServiceAccount;
  role: IRole;
  roleBinding: IRoleBinding;
  workerSecret: ISecret;
  secretsSecret: ISecret;
  pod: IPod;
}

/** The secrets Secret's content for one revision (also what a refresh writes). */
export function secretsData(values: Record<string, unknown>): Record<string, string> {
  return { "secrets.json": base64(JSON.stringify(values)) };
}

export function buildInstanceObjects(i: InstanceObjectsInput): InstanceObjects {
  const d = i.deployment;
  const spec = d.specs[0];
  const podName = podNameOf(i.instanceId);
  const identity = identityNameOf(podName);
  const labels = instanceLabels(i.clusterId, i.instanceId);
  const meta = (name: string, annotations?: Record<string, string>) => ({
    name,
    namespace: i.namespace,
    labels: { ...labels },
    ...(annotations ? { annotations } : {}),
  });

  const gpus = i.instanceType.gpuCount;
  const gpuResources = gpus > 0 ? { [i.gpuResource]: String(gpus) } : undefined;
  const ours = new Set(["INFERENCE_PORT", "INFERENCE_HOST", "SECRETS_PATH", "SECRETS_DIR"]);
  const inference: IContainer = {
    name: "inference",
    image: d.spec.containerImage,
    ...(d.spec.containerArgs?.trim() ? { args: splitArgs(d.spec.containerArgs).map(literal) } : {}),
    env: [
      ...d.spec.containerEnvironment
        .filter((e) => !ours.has(e.key))
        .map((e) => ({ name: e.key, value: literal(e.value) })),
      { name: "INFERENCE_PORT", value: String(d.spec.inferencePort) },
      { name: "INFERENCE_HOST", valueFrom: podIp },
      { name: "SECRETS_PATH", value: `${SECRETS_DIR}/secrets.json` },
      { name: "SECRETS_DIR", value: SECRETS_DIR },
    ],
    ports: [{ name: "inference", containerPort: d.spec.inferencePort }],
    ...(gpuResources ? { resources: { requests: gpuResources, limits: { ...gpuResources } } } : {}),
    volumeMounts: [
      { name: "secrets", mountPath: SECRETS_DIR, readOnly: true },
      { name: "inference-data", mountPath: INFERENCE_DATA_DIR },
    ],
  };

  const workerVars = workerEnvironment(d, i.worker, {
    instanceId: i.instanceId,
    tokenFile: TOKEN_PATH,
    identitySource: "psat",
    responsesDir: `${INFERENCE_DATA_DIR}/responses`,
  });
  workerVars.NVCF_INSTANCE_ID = podName;
  // (not 8080 when the function listens there: the worker shares the pod's IP with it)
  const healthPort = workerHealthPort(d);
  const worker: IContainer = {
    name: "worker",
    image: i.workerImage,
    command: WORKER_COMMAND,
    env: [
      ...Object.entries(workerVars).map(([name, value]) => ({ name, value: literal(value) })),
      { name: "INFERENCE_HOST", valueFrom: podIp },
      { name: "HEALTH_HOST", valueFrom: podIp },
    ],
    envFrom: [{ secretRef: { name: workerSecretOf(podName) } }],
    readinessProbe: {
      httpGet: { path: "/v1/health/ready", port: healthPort },
      periodSeconds: 5,
      failureThreshold: 3,
    },
    livenessProbe: {
      httpGet: { path: "/v1/health/live", port: healthPort },
      initialDelaySeconds: 10,
      periodSeconds: 10,
      failureThreshold: 3,
    },
    volumeMounts: [
      { name: "nvcf-worker-token", mountPath: TOKEN_DIR, readOnly: true },
      { name: "inference-data", mountPath: INFERENCE_DATA_DIR },
    ],
  };

  const nodeSelector = Object.entries(i.instanceType.nodeSelector);
  const pod: IPod = {
    apiVersion: "v1",
    kind: "Pod",
    metadata: {
      ...meta(podName, {
        [ANNOTATIONS.functionName]: d.name,
        [ANNOTATIONS.instanceType]: spec.instanceType,
        [ANNOTATIONS.backend]: spec.backend || "kubernetes",
        [ANNOTATIONS.gpuName]: spec.gpu,
      }),
      labels: {
        ...labels,
        [LABELS.functionId]: labelValue(d.functionId),
        [LABELS.versionId]: labelValue(d.versionId),
        [LABELS.deploymentId]: labelValue(d.deploymentId),
        [LABELS.ncaId]: labelValue(d.ncaId),
      },
    },
    spec: {
      serviceAccountName: identity,
      automountServiceAccountToken: false,
      terminationGracePeriodSeconds: i.terminationGraceSeconds,
      restartPolicy: "Always",
      ...(gpus > 0 ? { tolerations: [{ ...GPU_TOLERATION }] } : {}),
      ...(nodeSelector.length
        ? {
            affinity: {
              nodeAffinity: {
                requiredDuringSchedulingIgnoredDuringExecution: {
                  nodeSelectorTerms: [
                    {
                      matchExpressions: nodeSelector.map(([key, value]) => ({
                        key,
                        operator: "In",
                        values: [value],
                      })),
                    },
                  ],
                },
              },
            },
          }
        : {}),
      containers: [inference, worker],
      volumes: [
        { name: "secrets", secret: { secretName: secretsSecretOf(podName) } },
        {
          name: "nvcf-worker-token",
          projected: {
            sources: [
              {
                serviceAccountToken: {
                  audience: tokenAudience(i.clusterId),
                  expirationSeconds: TOKEN_SECONDS,
                  path: "token",
                },
              },
            ],
          },
        },
        { name: "inference-data", emptyDir: {} },
      ],
    },
  };

  return {
    podName,
    serviceAccount: {
      apiVersion: "v1",
      kind: "ServiceAccount",
      metadata: meta(identity),
      automountServiceAccountToken: false,
    },
    // no rules: the account is an identity, not a permission
    role: { apiVersion: "rbac.authorization.k8s.io/v1", kind: "Role", metadata: meta(identity), rules: [] },
    roleBinding: {
      apiVersion: "rbac.authorization.k8s.io/v1",
      kind: "RoleBinding",
      metadata: meta(identity),
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: identity },
      subjects: [{ kind: "ServiceAccount", name: identity, namespace: i.namespace }],
    },
    workerSecret: {
      apiVersion: "v1",
      kind: "Secret",
      metadata: meta(workerSecretOf(podName)),
      type: "Opaque",
      data: Object.fromEntries(Object.entries(i.workerNatsEnv).map(([k, v]) => [k, base64(v)])),
    },
    secretsSecret: {
      apiVersion: "v1",
      kind: "Secret",
      metadata: meta(secretsSecretOf(podName), { [ANNOTATIONS.secretsRevision]: String(i.secrets.revision) }),
      type: "Opaque",
      data: secretsData(i.secrets.values),
    },
    pod,
  };
}

/** What the SA, Role, RoleBinding and Secrets get once their pod exists: the garbage collector removes them with it. */
export function ownerReferenceTo(pod: { name: string; uid: string }) {
  return { apiVersion: "v1", kind: "Pod", name: pod.name, uid: pod.uid, blockOwnerDeletion: false };
}
