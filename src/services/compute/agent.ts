// The compute agent: reads the desired deployments from the control plane, keeps that many
// instances of each running (here, with the local backend), and reports their status back so that
// `callplane deploy get` shows them. It calls the API with its own service credential.
//
// This is its lifecycle shell: the reconcile loop is reconciler.ts, the report status-report.ts,
// the bookkeeping instance-table.ts, and where instances run a backend (backend.ts; local-backend.ts).
import { Router, createHttpService } from "../../lib/http/index.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { createRegistry, type Registry } from "../../lib/metrics.js";
import type { HostPort } from "../../lib/net/index.js";
import { ComputeApiClient } from "./api-client.js";
import { instancesRoot } from "../../lib/secrets/index.js";
import type { BackendFilled, InstanceEnvironment } from "./deployment.js";
import { identityProvider, type TokenSource } from "./identity.js";
import { InstanceTable } from "./instance-table.js";
import { LocalBackend } from "./local-backend.js";
import type { LocalInstance } from "./local.js";
import { Reconciler } from "./reconciler.js";
import { StatusReporter } from "./status-report.js";

export interface ComputeAgentOptions {
  listen: HostPort;
  apiUrl: string;
  serviceToken: string;
  instanceNetwork: string;
  syncIntervalMs: number;
  reporter: string;
  instanceEnv: Omit<InstanceEnvironment, BackendFilled>;
  /**
   * compute.local: whether local/command may run (off unless given), and the user inference
   * servers run as ("", the default: callplane-fn when the agent is root, else its own user).
   */
  local?: { allowCommand?: boolean; runAs?: string };
  /**
   * Where instances get their secrets (compute.secrets): each instance a folder under `root`.
   * Without it, instances get no secrets.
   */
  secrets?: { root: string; env: boolean };
  /** compute.workerIdentity.tokenSource, normalised ("" is the default source). */
  tokenSource: TokenSource;
  logger?: Logger;
  registry?: Registry;
}

export function createComputeAgent(opts: ComputeAgentOptions) {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("compute");
  const api = new ComputeApiClient(opts.apiUrl, opts.serviceToken);
  const backend = new LocalBackend({
    instanceNetwork: opts.instanceNetwork,
    instanceEnv: opts.instanceEnv,
    local: { allowCommand: opts.local?.allowCommand ?? false, runAs: opts.local?.runAs ?? "" },
    instancesRoot: instancesRoot(opts.instanceEnv.dataDir),
    ...(opts.secrets ? { secrets: opts.secrets } : {}),
    // where each instance's identity comes from (the `api` source: the control-plane API signs it)
    identity: identityProvider(opts.tokenSource, { apiUrl: opts.apiUrl, serviceToken: opts.serviceToken }),
    api,
    logger,
  });
  const instances = new InstanceTable<LocalInstance>();
  const reporter = new StatusReporter({
    api,
    reporter: opts.reporter,
    backend: backend.name,
    instances,
    registry,
  });
  const reconciler = new Reconciler({
    api,
    backend,
    instances,
    reporter,
    syncIntervalMs: opts.syncIntervalMs,
    logger,
  });
  const http = createHttpService({
    name: "compute",
    listen: opts.listen,
    logger,
    registry,
    router: new Router(),
    ready: () => reconciler.lastSyncOk,
  });
  return {
    async listen() {
      backend.prepare();
      const url = await http.listen();
      reconciler.start();
      return url;
    },
    instances: () => instances.all(),
    async close(graceMs = 10_000) {
      await reconciler.stop();
      await instances.stopAll();
      backend.dispose();
      await reporter.report().catch(() => undefined);
      await http.close(graceMs);
    },
    destroy() {
      reconciler.halt();
      instances.killAll();
      backend.dispose();
      http.destroy();
    },
  };
}
