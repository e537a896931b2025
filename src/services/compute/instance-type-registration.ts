// The instance types a cluster offers, registered with the API (PUT
// /v1/internal/clusters/<clusterId>/instance-types) so that it refuses deployments naming one no
// cluster has. The backend says what it offers (backend.ts offerInstanceTypes) at start and whenever
// that changes; this sends the latest list, one request at a time, and retries a failed one with
// backoff until it lands or a newer list replaces it. An API without the route (404) is told once
// in the log and not retried: the agent works without it, as it did before registration existed.
import type { Logger } from "../../lib/log.js";
import { ComputeApiError, type ComputeApiClient } from "./api-client.js";
import type { InstanceTypeOffer } from "./instance-types.js";

export interface InstanceTypeRegistrationOptions {
  api: ComputeApiClient;
  clusterId: string;
  backend: "local" | "kubernetes";
  logger: Logger;
  retry?: { initialMs: number; maxMs: number };
}

export class InstanceTypeRegistration {
  /** The list registered last (tests and diagnostics). */
  registered: readonly InstanceTypeOffer[] | undefined;
  private wanted: readonly InstanceTypeOffer[] | undefined;
  private sending: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private delay: number;
  private closed = false;

  constructor(private readonly opts: InstanceTypeRegistrationOptions) {
    this.delay = opts.retry?.initialMs ?? 1000;
  }

  /** The backend's current list: registered now (after a request under way). */
  readonly publish = (types: readonly InstanceTypeOffer[]): void => {
    this.wanted = [...types].sort((a, b) => a.name.localeCompare(b.name));
    this.delay = this.opts.retry?.initialMs ?? 1000;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.kick();
  };

  private kick(): void {
    if (this.closed || this.sending || !this.wanted) return;
    const types = this.wanted;
    this.wanted = undefined;
    this.sending = this.send(types).finally(() => {
      this.sending = undefined;
      this.kick();
    });
  }

  private async send(types: readonly InstanceTypeOffer[]): Promise<void> {
    const { api, clusterId, backend, logger } = this.opts;
    try {
      await api.putInstanceTypes(clusterId, { backend, instanceTypes: types });
      this.registered = types;
      logger.info(
        { clusterId, instanceTypes: types.map((t) => t.name) },
        "instance types registered with the API",
      );
    } catch (err) {
      if (err instanceof ComputeApiError && err.status === 404) {
        logger.warn(
          { clusterId, err: err.message },
          "the API does not take instance-type registrations (an older API); deployments are not checked against this cluster's types",
        );
        return;
      }
      logger.warn(
        { clusterId, err: (err as Error).message, retryInMs: this.delay },
        "could not register the instance types with the API; retrying",
      );
      if (this.wanted || this.closed) return;
      const retry = types;
      this.timer = setTimeout(() => {
        this.timer = undefined;
        if (!this.wanted) this.wanted = retry;
        this.kick();
      }, this.delay);
      this.timer.unref();
      this.delay = Math.min(this.delay * 2, this.opts.retry?.maxMs ?? 30_000);
    }
  }

  /** Stops retrying; waits for a request under way. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    await this.sending;
  }
}
