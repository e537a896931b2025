// The inference server's health, as the worker sees it before it takes any work: one check (the
// HTTP endpoint's status, or grpc.health.v1 when the function's health protocol is gRPC), and the
// wait at start until a check passes or the ready timeout ends.
import { request } from "undici";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "../../lib/log.js";
import { formatHostPort } from "../../lib/net/index.js";
import type { WorkerConfig } from "./config.js";
import { grpcHealthCheck } from "./grpc-health.js";

export interface InferenceHealthDeps {
  cfg: WorkerConfig;
  logger: Logger;
  /** The agent's stop: ends a check in flight and the wait. */
  signal: AbortSignal;
}

/** One health check: the HTTP endpoint's status, or grpc.health.v1 when the protocol is gRPC. */
export async function checkHealth(deps: InferenceHealthDeps, url: string): Promise<void> {
  const { cfg, signal } = deps;
  if (cfg.health.protocol === "gRPC") {
    await grpcHealthCheck(cfg.inference.host, cfg.health.port, {
      timeoutMs: cfg.health.timeoutMs,
      signal,
    });
    return;
  }
  const res = await request(url, {
    headersTimeout: cfg.health.timeoutMs,
    bodyTimeout: cfg.health.timeoutMs,
    signal,
  });
  await res.body.dump();
  if (res.statusCode !== cfg.health.expectedStatus)
    throw new Error(`status ${res.statusCode}, expected ${cfg.health.expectedStatus}`);
}

/** Checks until the server is healthy (backing off to one check a second), or throws at the ready timeout. */
export async function waitForInference(deps: InferenceHealthDeps): Promise<void> {
  const { cfg, logger, signal } = deps;
  const deadline = Date.now() + cfg.health.readyTimeoutMs;
  const hostPort = formatHostPort({ host: cfg.inference.host, port: cfg.health.port });
  const url =
    cfg.health.protocol === "gRPC"
      ? `grpc://${hostPort} (grpc.health.v1.Health/Check)`
      : `http://${hostPort}${cfg.health.path}`;
  let last = "";
  let delay = 100;
  while (!signal.aborted) {
    try {
      await checkHealth(deps, url);
      logger.info({ url }, "inference server is healthy");
      return;
    } catch (err) {
      last = (err as Error).message;
    }
    if (Date.now() > deadline)
      throw new Error(
        `the inference server at ${url} did not become healthy within ${cfg.health.readyTimeoutMs / 1000} s (last: ${last})`,
      );
    await sleep(delay, undefined, { signal }).catch(() => undefined);
    delay = Math.min(delay * 2, 1000);
  }
}
