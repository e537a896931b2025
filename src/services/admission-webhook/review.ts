// The admission webhook's decision: one AdmissionReview (admission.k8s.io/v1) in, its answer out, a
// pure function of the review and of who the compute agent is.
//
// Service accounts named nvcf-worker-* are the worker pods' identities: a token of one is what the
// plane trusts as "the worker of instance X" (seed 004). Anyone who could run a pod as such an
// account, or have a token minted for it, could speak for that worker. So:
// - a pod-bearing object (a Pod, or anything with a pod template) naming such an account in
//   `serviceAccountName` or in the deprecated `serviceAccount` (which the API server still copies
//   into `serviceAccountName` when that is empty) is refused on CREATE and UPDATE, unless the
//   requester is the compute agent's own service account;
// - a TokenRequest for such an account is refused unless the requester is the agent or a node (the
//   kubelet mints the pod's projected token; the NodeRestriction plugin keeps a node to the pods
//   bound to it).
// Upstream's webhook checks five kinds and one field; this one covers every kind that carries a pod
// template and both fields. Kinds it does not know are allowed: the registration decides what is
// sent, and an unknown kind sent by mistake must not block the cluster.
import { CallplaneError } from "../../lib/errors.js";

export const ADMISSION_API_VERSION = "admission.k8s.io/v1";
/** The prefix of the worker pods' service accounts (the pod contract: `nvcf-worker-<pod name>`). */
export const RESERVED_PREFIX = "nvcf-worker-";
/** The group every kubelet's credential carries (the Node authorizer's). */
export const NODES_GROUP = "system:nodes";
export const NODE_USER_PREFIX = "system:node:";

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

/** The kinds the reviews counter tells apart; anything else is "other". */
export type ReviewedKind = PodBearingKind | "TokenRequest" | "other";
export type ReviewOutcome = "allowed" | "refused";

export interface ReviewPolicy {
  /** The compute agent's username as the API server authenticates it (system:serviceaccount:<ns>:compute-agent). */
  agentUsername: string;
}

/** The parts of an AdmissionReview's request the decision reads. */
export interface AdmissionRequest {
  uid: string;
  kind: { group: string; version: string; kind: string };
  resource: { group: string; version: string; resource: string } | undefined;
  subResource: string;
  name: string;
  namespace: string;
  operation: string;
  userInfo: { username: string; groups: string[] };
  object: unknown;
}

export interface AdmissionReviewAnswer {
  apiVersion: typeof ADMISSION_API_VERSION;
  kind: "AdmissionReview";
  response: { uid: string; allowed: boolean; status?: { code: number; message: string } };
}

export interface ReviewResult {
  answer: AdmissionReviewAnswer;
  kind: ReviewedKind;
  outcome: ReviewOutcome;
  /** The refusal's message (the API server passes it to the client). */
  message?: string;
  /** What a refusal or an allowance for the agent was about: the fields, or the TokenRequest's account. */
  reserved: string[];
}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

function invalid(detail: string, field: string): CallplaneError {
  return new CallplaneError("ADMISSION_REVIEW_INVALID", detail, {
    extra: { errors: [{ field, message: detail }] },
  });
}

function optionalString(o: Json, key: string, where: string): string {
  const v = o[key];
  if (v === undefined || v === null) return "";
  if (typeof v !== "string") throw invalid(`${where}.${key} must be a string`, `${where}.${key}`);
  return v;
}

/**
 * The request of an AdmissionReview, checked for what the decision needs; anything else is
 * ADMISSION_REVIEW_INVALID naming the field (the server answers 400, and the API server, whose
 * failure policy is Fail, refuses what it was reviewing).
 */
export function parseAdmissionReview(body: unknown): AdmissionRequest {
  if (!isObject(body)) throw invalid("the body is not an AdmissionReview: send a JSON object", "(the body)");
  if (body.apiVersion !== ADMISSION_API_VERSION)
    throw invalid(
      `apiVersion is ${JSON.stringify(body.apiVersion ?? null)}; this webhook answers ${ADMISSION_API_VERSION} only (register it with admissionReviewVersions: [v1])`,
      "apiVersion",
    );
  if (body.kind !== "AdmissionReview")
    throw invalid(`kind is ${JSON.stringify(body.kind ?? null)}, not AdmissionReview`, "kind");
  const r = body.request;
  if (!isObject(r))
    throw invalid(
      "the review has no request (an AdmissionReview the API server sends carries one)",
      "request",
    );
  if (typeof r.uid !== "string" || r.uid === "")
    throw invalid("the review's request has no uid (the answer must copy it)", "request.uid");
  if (!isObject(r.kind) || typeof r.kind.kind !== "string" || r.kind.kind === "")
    throw invalid("the review's request has no kind ({group, version, kind})", "request.kind");
  if (typeof r.operation !== "string" || r.operation === "")
    throw invalid("the review's request has no operation", "request.operation");
  const userInfo = r.userInfo === undefined || r.userInfo === null ? {} : r.userInfo;
  if (!isObject(userInfo)) throw invalid("request.userInfo must be an object", "request.userInfo");
  const groups = userInfo.groups ?? [];
  if (!Array.isArray(groups) || groups.some((g) => typeof g !== "string"))
    throw invalid("request.userInfo.groups must be a list of strings", "request.userInfo.groups");
  let resource: AdmissionRequest["resource"];
  if (r.resource !== undefined && r.resource !== null) {
    if (!isObject(r.resource)) throw invalid("request.resource must be an object", "request.resource");
    resource = {
      group: optionalString(r.resource, "group", "request.resource"),
      version: optionalString(r.resource, "version", "request.resource"),
      resource: optionalString(r.resource, "resource", "request.resource"),
    };
  }
  return {
    uid: r.uid,
    kind: {
      group: optionalString(r.kind, "group", "request.kind"),
      version: optionalString(r.kind, "version", "request.kind"),
      kind: r.kind.kind,
    },
    resource,
    subResource: optionalString(r, "subResource", "request"),
    name: optionalString(r, "name", "request"),
    namespace: optionalString(r, "namespace", "request"),
    operation: r.operation,
    userInfo: {
      username: optionalString(userInfo, "username", "request.userInfo"),
      groups: groups as string[],
    },
    object: r.object,
  };
}

