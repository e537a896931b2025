// A thin Kubernetes API client over undici: JSON requests with a bearer token over TLS (the
// cluster's CA), typed errors by status and reason, and a request counter (the agent's bench counts
// API requests per pod). Watches are watch.ts. Why not @kubernetes/client-node: its 1.x line (the
// last for Node 20) fetches with node-fetch and parses every watch line through its own model
// classes; the agent needs a handful of verbs, one pool and exact control of timeouts and aborts.
import { readFileSync } from "node:fs";
import { Agent, request, type Dispatcher } from "undici";

export interface KubeConnection {
  /** https://host:port of the API server. */
  server: string;
  /** PEM of the CA that signed the API server's certificate. */
  caPem: string;
  /** A bearer token, or a file holding one (a projected token, read again on every request). */
  token?: string;
  tokenFile?: string;
}

/** What the API server answered when it refused (its Status object, when it sent one). */
export class KubeError extends Error {
  constructor(
    readonly status: number,
    readonly reason: string,
    message: string,
    readonly details?: unknown,
  ) {
    super(message);
    this.name = "KubeError";
  }
}

export const isNotFound = (e: unknown): boolean => e instanceof KubeError && e.status === 404;
export const isAlreadyExists = (e: unknown): boolean =>
  e instanceof KubeError && e.status === 409 && e.reason === "AlreadyExists";
export const isConflict = (e: unknown): boolean => e instanceof KubeError && e.status === 409;
export const isGone = (e: unknown): boolean => e instanceof KubeError && e.status === 410;

/** The minimum every object has. */
export interface KubeObject {
  apiVersion?: string;
  kind?: string;
  metadata?: {
    name?: string;
    namespace?: string;
    uid?: string;
    resourceVersion?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    ownerReferences?: Array<{
      apiVersion: string;
      kind: string;
      name: string;
      uid: string;
      controller?: boolean;
      blockOwnerDeletion?: boolean;
    }>;
    deletionTimestamp?: string;
    creationTimestamp?: string;
    [k: string]: unknown;
  };
  [k: string]: unknown;
}

export interface KubeList<T extends KubeObject = KubeObject> {
  metadata: { resourceVersion: string; continue?: string };
  items: T[];
}

export type PatchType = "merge" | "strategic" | "json" | "apply";
const PATCH_CONTENT_TYPE: Record<PatchType, string> = {
  merge: "application/merge-patch+json",
  strategic: "application/strategic-merge-patch+json",
  json: "application/json-patch+json",
  apply: "application/apply-patch+yaml",
};

export interface RequestOptions {
  query?: Record<string, string | number | boolean | undefined>;
  body?: unknown;
  contentType?: string;
  /** What the answer may be (default application/json; 1.20's /openid/v1/jwks answers 406 to it and wants application/jwk-set+json). */
  accept?: string;
  signal?: AbortSignal;
  /** Milliseconds to wait for the answer's headers (default 30 s; a watch sets its own). */
  timeoutMs?: number;
  /**
   * Milliseconds the body may go silent (default 60 s): a connection that died half-open (a load
   * balancer dropped it) fails then instead of stalling the caller until TCP gives up. A watch sets
   * its own, past the server's own end of the watch.
   */
  bodyTimeoutMs?: number;
}

export class KubeClient {
  readonly server: string;
  readonly dispatcher: Dispatcher;
  /** Requests sent since the client was made (every verb, watches included). */
  requests = 0;
  private readonly conn: KubeConnection;

  constructor(conn: KubeConnection, opts: { connections?: number } = {}) {
    this.conn = conn;
    this.server = conn.server.replace(/\/+$/, "");
    this.dispatcher = new Agent({
      connect: { ca: conn.caPem },
      connections: opts.connections ?? 16,
      keepAliveTimeout: 30_000,
    });
  }

  /** The token this request carries (a token file is read each time: the kubelet rotates it). */
  bearer(): string | undefined {
    if (this.conn.token) return this.conn.token;
    if (this.conn.tokenFile) return readFileSync(this.conn.tokenFile, "utf8").trim();
    return undefined;
  }

