// The compute agent: reads the desired deployments from the control plane, keeps that many
// instances of each running (here, with the local backend), and reports their status back so that
// `callplane deploy get` shows them. It calls the API with its own service credential.
import { rmSync } from "node:fs";
import { request } from "undici";
import { Router, createHttpService } from "../../lib/http/index.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import { Gauge, createRegistry, type Registry } from "../../lib/metrics.js";
import { cidrHost, parseCidr, type HostPort } from "../../lib/net/index.js";
import type { DesiredDeployment, InstanceEnvironment } from "./deployment.js";
import { LocalInstance } from "./local.js";
import { prepareSecretsRoot, type FetchedSecrets } from "./secrets.js";
import { identityProvider, type IdentityProvider, type TokenSource } from "./identity.js";

export interface ComputeAgentOptions {
  listen: HostPort;
  apiUrl: string;
  serviceToken: string;
  instanceNetwork: string;
  syncIntervalMs: number;
  reporter: string;
  instanceEnv: Omit<InstanceEnvironment, "identity" | "workerNatsEnv" | "secrets">;
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
  const network = parseCidr(opts.instanceNetwork);
  const instances = new Map<string, LocalInstance[]>();
  const terminated: LocalInstance[] = [];
  const gauge = new Gauge({
    name: "callplane_compute_instances",
    help: "Function instances by status",
    labelNames: ["status"],
    registers: [registry],
  });
  let timer: NodeJS.Timeout | undefined;
  let syncing: Promise<void> | undefined;
  let stopped = false;
  let dirty = false;
  let lastSyncOk = false;

  const api = async (method: "GET" | "PUT", path: string, body?: unknown) => {
    const res = await request(new URL(path, opts.apiUrl), {
      method,
      headers: {
        authorization: `Bearer ${opts.serviceToken}`,
        ...(body ? { "content-type": "application/json" } : {}),
      },
      ...(body ? { body: JSON.stringify(body) } : {}),
      headersTimeout: 10_000,
      bodyTimeout: 10_000,
    });
    const text = await res.body.text();
    if (res.statusCode >= 300)
      throw new Error(`${method} ${path} answered ${res.statusCode}: ${text.slice(0, 300)}`);
    return text ? (JSON.parse(text) as unknown) : undefined;
  };

  // where each instance's identity comes from (the `api` source: the control-plane API signs it)
  const identity: IdentityProvider = identityProvider(opts.tokenSource, {
    apiUrl: opts.apiUrl,
    serviceToken: opts.serviceToken,
  });
  let workerNatsEnv: Record<string, string> = {};
  const instanceEnv: InstanceEnvironment = {
    ...opts.instanceEnv,
    identity,
    workerNatsEnv: () => workerNatsEnv,
    ...(opts.secrets
      ? {
          secrets: {
            root: opts.secrets.root,
            env: opts.secrets.env,
            fetch: async (fid: string, vid: string) =>
              (await api("GET", `/v1/internal/secrets/functions/${fid}/versions/${vid}`)) as FetchedSecrets,
          },
        }
      : {}),
  };

  /** The agent's own secrets folder (stack-<hash>) goes with it; each instance removed its own. */
  const removeSecretsRoot = () => {
    if (!opts.secrets) return;
    try {
      rmSync(opts.secrets.root, { recursive: true, force: true });
    } catch {
      // removed at the next start
    }
  };

  // Instances being stopped still hold their address until their processes exit.
  const stopping = new Set<LocalInstance>();
  const stopInstance = (i: LocalInstance): Promise<void> => {
    stopping.add(i);
    return i.stop().then(() => {
      stopping.delete(i);
      terminated.push(i);
    });
  };

  function freeSlot(): number {
    // Fix: slots of stopping instances used to count as free, so a deployment added in the same
    // sync as another was removed got the address still held by the draining processes and its
    // servers failed with EADDRINUSE (reported ERRORED) until the old ones were gone.
    const used = new Set([...[...instances.values()].flat(), ...stopping].map((i) => i.slot));
    for (let n = 1; n < 2 ** (32 - network.bits) - 1; n++) if (!used.has(n)) return n;
    throw new Error(`no free address left in ${network.text} for another instance`);
  }

  const changed = () => {
    dirty = true;
    // Fix: once closing, close() sends the last report itself. A status change that came later (an
    // instance's exit noticed after its stop) used to queue one more report behind it, with
    // nothing left in it, which replaced the TERMINATED rows with none.
    if (!syncing && !stopped) void report().catch(() => undefined);
  };

