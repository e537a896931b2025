// The agent's calls to the control-plane API's internal endpoints, with its own service credential:
// the desired deployments, the instances' status, a version's secrets, the cluster's instance types
// and its service-account keys (the one call that may carry another bearer: an admin's, to enroll).
import { request } from "undici";
import type { DesiredDeployment } from "./deployment.js";
import type { InstanceTypeOffer } from "./instance-types.js";
import type { FetchedSecrets } from "./secrets.js";

/** The API answered with an error status; `code` is its problem+json code, when the body had one. */
export class ComputeApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly code?: string,
  ) {
    super(message);
    this.name = "ComputeApiError";
  }
}

/** The `code` of an RFC 7807 body (the API's refusals carry one); undefined for any other body. */
function problemCode(text: string): string | undefined {
  try {
    const body = JSON.parse(text) as unknown;
    if (body && typeof body === "object" && typeof (body as { code?: unknown }).code === "string")
      return (body as { code: string }).code;
  } catch {
    // not JSON (a proxy's error page): no code, the message keeps the text
  }
  return undefined;
}

/** What PUT /v1/internal/clusters/{clusterId}/keys sends: the issuer, its key set, and the proofs. */
export interface ClusterKeysBody {
  issuer: string;
  jwks: { keys: ReadonlyArray<Record<string, unknown>> };
  /** The agent's own projected tokens (audience nvcf-icms:<clusterId>), newest first; 0..2. */
  proofs: readonly string[];
}

/** What the API answers when it took the keys. */
export interface ClusterKeysAnswer {
  clusterId: string;
  issuer: string;
  keyIds: string[];
  /** Whether the keys on record changed. */
  changed: boolean;
  updatedAt: string;
}

export interface CallOptions {
  /** Another bearer than the service token (an admin token that enrolls the cluster). */
  bearer?: string;
  signal?: AbortSignal;
  headers?: Record<string, string>;
}

/** What GET /v1/internal/deployments answers. */
export interface DesiredState {
  deployments: DesiredDeployment[];
  workerNatsEnv?: Record<string, string>;
}

export class ComputeApiClient {
  constructor(
    private readonly apiUrl: string,
    private readonly serviceToken: string,
  ) {}

  async call(method: "GET" | "PUT", path: string, body?: unknown, o: CallOptions = {}): Promise<unknown> {
    const res = await request(new URL(path, this.apiUrl), {
      method,
      headers: {
        ...o.headers,
        authorization: `Bearer ${o.bearer ?? this.serviceToken}`,
        ...(body ? { "content-type": "application/json" } : {}),
      },
      ...(body ? { body: JSON.stringify(body) } : {}),
      ...(o.signal ? { signal: o.signal } : {}),
      headersTimeout: 10_000,
      bodyTimeout: 10_000,
    });
    const text = await res.body.text();
    if (res.statusCode >= 300)
      throw new ComputeApiError(
        res.statusCode,
        `${method} ${path} answered ${res.statusCode}: ${text.slice(0, 300)}`,
        problemCode(text),
      );
    return text ? (JSON.parse(text) as unknown) : undefined;
  }

  async desiredState(): Promise<DesiredState> {
    return (await this.call("GET", "/v1/internal/deployments")) as DesiredState;
  }

  /** Replaces every instance this reporter reported before. */
  /** Replaces every instance this reporter reported before; names those another agent reports (left as they were). */
  async putInstances(
    body: { reporter: string; instances: unknown[] },
    proofs: readonly string[] = [],
  ): Promise<{ refused: Array<{ instanceId: string; reason: string }> }> {
    // an enrolled cluster's reports carry its agent's proof (its own projected token)
    const headers = proofs.length ? { "x-callplane-cluster-proof": proofs.join(",") } : undefined;
    const r = (await this.call("PUT", "/v1/internal/instances", body, headers ? { headers } : {})) as
      { refused?: Array<{ instanceId: string; reason: string }> } | undefined;
    return { refused: r?.refused ?? [] };
  }

  async secrets(functionId: string, versionId: string): Promise<FetchedSecrets> {
    return (await this.call(
      "GET",
      `/v1/internal/secrets/functions/${functionId}/versions/${versionId}`,
    )) as FetchedSecrets;
  }

  /** Replaces the instance types this cluster offers (the API refuses deployments no cluster offers). */
  async putInstanceTypes(
    clusterId: string,
    body: { backend: "local" | "kubernetes"; instanceTypes: readonly InstanceTypeOffer[] },
  ): Promise<void> {
    await this.call("PUT", `/v1/internal/clusters/${encodeURIComponent(clusterId)}/instance-types`, body);
  }

  /**
   * Registers the cluster's service-account issuer and key set. With the service token the API takes
   * them only for an enrolled cluster and only when one of `proofs` verifies against the keys it
   * already holds; `bearer` (an admin token, scope cluster-management) enrolls or replaces them.
   */
  async putClusterKeys(
    clusterId: string,
    body: ClusterKeysBody,
    o: CallOptions = {},
  ): Promise<ClusterKeysAnswer> {
    return (await this.call(
      "PUT",
      `/v1/internal/clusters/${encodeURIComponent(clusterId)}/keys`,
      body,
      o,
    )) as ClusterKeysAnswer;
  }
}
