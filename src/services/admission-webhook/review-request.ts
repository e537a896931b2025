// An AdmissionReview (admission.k8s.io/v1) as the API server sends it, checked for what the decision
// (review.ts) reads. Anything else is ADMISSION_REVIEW_INVALID naming the field: the server answers
// 400, and the API server, whose failure policy is Fail, refuses what it was reviewing.
import { CallplaneError } from "../../lib/errors.js";

export const ADMISSION_API_VERSION = "admission.k8s.io/v1";

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
  /** The object before an UPDATE (null otherwise). */
  oldObject: unknown;
}

export type Json = Record<string, unknown>;
export const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** ADMISSION_REVIEW_INVALID, naming the field. */
export function invalid(detail: string, field: string): CallplaneError {
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

/** The request of an AdmissionReview, checked for what the decision needs. */
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
    oldObject: r.oldObject,
  };
}