function isPodBearing(kind: string): kind is PodBearingKind {
  return Object.hasOwn(POD_SPEC_PATHS, kind);
}

function isTokenRequest(r: AdmissionRequest): boolean {
  return (
    r.kind.kind === "TokenRequest" ||
    (r.resource?.group === "" && r.resource.resource === "serviceaccounts" && r.subResource === "token")
  );
}

function isNode(r: AdmissionRequest): boolean {
  return r.userInfo.groups.includes(NODES_GROUP) || r.userInfo.username.startsWith(NODE_USER_PREFIX);
}

function answer(uid: string, allowed: boolean, message?: string): AdmissionReviewAnswer {
  return {
    apiVersion: ADMISSION_API_VERSION,
    kind: "AdmissionReview",
    response: message === undefined ? { uid, allowed } : { uid, allowed, status: { code: 403, message } },
  };
}

/** The reserved account names a pod-bearing object carries, each as `<field path> "<name>"`. */
export function reservedAccountFields(kind: PodBearingKind, object: unknown): string[] {
  const path = POD_SPEC_PATHS[kind];
  let spec: unknown = object;
  for (const key of path) spec = isObject(spec) ? spec[key] : undefined;
  if (!isObject(spec)) return [];
  const out: string[] = [];
  for (const field of ACCOUNT_FIELDS) {
    const v = spec[field];
    if (typeof v === "string" && v.startsWith(RESERVED_PREFIX))
      out.push(`${[...path, field].join(".")} ${JSON.stringify(v)}`);
  }
  return out;
}

/** The decision on one request (parseAdmissionReview's). */
export function reviewAdmission(r: AdmissionRequest, policy: ReviewPolicy): ReviewResult {
  const agent = policy.agentUsername;
  const isAgent = agent !== "" && r.userInfo.username === agent;
  if (isTokenRequest(r)) {
    if (r.name === "")
      throw invalid(
        "the TokenRequest's review has no request.name (the service account it is for)",
        "request.name",
      );
    const reserved = r.name.startsWith(RESERVED_PREFIX) ? [r.name] : [];
    if (reserved.length === 0 || isAgent || isNode(r))
      return { answer: answer(r.uid, true), kind: "TokenRequest", outcome: "allowed", reserved };
    const message = `TokenRequest for service account ${JSON.stringify(r.name)} (serviceaccounts/${r.name}/token): service accounts starting with ${RESERVED_PREFIX} are reserved for callplane's worker pods; only the compute agent (${agent}) and the nodes (group ${NODES_GROUP}) may request their tokens`;
    return {
      answer: answer(r.uid, false, message),
      kind: "TokenRequest",
      outcome: "refused",
      message,
      reserved,
    };
  }
  const kind = r.kind.kind;
  if (!isPodBearing(kind))
    return { answer: answer(r.uid, true), kind: "other", outcome: "allowed", reserved: [] };
  // DELETE and CONNECT change no account; a subresource (pods/status, written by the kubelet) cannot
  // change the spec's account either (it is immutable on a pod), and the registration sends none
  if ((r.operation !== "CREATE" && r.operation !== "UPDATE") || r.subResource !== "")
    return { answer: answer(r.uid, true), kind, outcome: "allowed", reserved: [] };
  if (!isObject(r.object))
    throw invalid(`the ${r.operation} review of a ${kind} has no request.object`, "request.object");
  const reserved = reservedAccountFields(kind, r.object);
  if (reserved.length === 0 || isAgent)
    return { answer: answer(r.uid, true), kind, outcome: "allowed", reserved };
  const message = `${reserved.join(", ")}: service accounts starting with ${RESERVED_PREFIX} are reserved for callplane's worker pods; only the compute agent (${agent}) may use them`;
  return { answer: answer(r.uid, false, message), kind, outcome: "refused", message, reserved };
}
