// The certificate keeper as a Kubernetes pod runs it: an HAProxy that runs on its own (here started
// by the service module, standing for the pod's haproxy container) and, beside it, the callback
// proxy's process with `--runtime-api`, watching the frontend certificate and the CA at the paths
// HAProxy loaded them from. A renewed certificate is served without a restart; the keeper's stop
// withdraws HAProxy's readiness at once and leaves HAProxy serving.
import assert from "node:assert/strict";
import { X509Certificate } from "node:crypto";
import { join } from "node:path";
import { test } from "node:test";
import { connect as tlsConnect } from "node:tls";
import { writeFileAtomic } from "../../../src/lib/fs.js";
import { haproxyConfig } from "../../../src/services/callback-proxy/haproxy-config.js";
import type { HaproxyConfigOptions } from "../../../src/services/callback-proxy/haproxy-options.js";
import { haproxyErrorFiles } from "../../../src/services/callback-proxy/haproxy-parser-errors.js";
import {
  checkHaproxyConfig,
  haproxyBinary,
  haproxyCommand,
  startHaproxy,
} from "../../../src/services/callback-proxy/haproxy.js";
import { waitFor } from "../../testkit/client.js";
import { tmpDir } from "../../testkit/index.js";
import { freePort } from "../../testkit/plane.js";
import { scripts, startService } from "../../testkit/processes.js";
import { testPki } from "../../testkit/tls.js";

function servedSerial(port: number, ca: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = tlsConnect({ host: "127.0.0.1", port, servername: "invocation.worker.callplane.test", ca });
    s.once("secureConnect", () => {
      const serial = s.getPeerX509Certificate()?.serialNumber ?? "";
      s.destroy();
      resolve(serial);
    });
    s.once("error", reject);
  });
}