  url(path: string, query?: RequestOptions["query"]): string {
    const u = new URL(this.server + path);
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) u.searchParams.set(k, String(v));
    return u.toString();
  }

  /** Sends one request; answers the parsed JSON body, or throws a KubeError. */
  async request<T = unknown>(
    method: Dispatcher.HttpMethod,
    path: string,
    o: RequestOptions = {},
  ): Promise<T> {
    const res = await this.send(method, path, o);
    const text = await res.body.text();
    if (res.statusCode >= 300) throw errorOf(method, path, res.statusCode, text);
    return (text ? JSON.parse(text) : undefined) as T;
  }

  /** Sends one request and hands back the raw answer (watch.ts reads its body as a stream). */
  async send(
    method: Dispatcher.HttpMethod,
    path: string,
    o: RequestOptions = {},
  ): Promise<Dispatcher.ResponseData> {
    this.requests++;
    const token = this.bearer();
    const headers: Record<string, string> = { accept: o.accept ?? "application/json" };
    if (token) headers.authorization = `Bearer ${token}`;
    if (o.body !== undefined) headers["content-type"] = o.contentType ?? "application/json";
    return await request(this.url(path, o.query), {
      method,
      headers,
      dispatcher: this.dispatcher,
      ...(o.body !== undefined ? { body: JSON.stringify(o.body) } : {}),
      ...(o.signal ? { signal: o.signal } : {}),
      headersTimeout: o.timeoutMs ?? 30_000,
      bodyTimeout: o.bodyTimeoutMs ?? 60_000,
    });
  }

  get<T extends KubeObject>(path: string, o?: RequestOptions): Promise<T> {
    return this.request<T>("GET", path, o);
  }

  list<T extends KubeObject>(path: string, o?: RequestOptions): Promise<KubeList<T>> {
    return this.request<KubeList<T>>("GET", path, o);
  }

  create<T extends KubeObject>(path: string, obj: KubeObject, o: RequestOptions = {}): Promise<T> {
    return this.request<T>("POST", path, { ...o, body: obj });
  }

  replace<T extends KubeObject>(path: string, obj: KubeObject, o: RequestOptions = {}): Promise<T> {
    return this.request<T>("PUT", path, { ...o, body: obj });
  }

  patch<T extends KubeObject>(
    path: string,
    patch: unknown,
    type: PatchType = "merge",
    o: RequestOptions = {},
  ): Promise<T> {
    return this.request<T>("PATCH", path, { ...o, body: patch, contentType: PATCH_CONTENT_TYPE[type] });
  }

  /** Deletes; `NotFound` counts as deleted when `tolerateMissing` (the default). */
  async delete(
    path: string,
    o: RequestOptions & {
      tolerateMissing?: boolean;
      gracePeriodSeconds?: number;
      preconditionUid?: string;
    } = {},
  ): Promise<void> {
    const body: Record<string, unknown> = { apiVersion: "v1", kind: "DeleteOptions" };
    if (o.gracePeriodSeconds !== undefined) body.gracePeriodSeconds = o.gracePeriodSeconds;
    if (o.preconditionUid) body.preconditions = { uid: o.preconditionUid };
    try {
      await this.request("DELETE", path, { ...o, body });
    } catch (err) {
      if (o.tolerateMissing !== false && isNotFound(err)) return;
      throw err;
    }
  }

  close(): Promise<void> {
    return this.dispatcher.close();
  }
}

function errorOf(method: string, path: string, status: number, text: string): KubeError {
  let reason = "";
  let message = text.slice(0, 500);
  let details: unknown;
  try {
    const s = JSON.parse(text) as { kind?: string; reason?: string; message?: string; details?: unknown };
    if (s.kind === "Status") {
      reason = s.reason ?? "";
      message = s.message ?? message;
      details = s.details;
    }
  } catch {
    // not JSON: the text itself says what happened
  }
  return new KubeError(
    status,
    reason,
    `${method} ${path}: ${status} ${reason ? `${reason}: ` : ""}${message}`,
    details,
  );
}

/** Paths of the kinds the agent uses (core and rbac). */
export const kubePaths = {
  namespaced(group: string, version: string, plural: string, ns: string, name?: string): string {
    const base = group === "" ? `/api/${version}` : `/apis/${group}/${version}`;
    return `${base}/namespaces/${ns}/${plural}${name ? `/${encodeURIComponent(name)}` : ""}`;
  },
  cluster(group: string, version: string, plural: string, name?: string): string {
    const base = group === "" ? `/api/${version}` : `/apis/${group}/${version}`;
    return `${base}/${plural}${name ? `/${encodeURIComponent(name)}` : ""}`;
  },
  pods: (ns: string, name?: string) => kubePaths.namespaced("", "v1", "pods", ns, name),
  secrets: (ns: string, name?: string) => kubePaths.namespaced("", "v1", "secrets", ns, name),
  serviceAccounts: (ns: string, name?: string) => kubePaths.namespaced("", "v1", "serviceaccounts", ns, name),
  roles: (ns: string, name?: string) =>
    kubePaths.namespaced("rbac.authorization.k8s.io", "v1", "roles", ns, name),
  roleBindings: (ns: string, name?: string) =>
    kubePaths.namespaced("rbac.authorization.k8s.io", "v1", "rolebindings", ns, name),
  nodes: (name?: string) => kubePaths.cluster("", "v1", "nodes", name),
  namespaces: (name?: string) => kubePaths.cluster("", "v1", "namespaces", name),
};

/** Reads the in-cluster connection (a pod's own service account), or the files given. */
export function kubeConnection(opts: {
  server?: string;
  caFile?: string;
  tokenFile?: string;
}): KubeConnection {
  const sa = "/var/run/secrets/kubernetes.io/serviceaccount";
  const host = process.env.KUBERNETES_SERVICE_HOST;
  const port = process.env.KUBERNETES_SERVICE_PORT ?? "443";
  const server = opts.server || (host ? `https://${host.includes(":") ? `[${host}]` : host}:${port}` : "");
  if (!server)
    throw new Error(
      "no Kubernetes API server: set compute.kubernetes.apiServer, or run the agent in a pod (KUBERNETES_SERVICE_HOST)",
    );
  const caFile = opts.caFile || `${sa}/ca.crt`;
  const tokenFile = opts.tokenFile || `${sa}/token`;
  return { server, caPem: readFileSync(caFile, "utf8"), tokenFile };
}
