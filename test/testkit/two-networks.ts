// The two-network plane, the one builder behind every test that splits callplane across networks
// (test/e2e/two-networks*.test.ts, the fault suite): a network namespace for the workers and their
// inference servers, joined to the root namespace by one link; nats-server on the link's host
// address; the API on root-namespace loopback; a stack PKI (CA, the callback proxy's frontend, the
// replicas' worker listeners); the ports the replicas share; and the environment every service
// child and every worker is started with. What runs on it (proxies, replicas, balancers, which
// workers and how many) stays with each test.
import { join } from "node:path";
import type { TestContext } from "node:test";
import {
  TLS_FILES,
  ensureCa,
  ensureServerCert,
  pkiLayout,
  stackCertificates,
  type CaMaterial,
  type StackCertificate,
} from "../../src/lib/tls/index.js";
import { freePortOnAll } from "./hosts.js";
import { startNats, type Nats } from "./nats.js";
import { createNetns, type Netns } from "./netns.js";
import type { DeployedFunction } from "./plane.js";
import { startExampleProcess, type ChildHandle } from "./processes.js";
import { tmpDir } from "./scope.js";
import { startApi, type ApiFixture, type StartApiOptions } from "./services.js";

type Ctx = Pick<TestContext, "after">;

export const SERVICE_DOMAIN = "nvcf.svc.cluster.local";
export const WORKER_DOMAIN = "worker.callplane.test";

export interface TwoNetworkOptions {
  /** The scratch folder's name prefix (callplane-<test>-). */
  prefix: string;
  region: string;
  /** Invocation replicas' root-namespace loopback addresses; they share one worker TLS port. */
  replicaIps?: string[];
  /** grpc-proxy replicas' addresses; they share one worker TLS port. */
  grpcReplicaIps?: string[];
  /** Whether the callback proxy speaks TLS to the invocation replicas' worker listeners. */
  upstreamTls: boolean;
  /** The API's settings beyond its NATS and region. */
  api?: Omit<StartApiOptions, "nats" | "region">;
}

export interface WorkerOptions {
  fn: DeployedFunction;
  /** Names the worker's response folder (<dir>/responses-<key>). */
  key: string;
  instanceId: string;
  name: string;
  /** The inference server's port inside the namespace. */
  port: number;
  grpc?: boolean;
  concurrency: number;
  logLevel: string;
  /** CALLPLANE_WORKER_HOST_MAP; by default every name under the worker domain goes to the link. */
  hostMap?: string;
  /** How the worker logs in to NATS; the shared worker nkey by default. */
  natsEnv?: Record<string, string>;
  /** Anything else, last. */
  extra?: Record<string, string>;
}

export interface TwoNetworkPlane {
  dir: string;
  ns: Netns;
  nats: Nats;
  api: ApiFixture;
  pkiDir: string;
  ca: CaMaterial;
  certs: StackCertificate[];
  /** The worker TLS port every invocation replica listens on (when there are replicas). */
  invocationTlsPort: number | undefined;
  /** The worker TLS port every grpc-proxy replica listens on (when there are any). */
  grpcTlsPort: number | undefined;
  /** The callback address on the link that replicas hand to workers (the proxy's, or a balancer's). */
  proxyPort: number;
  /** CALLPLANE__* for every service child: data folder, region, PKI, NATS, API, the proxy's address. */
  serviceEnv: Record<string, string>;
  /** A worker agent's environment, inside the namespace. */
  workerEnv(o: WorkerOptions): Record<string, string>;
  /** The example inference server (or gRPC server) inside the namespace on 127.0.0.1:`port`. */
  startInference(port: number, grpc?: boolean): Promise<ChildHandle>;
}

/** The /24 networks the replicas' addresses are in (the proxy's podNetworks). */
function networksOf(ips: string[]): string[] {
  return [...new Set(ips.map((ip) => `${ip.split(".").slice(0, 3).join(".")}.0/24`))];
}

