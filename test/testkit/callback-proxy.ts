// A callback proxy (a real HAProxy started by its keeper) in front of a counting pod, both with
// certificates from a test CA: what the callback proxy's integration tests start. The access log's
// lines are kept as the keeper passes them on.
import type { TestContext } from "node:test";
import { createCallbackProxy } from "../../src/services/callback-proxy/service.js";
import { freePort } from "./plane.js";
import { startCountingPod, testPki, type CountingPod, type TestPki } from "./tls.js";

export const DOMAIN = "nvcf.svc.cluster.local";
/** The invocation pod every fixture's counting pod is (127.0.0.1 by its name). */
export const POD = `127-0-0-1.invocation.${DOMAIN}`;
export const WORKER_DOMAIN = "worker.callplane.test";

export interface ProxyFixtureOptions {
  /** The CA (default: a new one). */
  pki?: TestPki;
  idleMs?: number;
  headersMs?: number;
  /** The pod's certificate: from the CA for its name (default), another CA, or another name. */
  podCert?: "ok" | "other-ca" | "other-name";
  podHandler?: Parameters<typeof startCountingPod>[2];
  /** The grpc-proxy pods' worker TLS port: "pod" for the counting pod's (unset: tunnels refused). */
  grpcPodPort?: number | "pod";
}

export interface ProxyFixture {
  pki: TestPki;
  pod: CountingPod;
  proxy: Awaited<ReturnType<typeof createCallbackProxy>>;
  proxyPort: number;
  /** The access log's lines, as written. */
  lines: string[];
}

export async function startProxyFixture(
  t: TestContext,
  opts: ProxyFixtureOptions = {},
): Promise<ProxyFixture> {
  const pki = opts.pki ?? (await testPki());
  let podCert = await pki.issue([POD]);
  if (opts.podCert === "other-ca") podCert = await (await testPki()).issue([POD]);
  if (opts.podCert === "other-name") podCert = await pki.issue([`127-0-0-2.invocation.${DOMAIN}`]);
  const pod = await startCountingPod(t, podCert, opts.podHandler);
  const front = await pki.issue([`*.${WORKER_DOMAIN}`]);
  const lines: string[] = [];
  const proxy = await createCallbackProxy({
    listen: { host: "127.0.0.1", port: await freePort("127.0.0.1") },
    metricsListen: { host: "127.0.0.1", port: await freePort("127.0.0.1") },
    serviceDomain: DOMAIN,
    workerDomain: WORKER_DOMAIN,
    podNetworks: ["127.0.0.0/29"],
    upstreamTls: true,
    podPort: pod.port,
    grpcPodPort: opts.grpcPodPort === "pod" ? pod.port : opts.grpcPodPort,
    frontend: { cert: front.certPem, key: front.keyPem },
    podCa: pki.ca.certPem,
    timeouts: { headersMs: opts.headersMs ?? 10_000, idleMs: opts.idleMs ?? 30_000, connectMs: 2000 },
    maxHeaderBytes: 16 * 1024,
    shutdownGraceMs: 5000,
    onAccessLog: (line) => lines.push(line),
  });
  const urls = await proxy.listen();
  t.after(() => proxy.close(1000));
  return { pki, pod, proxy, proxyPort: Number(urls.proxy.port), lines };
}
