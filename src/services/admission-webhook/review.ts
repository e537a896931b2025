// The admission webhook's decision: one AdmissionReview (admission.k8s.io/v1, its request checked by
// review-request.ts) in, its answer out, a pure function of the review and of who the compute agent
// is. What is reserved, and where an object names it, is found by reserved-names.ts.
//
// Service accounts named nvcf-worker-* are the worker pods' identities: a token of one is what the
// plane trusts as "the worker of instance X" (seed 004). Anyone who could run a pod as such an
// account, or have a token minted for it, could speak for that worker. And the per-pod Secrets
// cp-<id>-worker (the worker's NATS credential) and cp-<id>-secrets (the function's secrets) are
// that worker's too. So, for anyone but the compute agent's own service account:
// - a pod-bearing object (a Pod, or anything with a pod template) naming such an account in
//   `serviceAccountName` or in the deprecated `serviceAccount` (which the API server still copies
//   into `serviceAccountName` when that is empty), or referencing such a Secret (volumes, projected
//   sources, env, envFrom of any container), is refused on CREATE; on UPDATE only when the name is
//   new at its path (not in oldObject there): the garbage collector removing a finalizer, or a
//   label, must not be refused for what the agent already put there;
// - adding ephemeral containers (pods/ephemeralcontainers) to a pod that runs such an account is
//   refused: they could mount the pod's token volume or its Secrets' volume;
// - a legacy token Secret (kubernetes.io/service-account-token) for such an account is refused: the
//   token controller would fill it with a token that never expires;
// - a TokenRequest for such an account is refused unless the requester is the agent or a node (group
//   system:nodes: the kubelet mints the pod's projected token; the NodeRestriction plugin keeps a
//   node to the pods bound to it).
// Upstream's webhook checks five kinds and one field; this one covers every kind that carries a pod
// template and both fields. Kinds it does not know are allowed: the registration decides what is
// sent, and an unknown kind sent by mistake must not block the cluster.
import { ADMISSION_API_VERSION, invalid, isObject, type AdmissionRequest } from "./review-request.js";
import {
  at,
  isPodBearing,
  POD_SPEC_PATHS,
  podSpecOf,
  RESERVED_PREFIX,
  reservedAccountFields,
  reservedSecretRefs,
  type PodBearingKind,
} from "./reserved-names.js";

/** The group every kubelet's credential carries (the Node authorizer's). */
export const NODES_GROUP = "system:nodes";
/** A legacy service-account token Secret: the token controller writes a non-expiring token into it. */
export const SERVICE_ACCOUNT_TOKEN_TYPE = "kubernetes.io/service-account-token";
export const SERVICE_ACCOUNT_NAME_ANNOTATION = "kubernetes.io/service-account.name";

/**
 * The kinds the review reads besides the pod-bearing ones, each with the registration's resource
 * (render/admission-webhook.ts registers exactly these and POD_SPEC_PATHS' kinds; the unit test checks).
 * EphemeralContainers is the kind of pods/ephemeralcontainers up to 1.22 (a Pod from 1.23).
 */
export const OTHER_REVIEWED = {
  TokenRequest: { resource: "serviceaccounts/token", operations: ["CREATE"] },
  EphemeralContainers: { resource: "pods/ephemeralcontainers", operations: ["UPDATE"] },
  Secret: { resource: "secrets", operations: ["CREATE", "UPDATE"] },
} as const;

/** The kinds the reviews counter tells apart; anything else is "other". */
export type ReviewedKind = PodBearingKind | keyof typeof OTHER_REVIEWED | "other";
export type ReviewOutcome = "allowed" | "refused";