/** Builds the plane's base on `scope`, whose hooks must run last-first (reverseScope or a Scope). */
export async function startTwoNetworkPlane(scope: Ctx, o: TwoNetworkOptions): Promise<TwoNetworkPlane> {
  const replicaIps = o.replicaIps ?? [];
  const grpcIps = o.grpcReplicaIps ?? [];
  // torn down in reverse: what the test starts on it, the API, nats-server, the namespace, the folder
  const dir = tmpDir(scope, o.prefix);
  const ns = await createNetns(scope);
  const nats = await startNats(scope, { dir: join(dir, "nats"), host: ns.hostIp, region: o.region });
  const api = await startApi(scope, { ...o.api, nats, region: o.region });

  const pkiDir = join(dir, "pki");
  const ca = await ensureCa(pkiLayout(pkiDir));
  const certs = stackCertificates({
    pkiDir,
    serviceDomain: SERVICE_DOMAIN,
    workerDomain: WORKER_DOMAIN,
    proxyEnabled: true,
    upstreamTls: o.upstreamTls,
    frontendCertFile: join(pkiDir, "proxy", TLS_FILES.cert),
    replicaIps,
    ...(grpcIps.length ? { grpcReplicaIps: grpcIps } : {}),
  });
  for (const c of certs) await ensureServerCert(c.folder, ca, c.dnsNames);

  const invocationTlsPort = replicaIps.length ? await freePortOnAll(replicaIps) : undefined;
  const grpcTlsPort = grpcIps.length ? await freePortOnAll(grpcIps) : undefined;
  const proxyPort = await freePortOnAll([ns.hostIp]);
  const serviceEnv: Record<string, string> = {
    CALLPLANE__GLOBAL__DATA_DIR: dir,
    CALLPLANE__GLOBAL__REGION: o.region,
    CALLPLANE__PKI__DIR: pkiDir,
    ...nats.serviceEnv(),
    CALLPLANE__API__URL: api.url,
    CALLPLANE__AUTH__SERVICE_TOKEN_DIR: api.serviceTokenDir,
    CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "true",
    CALLPLANE__WORKER_CALLBACK_PROXY__LISTEN: `${ns.hostIp}:${proxyPort}`,
    CALLPLANE__WORKER_CALLBACK_PROXY__POD_NETWORKS: JSON.stringify(networksOf([...replicaIps, ...grpcIps])),
    ...(invocationTlsPort !== undefined
      ? { CALLPLANE__WORKER_CALLBACK_PROXY__INVOCATION__WORKER_TLS_PORT: String(invocationTlsPort) }
      : {}),
    ...(grpcTlsPort !== undefined ? { CALLPLANE__GRPCPROXY__WORKER_TLS_PORT: String(grpcTlsPort) } : {}),
  };

  return {
    dir,
    ns,
    nats,
    api,
    pkiDir,
    ca,
    certs,
    invocationTlsPort,
    grpcTlsPort,
    proxyPort,
    serviceEnv,
    workerEnv: (w) => ({
      NVCF_FQDN_NATS: nats.url,
      FUNCTION_ID: w.fn.functionId,
      FUNCTION_VERSION_ID: w.fn.versionId,
      FUNCTION_NAME: w.name,
      INSTANCE_ID: w.instanceId,
      // after INSTANCE_ID: a worker with an identity of its own is that identity's instance
      ...(w.natsEnv ?? nats.workerNkeyEnv()),
      INFERENCE_HOST: "127.0.0.1",
      INFERENCE_PORT: String(w.port),
      ...(w.grpc ? { INFERENCE_HEALTH_PROTOCOL: "gRPC" } : { INFERENCE_HEALTH_ENDPOINT: "/health" }),
      HEALTH_HOST: "127.0.0.1",
      HEALTH_PORT: "0",
      MAX_REQUEST_CONCURRENCY: String(w.concurrency),
      NVCF_REGION: o.region,
      CALLPLANE_WORKER_HOST_MAP: w.hostMap ?? `*.${WORKER_DOMAIN}=${ns.hostIp}`,
      NVCF_PROXY_CA_PEM: ca.certPem,
      BASE_RESPONSE_DIR: join(dir, `responses-${w.key}`),
      CALLPLANE_LOG_LEVEL: w.logLevel,
      ...w.extra,
    }),
    startInference: async (port, grpc = false) =>
      (
        await startExampleProcess(scope, {
          listen: { host: "127.0.0.1", port },
          prefix: ns.prefix,
          grpc,
        })
      ).process,
  };
}
