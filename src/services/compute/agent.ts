// The compute agent: reads the desired deployments from the control plane, keeps that many
// instances of each running (as processes on this machine, or as pods on Kubernetes), and reports
// their status back so that `callplane deploy get` shows them. It calls the API with its own service
// credential.
//
// This is its lifecycle shell: the reconcile loop is reconciler.ts, the report status-report.ts,
// the bookkeeping instance-table.ts, the instance types instance-types.ts, and where instances run
// a backend (backend.ts; local-backend.ts, kubernetes/backend.ts).
import { Router, createHttpService } from "../../lib/http/index.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { createRegistry, type Registry } from "../../lib/metrics.js";
import type { HostPort } from "../../lib/net/index.js";
import type { KubeClient } from "../../lib/kube/index.js";
import { ComputeApiClient } from "./api-client.js";
import { instancesRoot } from "../../lib/secrets/index.js";
import type { ComputeBackend, ComputeInstance } from "./backend.js";
import type { BackendFilled, InstanceEnvironment } from "./deployment.js";
import { identityProvider, type TokenSource } from "./identity.js";
import { InstanceTable } from "./instance-table.js";
import { InstanceTypeRegistration } from "./instance-type-registration.js";
import { KubernetesBackend } from "./kubernetes/backend.js";
import type { ClusterKeysSettings } from "./kubernetes/cluster-keys.js";
import type { ClusterInstanceType } from "./kubernetes/instance-types.js";
import type { PodInstance } from "./kubernetes/pod-instance.js";
import { LocalBackend } from "./local-backend.js";
import type { LocalInstance } from "./local.js";
import { Reconciler } from "./reconciler.js";
import { StatusReporter } from "./status-report.js";

interface CommonAgentOptions {
  listen: HostPort;
  apiUrl: string;
  serviceToken: string;
  syncIntervalMs: number;
  reporter: string;
  instanceEnv: Omit<InstanceEnvironment, BackendFilled>;
  /** compute.workerIdentity.tokenSource, normalised ("" is the backend's default source). */
  tokenSource: TokenSource;
  /** compute.workerIdentity.clusterId: the instance types are registered for it ("local" by default). */
  clusterId?: string;
  logger?: Logger;
  registry?: Registry;
}

/** The agent with the local backend. */
export interface ComputeAgentOptions extends CommonAgentOptions {
  kubernetes?: undefined;
  instanceNetwork: string;
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
}

/** The agent with the Kubernetes backend (compute.kubernetes, kubernetes.*). */
export interface KubernetesAgentOptions extends CommonAgentOptions {
  kubernetes: {
    /** The API server, as the agent's own service account. */
    client: KubeClient;
    /** kubernetes.workerNamespace */
    namespace: string;
    /** kubernetes.image: the worker sidecar's image. */
    workerImage: string;
    gpuResource: string;
    unschedulableSeconds: number;
    terminationGraceSeconds: number;
    /** compute.kubernetes.instanceTypes; empty: found on the nodes. */
    instanceTypes: readonly ClusterInstanceType[];
    /** How long stopping waits for a deleted pod to go, beyond its grace (30 s by default). */
    deleteWaitMs?: number;
    /** The cluster's keys, registered with the API while the agent runs (main.ts always sets it). */
    clusterKeys?: ClusterKeysSettings;
  };
}

export interface ComputeAgent<I extends ComputeInstance> {
  listen(): Promise<URL>;
  instances(): I[];
  readonly backend: ComputeBackend<I>;
  readonly instanceTypes: InstanceTypeRegistration;
  /** Stops syncing; stops its instances (local) or leaves them to the next start (pods); reports. */
  close(graceMs?: number): Promise<void>;
  destroy(): void;
}

export function createComputeAgent(opts: ComputeAgentOptions): ComputeAgent<LocalInstance>;
export function createComputeAgent(opts: KubernetesAgentOptions): ComputeAgent<PodInstance>;
export function createComputeAgent(
  opts: ComputeAgentOptions | KubernetesAgentOptions,
): ComputeAgent<LocalInstance> | ComputeAgent<PodInstance> {
  const logger = opts.logger ?? silentLogger();
  const api = new ComputeApiClient(opts.apiUrl, opts.serviceToken);
  const clusterId = opts.clusterId ?? "local";
  if (opts.kubernetes) {
    const k = opts.kubernetes;
    if (opts.tokenSource !== "psat")
      throw new Error(
        `compute.workerIdentity.tokenSource is ${opts.tokenSource}: on the kubernetes backend a pod's identity is its projected token (psat)`,
      );
    const backend = new KubernetesBackend({
      client: k.client,
      namespace: k.namespace,
      clusterId,
      workerImage: k.workerImage,
      gpuResource: k.gpuResource,
      unschedulableSeconds: k.unschedulableSeconds,
      terminationGraceSeconds: k.terminationGraceSeconds,
      instanceTypes: k.instanceTypes,
      worker: opts.instanceEnv,
      restart: opts.instanceEnv.restart,
      ...(k.deleteWaitMs !== undefined ? { deleteWaitMs: k.deleteWaitMs } : {}),
      ...(k.clusterKeys ? { clusterKeys: k.clusterKeys } : {}),
      api,
      logger,
    });
    return runAgent(opts, backend, api, clusterId, logger);
  }
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
  return runAgent(opts, backend, api, clusterId, logger);
}

function runAgent<I extends ComputeInstance>(
  opts: CommonAgentOptions,
  backend: ComputeBackend<I>,
  api: ComputeApiClient,
  clusterId: string,
  logger: Logger,
): ComputeAgent<I> {
  const registry = opts.registry ?? createRegistry("compute");
  const instances = new InstanceTable<I>();
  const reporter = new StatusReporter({
    api,
    reporter: opts.reporter,
    backend: backend.name,
    instances,
    registry,
    logger,
    proofs: () => backend.reportProofs?.() ?? [],
  });
  const reconciler = new Reconciler({
    api,
    backend,
    instances,
    reporter,
    syncIntervalMs: opts.syncIntervalMs,
    clusterId,
    logger,
  });
  const instanceTypes = new InstanceTypeRegistration({
    api,
    clusterId,
    backend: backend.name,
    logger,
    retry: opts.instanceEnv.restart,
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
    backend,
    instanceTypes,
    async listen() {
      // what an earlier run left running (pods) joins the table before the first sync
      instances.adopt(await backend.prepare(reconciler.instanceChanged));
      backend.offerInstanceTypes(instanceTypes.publish);
      const url = await http.listen();
      reconciler.start();
      return url;
    },
    instances: () => instances.all(),
    async close(graceMs = 10_000) {
      // pods run on without the agent: its next start adopts them, and finishes the stops under way
      // (a pod deleted already goes after its own grace; the agent does not wait for it)
      await reconciler.stop({ stops: !backend.outlivesAgent });
      if (!backend.outlivesAgent) await instances.stopAll();
      await backend.dispose();
      await instanceTypes.close();
      await reporter.report().catch(() => undefined);
      await http.close(graceMs);
    },
    destroy() {
      reconciler.halt();
      if (!backend.outlivesAgent) instances.killAll();
      void backend.dispose();
      void instanceTypes.close();
      http.destroy();
    },
  };
}
