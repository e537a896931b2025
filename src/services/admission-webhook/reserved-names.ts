// What is reserved for callplane's worker pods (the pod contract: pods `cp-<id>`), and where a
// pod-bearing object names it: the service accounts `nvcf-worker-<pod name>` in the pod spec's two
// account fields, and the per-pod Secrets `<pod name>-worker` and `<pod name>-secrets` in its
// volumes (secret, projected) and in env and envFrom of every container list. Each finding is a
// field path and the name (`spec.template.spec.serviceAccountName "nvcf-worker-cp-1"`), as a
// refusal shows it. Pure: the object in, the findings out.
import { isObject, type Json } from "./review-request.js";

/** The prefix of the worker pods' service accounts (the pod contract: `nvcf-worker-<pod name>`). */
export const RESERVED_PREFIX = "nvcf-worker-";
/** The per-pod Secrets of the pod contract: `<pod name>-worker` and `<pod name>-secrets`, pods named `cp-<id>`. */
export const RESERVED_SECRET = /^cp-.+-(worker|secrets)$/;

/**
 * Where each pod-bearing kind keeps its pod spec, by request.kind.kind: the kind the review is
 * about once the API server has converted the request to a version the registration names (not
 * requestKind, the version the client sent).
 */
export const POD_SPEC_PATHS = {
  Pod: ["spec"],
  Deployment: ["spec", "template", "spec"],
  StatefulSet: ["spec", "template", "spec"],
  ReplicaSet: ["spec", "template", "spec"],
  DaemonSet: ["spec", "template", "spec"],
  Job: ["spec", "template", "spec"],
  ReplicationController: ["spec", "template", "spec"],
  CronJob: ["spec", "jobTemplate", "spec", "template", "spec"],
  // a PodTemplate has no spec of its own: its template sits at the top
  PodTemplate: ["template", "spec"],
} as const satisfies Record<string, readonly string[]>;

export type PodBearingKind = keyof typeof POD_SPEC_PATHS;

/** The pod spec's fields that name its service account: the current one and the deprecated one. */
export const ACCOUNT_FIELDS = ["serviceAccountName", "serviceAccount"] as const;

/** The pod spec's container lists: each container's env and envFrom may name a Secret. */
export const CONTAINER_LISTS = ["containers", "initContainers", "ephemeralContainers"] as const;

export function isPodBearing(kind: string): kind is PodBearingKind {
  return Object.hasOwn(POD_SPEC_PATHS, kind);
}

/** The pod spec of a pod-bearing object, where its kind keeps it. */
export function podSpecOf(kind: PodBearingKind, object: unknown): Json | undefined {
  let spec: unknown = object;
  for (const key of POD_SPEC_PATHS[kind]) spec = isObject(spec) ? spec[key] : undefined;
  return isObject(spec) ? spec : undefined;
}

const list = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);
/** The value at a path of keys (undefined where the path ends early). */
export const at = (v: unknown, ...keys: string[]): unknown => {
  for (const k of keys) v = isObject(v) ? v[k] : undefined;
  return v;
};

/** The reserved account names a pod-bearing object carries, each as `<field path> "<name>"`. */
export function reservedAccountFields(kind: PodBearingKind, object: unknown): string[] {
  const spec = podSpecOf(kind, object);
  if (spec === undefined) return [];
  const path = POD_SPEC_PATHS[kind];
  const out: string[] = [];
  for (const field of ACCOUNT_FIELDS) {
    const v = spec[field];
    if (typeof v === "string" && v.startsWith(RESERVED_PREFIX))
      out.push(`${[...path, field].join(".")} ${JSON.stringify(v)}`);
  }
  return out;
}

/**
 * The references to a worker pod's Secrets (cp-*-worker, cp-*-secrets) in a pod spec at `path`,
 * each as `<field path> "<name>"`: volumes (secret, projected), and env and envFrom of every
 * container, init container and ephemeral container.
 */
export function reservedSecretRefs(spec: Json, path: readonly string[]): string[] {
  const out: string[] = [];
  const check = (v: unknown, where: string) => {
    if (typeof v === "string" && RESERVED_SECRET.test(v))
      out.push(`${[...path, where].join(".")} ${JSON.stringify(v)}`);
  };
  list(spec.volumes).forEach((v, i) => {
    check(at(v, "secret", "secretName"), `volumes[${i}].secret.secretName`);
    list(at(v, "projected", "sources")).forEach((src, j) =>
      check(at(src, "secret", "name"), `volumes[${i}].projected.sources[${j}].secret.name`),
    );
  });
  for (const containers of CONTAINER_LISTS)
    list(spec[containers]).forEach((c, i) => {
      list(at(c, "env")).forEach((e, j) =>
        check(
          at(e, "valueFrom", "secretKeyRef", "name"),
          `${containers}[${i}].env[${j}].valueFrom.secretKeyRef.name`,
        ),
      );
      list(at(c, "envFrom")).forEach((e, j) =>
        check(at(e, "secretRef", "name"), `${containers}[${i}].envFrom[${j}].secretRef.name`),
      );
    });
  return out;
}