test("the keeper replaces the frontend certificate and the pods' CA of an HAProxy it did not start, and withdraws its readiness when it stops", async (t) => {
  const pki = await testPki();
  const dir = tmpDir(t);
  const certFile = join(dir, "frontend", "tls.crt");
  const keyFile = join(dir, "frontend", "tls.key");
  const caFile = join(dir, "ca.crt");
  const first = await pki.issue(["*.worker.callplane.test"]);
  writeFileAtomic(certFile, first.certPem, 0o644);
  writeFileAtomic(keyFile, first.keyPem);
  writeFileAtomic(caFile, pki.ca.certPem, 0o644);

  // the pod's haproxy container: HAProxy on its own, with the rendered layout (tls.crt and tls.key
  // of a Secret mount, the key found beside the certificate; the admin socket in a shared folder)
  const listen = { host: "127.0.0.1", port: await freePort("127.0.0.1") };
  const metricsListen = { host: "127.0.0.1", port: await freePort("127.0.0.1") };
  const options: HaproxyConfigOptions = {
    listen,
    metricsListen,
    serviceDomain: "nvcf.svc.cluster.local",
    workerDomain: "worker.callplane.test",
    podNetworks: ["127.0.0.0/29"],
    upstreamTls: true,
    podPort: 8443,
    files: {
      frontendPem: certFile,
      frontendKeyBeside: true,
      podCa: caFile,
      adminSocket: join(dir, "admin.sock"),
      errorDir: dir,
    },
    timeouts: { headersMs: 10_000, idleMs: 30_000, connectMs: 2000 },
    maxHeaderBytes: 16 * 1024,
    shutdownGraceMs: 5000,
  };
  for (const [path, text] of Object.entries(haproxyErrorFiles(options))) writeFileAtomic(path, text, 0o644);
  const configFile = join(dir, "haproxy.cfg");
  writeFileAtomic(configFile, haproxyConfig(options), 0o644);
  const binary = haproxyBinary();
  assert.equal(checkHaproxyConfig(binary, configFile), undefined);
  const haproxy = startHaproxy({ binary, configFile, onLog: () => undefined, onMessage: () => undefined });
  t.after(async () => {
    haproxy.child.kill("SIGUSR1");
    await haproxy.exited;
  });
  const urls = { metrics: new URL(`http://127.0.0.1:${metricsListen.port}`) };
  await waitFor("HAProxy to listen", async () =>
    (await fetch(`${urls.metrics.origin}/health`).catch(() => undefined))?.status === 200 ? true : undefined,
  );
  const port = listen.port;
  const health = async () => (await fetch(`${urls.metrics.origin}/health`)).status;
  assert.equal(await health(), 200);
  const firstSerial = await servedSerial(port, pki.ca.certPem);
  assert.equal(firstSerial, new X509Certificate(first.certPem).serialNumber);

  // HAProxy holds the certificate under the name of the file it loaded; the keeper watches files
  // of the same content at the paths the configuration names, as the pod's mounts are shared
  const keeper = await startService(
    t,
    "certificate-keeper",
    scripts.callbackProxy,
    {
      CALLPLANE__GLOBAL__DATA_DIR: dir,
      CALLPLANE__WORKER_CALLBACK_PROXY__TLS__FRONTEND__CERT_FILE: certFile,
      CALLPLANE__WORKER_CALLBACK_PROXY__TLS__FRONTEND__KEY_FILE: keyFile,
      CALLPLANE__PKI__CA_CERT_FILE: caFile,
      CALLPLANE__PKI__CA_KEY_FILE: join(dir, "ca.key"),
    },
    { args: ["--runtime-api", options.files.adminSocket] },
  );
  const renewed = await pki.issue(["*.worker.callplane.test"]);
  writeFileAtomic(keyFile, renewed.keyPem);
  writeFileAtomic(certFile, renewed.certPem, 0o644);
  const want = new X509Certificate(renewed.certPem).serialNumber;
  await waitFor("HAProxy to serve the renewed certificate", async () =>
    (await servedSerial(port, pki.ca.certPem)) === want ? true : undefined,
  );
  assert.equal(await health(), 200, "a replacement does not touch readiness");

  // a new CA bundle: each TLS server to pods gets a successor that verifies against it (HAProxy
  // 2.6's commit does not reach server lines; ca-rotation.test.ts checks the connections), with
  // the settings the keeper derives from the same environment file as the rendered configuration
  const next = await testPki();
  writeFileAtomic(caFile, `${pki.ca.certPem.trim()}\n${next.ca.certPem}`, 0o644);
  /** The servers of `backend`, and whether each is in maintenance (srv_admin_state's first bit). */
  const servers = async (backend: string) =>
    (await haproxyCommand(options.files.adminSocket, `show servers state ${backend}`))
      .split("\n")
      .filter((l) => l && !l.startsWith("#") && l.includes(" "))
      .map((l) => l.split(" "))
      .map((f) => ({ name: f[3], maintenance: (Number(f[6]) & 1) === 1 }));
  const inUse = async (backend: string) =>
    (await servers(backend)).filter((s) => !s.maintenance).map((s) => s.name);
  await waitFor("the keeper to give the pod servers successors", async () =>
    (await inUse("grpc_pods")).includes("grpc-1") ? true : undefined,
  );
  assert.deepEqual(await inUse("invocation_pods"), ["pod-1"]);
  assert.deepEqual(await inUse("grpc_pods"), ["grpc-1"]);
  // the retired servers go once nothing uses them (none does here)
  await waitFor(
    "the retired servers to be deleted",
    async () =>
      (await servers("invocation_pods")).length === 1 && (await servers("grpc_pods")).length === 1
        ? true
        : undefined,
    20_000,
  );
  assert.equal(await health(), 200, "a CA rotation does not touch readiness");

  const exit = await keeper.stop(5000);
  assert.equal(exit.code, 0);
  assert.equal(await health(), 503, "the keeper's stop withdrew readiness");
  assert.equal(
    await servedSerial(port, pki.ca.certPem),
    want,
    "HAProxy serves on, with the renewed certificate",
  );
});