export interface ReviewPolicy {
  /** The compute agent's username as the API server authenticates it (system:serviceaccount:<ns>:compute-agent). */
  agentUsername: string;
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

function isTokenRequest(r: AdmissionRequest): boolean {
  return (
    r.kind.kind === "TokenRequest" ||
    (r.resource?.group === "" && r.resource.resource === "serviceaccounts" && r.subResource === "token")
  );
}

function isNode(r: AdmissionRequest): boolean {
  // the group, not a username that looks like a node's: an authenticator (a token file, a webhook,
  // an OIDC claim) may hand out any username, and the Node authorizer goes by the group as well
  return r.userInfo.groups.includes(NODES_GROUP);
}

function answer(uid: string, allowed: boolean, message?: string): AdmissionReviewAnswer {
  return {
    apiVersion: ADMISSION_API_VERSION,
    kind: "AdmissionReview",
    response: message === undefined ? { uid, allowed } : { uid, allowed, status: { code: 403, message } },
  };
}

/** What of `now` was not in `before`: a name already at its path on the old object is not new. */
const added = (now: string[], before: string[]) => now.filter((x) => !before.includes(x));

const ACCOUNT_REASON = `service accounts starting with ${RESERVED_PREFIX} are reserved for callplane's worker pods`;
const SECRET_REASON =
  "the Secrets cp-<id>-worker and cp-<id>-secrets hold a worker pod's NATS credential and its function's secrets";

interface Finding {
  fields: string[];
  reason: string;
}

function refuse(
  r: AdmissionRequest,
  kind: ReviewedKind,
  findings: Finding[],
  agent: string,
  may = "may use them",
): ReviewResult {
  const found = findings.filter((f) => f.fields.length > 0);
  const message = `${found.map((f) => `${f.fields.join(", ")}: ${f.reason}`).join("; ")}; only the compute agent (${agent}) ${may}`;
  const reserved = found.flatMap((f) => f.fields);
  return { answer: answer(r.uid, false, message), kind, outcome: "refused", message, reserved };
}

const allow = (r: AdmissionRequest, kind: ReviewedKind, reserved: string[] = []): ReviewResult => ({
  answer: answer(r.uid, true),
  kind,
  outcome: "allowed",
  reserved,
});

function isEphemeralContainers(r: AdmissionRequest): boolean {
  return (
    r.kind.kind === "EphemeralContainers" ||
    (r.resource?.group === "" && r.resource.resource === "pods" && r.subResource === "ephemeralcontainers")
  );
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
    if (reserved.length === 0 || isAgent || isNode(r)) return allow(r, "TokenRequest", reserved);
    const message = `TokenRequest for service account ${JSON.stringify(r.name)} (serviceaccounts/${r.name}/token): ${ACCOUNT_REASON}; only the compute agent (${agent}) and the nodes (group ${NODES_GROUP}) may request their tokens`;
    return {
      answer: answer(r.uid, false, message),
      kind: "TokenRequest",
      outcome: "refused",
      message,
      reserved,
    };
  }
  const write = r.operation === "CREATE" || r.operation === "UPDATE";
  if (isEphemeralContainers(r)) {
    if (r.operation !== "UPDATE") return allow(r, "EphemeralContainers");
    if (!isObject(r.object))
      throw invalid("the UPDATE review of pods/ephemeralcontainers has no request.object", "request.object");
    if (r.kind.kind === "Pod") {
      // 1.23 and later review the whole pod: its account, and what the new containers reference
      const accounts = reservedAccountFields("Pod", r.object);
      const spec = podSpecOf("Pod", r.object) ?? {};
      const secrets = added(
        reservedSecretRefs(spec, ["spec"]),
        reservedSecretRefs(podSpecOf("Pod", r.oldObject) ?? {}, ["spec"]),
      );
      if (isAgent || (accounts.length === 0 && secrets.length === 0))
        return allow(r, "EphemeralContainers", [...accounts, ...secrets]);
      return refuse(
        r,
        "EphemeralContainers",
        [
          {
            fields: accounts,
            reason: `${ACCOUNT_REASON}, and an ephemeral container in such a pod could read its token`,
          },
          { fields: secrets, reason: SECRET_REASON },
        ],
        agent,
        "may add ephemeral containers to it",
      );
    }
    // up to 1.22 the review carries an EphemeralContainers object, without the pod's account: in the
    // workers' namespace (the registration's selector), only the agent may add any
    if (isAgent) return allow(r, "EphemeralContainers");
    return refuse(
      r,
      "EphemeralContainers",
      [
        {
          fields: [`pods/${r.name}/ephemeralcontainers`],
          reason: `this review (kind EphemeralContainers) does not carry the pod's service account, and a pod in this namespace may run one reserved for callplane's worker pods (${RESERVED_PREFIX}*), whose token an ephemeral container could read`,
        },
      ],
      agent,
      "may add ephemeral containers here",
    );
  }
  const kind = r.kind.kind;
  if (kind === "Secret") {
    if (!write) return allow(r, "Secret");
    if (!isObject(r.object))
      throw invalid(`the ${r.operation} review of a Secret has no request.object`, "request.object");
    const tokenFor = (o: unknown): string[] => {
      const account = at(o, "metadata", "annotations", SERVICE_ACCOUNT_NAME_ANNOTATION);
      return at(o, "type") === SERVICE_ACCOUNT_TOKEN_TYPE &&
        typeof account === "string" &&
        account.startsWith(RESERVED_PREFIX)
        ? [`metadata.annotations["${SERVICE_ACCOUNT_NAME_ANNOTATION}"] ${JSON.stringify(account)}`]
        : [];
    };
    const reserved = added(tokenFor(r.object), r.operation === "UPDATE" ? tokenFor(r.oldObject) : []);
    if (reserved.length === 0 || isAgent) return allow(r, "Secret", reserved);
    return refuse(
      r,
      "Secret",
      [
        {
          fields: reserved,
          reason: `${ACCOUNT_REASON}, and a Secret of type ${SERVICE_ACCOUNT_TOKEN_TYPE} for one gets a token that never expires`,
        },
      ],
      agent,
      "may create such a Secret",
    );
  }
  if (!isPodBearing(kind)) return allow(r, "other");
  // DELETE and CONNECT change no account; a subresource (pods/status, written by the kubelet) cannot
  // change the spec's account either (it is immutable on a pod), and the registration sends none
  // besides pods/ephemeralcontainers (above)
  if (!write || r.subResource !== "") return allow(r, kind);
  if (!isObject(r.object))
    throw invalid(`the ${r.operation} review of a ${kind} has no request.object`, "request.object");
  const path = POD_SPEC_PATHS[kind];
  const found = (o: unknown) => {
    const spec = podSpecOf(kind, o);
    return {
      accounts: reservedAccountFields(kind, o),
      secrets: spec === undefined ? [] : reservedSecretRefs(spec, path),
    };
  };
  const now = found(r.object);
  // on UPDATE only what the update brings: the garbage collector, a label, a finalizer keep what the
  // agent put there (a Pod's account and volumes are immutable, so every Pod UPDATE passes)
  const before = r.operation === "UPDATE" ? found(r.oldObject) : { accounts: [], secrets: [] };
  const accounts = added(now.accounts, before.accounts);
  const secrets = added(now.secrets, before.secrets);
  if ((accounts.length === 0 && secrets.length === 0) || isAgent)
    return allow(r, kind, [...accounts, ...secrets]);
  return refuse(
    r,
    kind,
    [
      { fields: accounts, reason: ACCOUNT_REASON },
      { fields: secrets, reason: SECRET_REASON },
    ],
    agent,
  );
}