  // Fix: reports used to run concurrently (one per status change, plus the sync's), and since each
  // replaces the previous one, an older snapshot landing last showed a stale status until the next
  // sync. They now go one at a time, each taking its snapshot when it is its turn.
  let reporting: Promise<void> = Promise.resolve();
  function report(): Promise<void> {
    const next = reporting.then(sendReport);
    reporting = next.catch(() => undefined);
    return next;
  }

  async function sendReport(): Promise<void> {
    dirty = false;
    const all = [...[...instances.values()].flat(), ...terminated.splice(0)];
    for (const s of ["STARTING", "ACTIVE", "ERRORED"] as const)
      gauge.set({ status: s }, all.filter((i) => i.status === s).length);
    await api("PUT", "/v1/internal/instances", {
      reporter: opts.reporter,
      instances: all.map((i) => ({
        instanceId: i.instanceId,
        deploymentId: i.deployment.deploymentId,
        functionId: i.deployment.functionId,
        versionId: i.deployment.versionId,
        status: i.status,
        instanceType: i.deployment.specs[0].instanceType,
        gpu: i.deployment.specs[0].gpu,
        backend: "local",
        location: i.host,
        ...(i.message ? { message: i.message.slice(0, 2000) } : {}),
        ...(i.workerIdentifier ? { workerAuth: { workerIdentifier: i.workerIdentifier } } : {}),
        createdAt: i.createdAt,
        updatedAt: i.updatedAt,
      })),
    });
  }

  async function sync(): Promise<void> {
    const desired = (await api("GET", "/v1/internal/deployments")) as {
      deployments: DesiredDeployment[];
      workerNatsEnv?: Record<string, string>;
    };
    const deployments = desired.deployments;
    // instances started from now on get what the API says now (a mode switch reaches new workers
    // only; running ones keep what they started with)
    workerNatsEnv = desired.workerNatsEnv ?? {};
    lastSyncOk = true;
    const wanted = new Map(deployments.map((d) => [d.deploymentId, d]));
    const stops: Array<Promise<void>> = [];
    for (const [id, list] of instances) {
      if (wanted.has(id)) continue;
      instances.delete(id);
      logger.info({ deploymentId: id, instances: list.length }, "deployment removed: stopping its instances");
      for (const i of list) stops.push(stopInstance(i));
    }
    for (const d of deployments) {
      const spec = d.specs[0];
      if (!spec) continue;
      // The local backend does not scale to zero: it runs minInstances, and at least one.
      const target = Math.min(spec.maxInstances, Math.max(spec.minInstances, 1));
      const list = instances.get(d.deploymentId) ?? [];
      instances.set(d.deploymentId, list);
      while (list.length < target) {
        const slot = freeSlot();
        const inst = new LocalInstance(d, slot, cidrHost(network, slot), instanceEnv, logger, changed);
        list.push(inst);
        logger.info({ function: d.name, instanceId: inst.instanceId, host: inst.host }, "starting instance");
        inst.start();
      }
      while (list.length > target) {
        const inst = list.pop()!;
        stops.push(stopInstance(inst));
      }
      // a secret of the version changed: running instances get the new file
      for (const inst of list) inst.refreshSecrets(d.secretsRevision ?? 0);
    }
    await Promise.all(stops);
    await report();
  }

  const tick = () => {
    if (stopped) return;
    syncing = sync()
      .catch((err: unknown) => {
        lastSyncOk = false;
        logger.warn({ err: (err as Error).message }, "sync with the control plane failed; retrying");
      })
      .finally(() => {
        syncing = undefined;
        if (dirty && !stopped) void report().catch(() => undefined);
        if (!stopped) timer = setTimeout(tick, opts.syncIntervalMs);
      });
  };

  const http = createHttpService({
    name: "compute",
    listen: opts.listen,
    logger,
    registry,
    router: new Router(),
    ready: () => lastSyncOk,
  });
  return {
    async listen() {
      if (opts.secrets) {
        const n = prepareSecretsRoot(opts.secrets.root);
        if (n)
          logger.info(
            { folders: n, root: opts.secrets.root },
            "removed secrets folders left by an earlier run",
          );
      }
      const url = await http.listen();
      tick();
      return url;
    },
    instances: () => [...instances.values()].flat(),
    async close(graceMs = 10_000) {
      stopped = true;
      if (timer) clearTimeout(timer);
      await syncing;
      const all = [...instances.values()].flat();
      instances.clear();
      await Promise.all(all.map((i) => i.stop()));
      terminated.push(...all);
      removeSecretsRoot();
      await report().catch(() => undefined);
      await http.close(graceMs);
    },
    destroy() {
      stopped = true;
      if (timer) clearTimeout(timer);
      // instances still draining after a scale-down are killed too, not left to their grace timer
      for (const i of [...[...instances.values()].flat(), ...stopping]) i.killNow();
      removeSecretsRoot();
      http.destroy();
    },
  };
}
