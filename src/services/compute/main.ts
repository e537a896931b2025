import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Config } from "../../lib/config/index.js";
import { TLS_FILES } from "../../lib/tls/index.js";
import { hostname } from "node:os";
import { readServiceToken } from "../../lib/identity/index.js";
import { parseHostPort } from "../../lib/net/index.js";
import { runService } from "../../lib/process/index.js";
import { tracingWorkerEnv } from "../../lib/tracing/index.js";
import { KubeClient, kubeConnection } from "../../lib/kube/index.js";
import { createComputeAgent } from "./agent.js";
import { secretsRoot } from "./secrets.js";
import { tokenSource } from "./identity.js";

/**
 * What workers need to call back through the callback proxy on this machine: its name mapped to its
 * address (no DNS serves *.<workerDomain> here), and the stack CA when the proxy's certificate
 * comes from it.
 */
function workerProxyEnv(config: Config): Record<string, string> {
  const p = config.workerCallbackProxy;
  if (!p.enabled) return {};
  const host = new URL(config.global.workerEndpoints.invocationProxyURL).hostname;
  const proxyIp = parseHostPort(p.listen).host;
  const env: Record<string, string> = {};
  // invocation.<workerDomain> for HTTP callbacks, every <dashed-ip>.<workerDomain> for gRPC tunnels.
  // A proxy on every address (0.0.0.0: a pod of `callplane render`) is not on this machine: there
  // the names resolve through DNS, as they do for any worker.
  if (proxyIp !== "0.0.0.0" && proxyIp !== "::")
    env.CALLPLANE_WORKER_HOST_MAP = `${host}=${proxyIp},*.${p.workerDomain}=${proxyIp}`;
  if (p.tls.frontend.certFile === join(config.pki.dir, "proxy", TLS_FILES.cert))
    env.NVCF_PROXY_CA_PEM = readFileSync(config.pki.caCertFile, "utf8");
  return env;
}

/** The kubernetes backend's settings, or why the agent cannot start with them. */
function kubernetesSettings(config: Config) {
  const k = config.compute.kubernetes;
  if (!config.kubernetes.image)
    throw new Error(
      "kubernetes.image is empty: on the kubernetes compute backend every pod runs the worker from the callplane image; set kubernetes.image in the environment file (the image `callplane render` deploys)",
    );
  const connection = kubeConnection({ server: k.apiServer, caFile: k.caFile, tokenFile: k.tokenFile });
  const client = new KubeClient(connection);
  return {
    client,
    namespace: config.kubernetes.workerNamespace,
    workerImage: config.kubernetes.image,
    gpuResource: k.gpuResource,
    unschedulableSeconds: k.unschedulableSeconds,
    terminationGraceSeconds: k.terminationGraceSeconds,
    instanceTypes: k.instanceTypes,
    // the cluster's issuer and keys, registered with the API so that it verifies pods' tokens
    clusterKeys: {
      identityTokenFile: k.identityTokenFile,
      refreshMs: k.keysRefreshSeconds * 1000,
      enrollmentTokenFile: k.enrollmentTokenFile,
      caPem: connection.caPem,
    },
  };
}

runService(
  "compute",
  async (config, logger) => {
    const onKubernetes = config.compute.backend === "kubernetes";
    // before anything else: what is missing for pods says so first
    const kubernetes = onKubernetes ? kubernetesSettings(config) : undefined;
    const clusterId = config.compute.workerIdentity.clusterId;
    const common = {
      listen: parseHostPort(config.compute.listen),
      apiUrl: config.api.url,
      serviceToken: readServiceToken(config.auth.serviceTokenDir, "compute"),
      syncIntervalMs: config.compute.syncIntervalSeconds * 1000,
      // pods outlive the agent and its pod's name: the next agent replaces the same rows
      reporter: onKubernetes ? `kubernetes-${clusterId}` : `local-${hostname()}`,
      clusterId,
      instanceEnv: {
        // workers in pods usually reach NATS by another name than the agent does
        natsUrl: (onKubernetes && config.compute.kubernetes.workerNatsUrl) || config.nats.url,
        region: config.global.region,
        serviceDomain: config.global.serviceDomain,
        dataDir: config.global.dataDir,
        keepAliveSeconds: config.worker.keepAliveSeconds,
        inferenceIdleSeconds: config.worker.inferenceIdleSeconds,
        ackWaitSeconds: config.nats.consumer.ackWaitSeconds,
        streamMaxMessages: config.nats.stream.maxMessages,
        streamMaxMessageBytes: config.nats.stream.maxMessageBytes,
        streamReplicas: config.nats.stream.replicas,
        stopGraceMs: config.compute.stopGraceSeconds * 1000,
        restart: {
          initialMs: config.compute.restartBackoff.initialSeconds * 1000,
          maxMs: config.compute.restartBackoff.maxSeconds * 1000,
        },
        logLevel: config.log.level,
        // workers trace where the plane does (observability.tracing), through their environment
        workerExtraEnv: { ...workerProxyEnv(config), ...tracingWorkerEnv(config) },
        natsCaPem: readFileSync(config.nats.tls.caFile, "utf8"),
      },
      tokenSource: tokenSource(config.compute.workerIdentity.tokenSource, config.compute.backend),
      logger,
    };
    if (kubernetes) {
      const agent = createComputeAgent({ ...common, kubernetes });
      // no exit hook: the pods are not this process's children, and the next start adopts them
      const url = await agent.listen();
      logger.info(
        { namespace: kubernetes.namespace, apiServer: kubernetes.client.server, clusterId },
        "instances run as pods",
      );
      return {
        urls: { compute: url.origin },
        close: async (g) => {
          await agent.close(g);
          await kubernetes.client.close();
        },
        destroy: () => agent.destroy(),
      };
    }
    const agent = createComputeAgent({
      ...common,
      instanceNetwork: config.compute.instanceNetwork,
      secrets: {
        root: secretsRoot(config.global.dataDir, config.compute.secrets.dir),
        env: config.compute.secrets.env,
      },
      local: config.compute.local,
    });
    // Fix: an agent that dies (an uncaught error, a second stop signal) left its inference servers
    // running: unlike the workers they have no control channel to notice, and they kept the
    // instance addresses busy for the agent's next start. Whatever ends this process ends them.
    process.on("exit", () => {
      for (const i of agent.instances()) i.killNow();
    });
    const url = await agent.listen();
    return { urls: { compute: url.origin }, close: (g) => agent.close(g), destroy: () => agent.destroy() };
  },
  // the pods' own grace is theirs: the agent leaves them running when it stops
  { graceMs: (c) => (c.compute.stopGraceSeconds + 5) * 1000 },
);
