// The agent's calls to the control-plane API's internal endpoints, with its own service credential:
// the desired deployments, the instances' status, a version's secrets, and the cluster's instance
// types.
import { request } from "undici";
import type { DesiredDeployment } from "./deployment.js";
import type { InstanceTypeOffer } from "./instance-types.js";
import type { FetchedSecrets } from "./secrets.js";

/** The API answered with an error status. */
export class ComputeApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = "ComputeApiError";
  }
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

  async call(method: "GET" | "PUT", path: string, body?: unknown): Promise<unknown> {
    const res = await request(new URL(path, this.apiUrl), {
      method,
      headers: {
        authorization: `Bearer ${this.serviceToken}`,
        ...(body ? { "content-type": "application/json" } : {}),
      },
      ...(body ? { body: JSON.stringify(body) } : {}),
      headersTimeout: 10_000,
      bodyTimeout: 10_000,
    });
    const text = await res.body.text();
    if (res.statusCode >= 300)
      throw new ComputeApiError(
        res.statusCode,
        `${method} ${path} answered ${res.statusCode}: ${text.slice(0, 300)}`,
      );
    return text ? (JSON.parse(text) as unknown) : undefined;
  }

  async desiredState(): Promise<DesiredState> {
    return (await this.call("GET", "/v1/internal/deployments")) as DesiredState;
  }

  /** Replaces every instance this reporter reported before. */
  async putInstances(body: { reporter: string; instances: unknown[] }): Promise<void> {
    await this.call("PUT", "/v1/internal/instances", body);
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
}
