// Certificates that change under a running service: TlsReloader watching a folder (plain files and
// a Kubernetes Secret's `..data` symlink swap), refusing bad updates while keeping the last good
// material, and a whole plane (callback proxy and invocation replicas) rotating its frontend, pod
// and CA certificates under load without one failed callback. Replicas listen on 127.0.52.x.
import assert from "node:assert/strict";
import { X509Certificate, randomBytes } from "node:crypto";
import { mkdirSync, renameSync, rmSync, symlinkSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { connect as tlsConnect } from "node:tls";
import { writeFileAtomic } from "../../../src/lib/fs.js";
import { createLogger } from "../../../src/lib/log.js";
import { createRegistry, type Registry } from "../../../src/lib/metrics.js";
import { TLS_FILES, type TlsMaterial, TlsReloader } from "../../../src/lib/tls/index.js";
import { bearer, waitFor } from "../../testkit/client.js";
import { tmpDir } from "../../testkit/index.js";
import {
  metricValue,
  POSTED_ANSWERS,
  readLog,
  startPlane,
  type Plane,
  type PlaneProxy,
} from "../../testkit/plane.js";
import { testPki, type TestPki } from "../../testkit/tls.js";

/** No test waits forever: a hang fails its test with a clear timeout instead of stalling the file. */
const LIMIT = { timeout: 60_000 };
const HOSTS = ["127.0.52.1", "127.0.52.2"];
const POD_LISTENER = "invocation-worker-listener";

interface Watched {
  dir: string;
  pki: TestPki;
  first: { certPem: string; keyPem: string };
  reloader: TlsReloader;
  registry: Registry;
  changes: TlsMaterial[];
  log(): Array<Record<string, unknown>>;
  reloads(result: "applied" | "rejected"): Promise<number>;
}

function writePair(dir: string, pair: { certPem: string; keyPem: string }): void {
  writeFileAtomic(join(dir, TLS_FILES.key), pair.keyPem);
  writeFileAtomic(join(dir, TLS_FILES.cert), pair.certPem, 0o644);
}

/**
 * A TlsReloader on tls.crt/tls.key in a fresh folder, logging to a file. `layout` lays the folder
 * out itself (and returns where the two files are); by default they are plain files in it.
 */
async function watched(
  t: TestContext,
  layout?: (dir: string, pki: TestPki) => Promise<string>,
): Promise<Watched> {
  const dir = tmpDir(t, "callplane-tls-");
  const pki = await testPki();
  const first = await pki.issue(["first.callplane.test"]);
  let certDir = dir;
  if (layout) certDir = await layout(dir, pki);
  else writePair(dir, first);
  const logFile = join(tmpDir(t, "callplane-tls-log-"), "reload.log");
  const logger = createLogger("test", { destination: logFile, sync: true, level: "info" });
  const registry = createRegistry("test", { defaultMetrics: false });
  const changes: TlsMaterial[] = [];
  // no poll during the test (the default is 30 s): only the folder watch can see a change
  const reloader = new TlsReloader(
    "test-cert",
    { certFile: join(certDir, TLS_FILES.cert), keyFile: join(certDir, TLS_FILES.key) },
    (m) => void changes.push(m),
    logger,
    registry,
  );
  t.after(() => reloader.close());
  return {
    dir,
    pki,
    first,
    reloader,
    registry,
    changes,
    log: () => readLog(logFile),
    reloads: (result) =>
      metricValue(registry, "callplane_tls_reloads_total", { material: "test-cert", result }),
  };
}

test("a new certificate written into the watched folder is applied within seconds", LIMIT, async (t) => {
  const w = await watched(t);
  assert.equal(w.reloader.material.cert, w.first.certPem);
  const second = await w.pki.issue(["second.callplane.test"], {
    notAfter: new Date(Date.now() + 10 * 86_400_000),
  });
  writePair(w.dir, second);
  await waitFor("the reloader to apply the new certificate", () => (w.changes.length ? true : undefined));
  assert.equal(w.changes.length, 1, "one change for one update");
  assert.equal(w.changes[0].cert, second.certPem);
  assert.equal(w.changes[0].key, second.keyPem);
  assert.equal(w.reloader.material.cert, second.certPem);
  assert.equal(await w.reloads("applied"), 1);
  assert.equal(await w.reloads("rejected"), 0);
  const notAfter = await metricValue(w.registry, "callplane_tls_cert_not_after_seconds", {
    material: "test-cert",
  });
  assert.equal(notAfter, Date.parse(new X509Certificate(second.certPem).validTo) / 1000);
  const line = w.log().find((l) => l.msg === "certificate reloaded");
  assert.ok(line, "the reload is logged");
  assert.equal(line.material, "test-cert");
});

test(
  "a bad update is rejected, logged and counted, and the last good certificate stays",
  LIMIT,
  async (t) => {
    const w = await watched(t);
    const other = await w.pki.issue(["other.callplane.test"]);
    const expired = await w.pki.issue(["expired.callplane.test"], {
      notBefore: new Date(Date.now() - 3 * 86_400_000),
      notAfter: new Date(Date.now() - 86_400_000),
    });
    const updates: Array<[string, () => void, RegExp]> = [
      [
        "a key that does not match",
        () => writeFileAtomic(join(w.dir, TLS_FILES.key), other.keyPem),
        /does not belong/,
      ],
      ["an expired certificate", () => writePair(w.dir, expired), /expired/],
      [
        "garbage",
        () =>
          writeFileAtomic(
            join(w.dir, TLS_FILES.cert),
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
          ),
        /./,
      ],
      ["a missing file", () => unlinkSync(join(w.dir, TLS_FILES.cert)), /ENOENT|no such file/],
    ];
    for (const [n, [name, update, why]] of updates.entries()) {
      update();
      await waitFor(`the update with ${name} to be rejected`, async () =>
        (await w.reloads("rejected")) === n + 1 ? true : undefined,
      );
      const line = w
        .log()
        .filter((l) => l.level === "error")
        .at(-1);
      assert.ok(line, `${name}: logged`);
      assert.match(String(line.msg), /keeping the last good/, name);
      assert.match(String(line.err), why, `${name}: the log says why`);
      assert.equal(w.changes.length, 0, `${name}: onChange was not called`);
      assert.equal(w.reloader.material.cert, w.first.certPem, `${name}: the last good certificate stays`);
      assert.equal(w.reloader.material.key, w.first.keyPem);
    }
    assert.equal(await w.reloads("applied"), 0);
    // a good update after the bad ones is applied
    const good = await w.pki.issue(["good.callplane.test"]);
    writePair(w.dir, good);
    await waitFor("the good update to be applied", () => (w.changes.length ? true : undefined));
    assert.equal(w.changes[0].cert, good.certPem);
    assert.equal(await w.reloads("applied"), 1);
    assert.equal(await w.reloads("rejected"), updates.length);
  },
);

test("a folder where other files keep changing does not hold a reload back", LIMIT, async (t) => {
  // A log or a lock file beside the certificate changes many times a second; each change wakes the
  // folder watch. The reload must still happen soon after the certificate changed, not only when
  // the folder falls quiet (or at the next 30 s poll).
  const w = await watched(t);
  const noise = setInterval(
    () => writeFileAtomic(join(w.dir, "access.log"), randomBytes(8).toString("hex")),
    20,
  );
  t.after(() => clearInterval(noise));
  await sleep(200);
  const second = await w.pki.issue(["second.callplane.test"]);
  writePair(w.dir, second);
  await waitFor("the reloader to apply the new certificate", () => (w.changes.length ? true : undefined), {
    timeoutMs: 5000,
  });
  clearInterval(noise);
  assert.equal(w.changes[0].cert, second.certPem);
  assert.equal(await w.reloads("applied"), 1);
});

test("a Kubernetes-style ..data symlink swap is picked up", LIMIT, async (t) => {
  // The layout kubelet gives a mounted Secret: the files are symlinks through `..data`, which
  // points at a timestamped folder; an update writes a new folder and renames a new `..data`
  // symlink over the old one (one atomic rename), then removes the old folder.
  const w = await watched(t, async (dir, pki) => {
    const pair = await pki.issue(["first.callplane.test"]);
    mkdirSync(join(dir, "..2026_a"));
    writePair(join(dir, "..2026_a"), pair);
    symlinkSync("..2026_a", join(dir, "..data"));
    symlinkSync(join("..data", TLS_FILES.cert), join(dir, TLS_FILES.cert));
    symlinkSync(join("..data", TLS_FILES.key), join(dir, TLS_FILES.key));
    return dir;
  });
  const next = await w.pki.issue(["next.callplane.test"]);
  mkdirSync(join(w.dir, "..2026_b"));
  writePair(join(w.dir, "..2026_b"), next);
  symlinkSync("..2026_b", join(w.dir, "..data_tmp"));
  renameSync(join(w.dir, "..data_tmp"), join(w.dir, "..data"));
  rmSync(join(w.dir, "..2026_a"), { recursive: true });
  await waitFor("the reloader to see the swap", () => (w.changes.length ? true : undefined));
  assert.equal(w.changes[0].cert, next.certPem);
  assert.equal(w.reloader.material.key, next.keyPem);
  assert.equal(await w.reloads("applied"), 1);
  assert.equal(await w.reloads("rejected"), 0);
});

/**
 * Invocations on every replica in `loops` concurrent loops until `stop` (or the test's end);
 * every failure is kept, and a loop that fails pauses before its next call.
 */
function load(
  t: TestContext,
  plane: Plane,
  loops: number,
): { stop(): Promise<{ ok: number; failures: string[] }> } {
  let stopped = false;
  // a test that fails before stop() must not leave its loops running against closed ports
  t.after(() => {
    stopped = true;
  });
  let ok = 0;
  const failures: string[] = [];
  const one = async (i: number) => {
    for (let n = 0; !stopped; n++) {
      // some bodies beyond the inline part, so GET request-attach is exercised too
      const body = n % 7 === 0 ? randomBytes(48 * 1024) : Buffer.from(`loop ${i} call ${n}`);
      const r = (i + n) % plane.replicas.length;
      try {
        const res = await fetch(plane.invokeUrl(r), {
          method: "POST",
          headers: bearer(plane.fn.apiKey, { "content-type": "application/octet-stream" }),
          body,
          signal: AbortSignal.timeout(20_000),
        });
        const got = Buffer.from(await res.arrayBuffer());
        if (res.status === 200 && got.equals(body)) ok++;
        else
          failures.push(`loop ${i} #${n} on replica ${r + 1}: ${res.status} ${got.toString().slice(0, 200)}`);
      } catch (err) {
        failures.push(`loop ${i} #${n} on replica ${r + 1}: ${(err as Error).message}`);
      }
      if (failures.length) await sleep(100);
    }
  };
  const all = Promise.all(Array.from({ length: loops }, (_, i) => one(i)));
  return {
    async stop() {
      stopped = true;
      await all;
      return { ok, failures };
    },
  };
}

/** The SHA-256 fingerprint of the certificate a new TLS connection to host:port is given. */
function peerFingerprint(host: string, port: number, servername: string, ca: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = tlsConnect({ host, port, servername, ca, rejectUnauthorized: true }, () => {
      const fp = s.getPeerCertificate().fingerprint256;
      s.destroy();
      resolve(fp);
    });
    s.once("error", reject);
  });
}

function fingerprint(pem: string): string {
  return new X509Certificate(pem).fingerprint256;
}

const podName = (host: string) => `${host.replaceAll(".", "-")}.invocation.nvcf.svc.cluster.local`;

async function reissuePods(plane: Plane, pki: TestPki): Promise<string[]> {
  const pems: string[] = [];
  for (const r of plane.replicas) {
    const pair = await pki.issue([podName(r.host)]);
    writePair(r.certDir!, pair);
    writeFileAtomic(join(r.certDir!, TLS_FILES.ca), pki.ca.certPem, 0o644);
    pems.push(pair.certPem);
  }
  return pems;
}

/** Every callback the proxy handled was forwarded: none refused, none failed upstream. */
function assertAllForwarded(proxy: PlaneProxy): void {
  const all = proxy.callbacks();
  const forwarded = proxy.callbacks("forwarded");
  assert.ok(all > 0, "no callback went through the proxy");
  assert.equal(forwarded, all, "a callback failed at the proxy");
}

function waitForApplied(registry: Registry, material: string, count: number): Promise<true> {
  return waitFor(`${material} to apply update ${count}`, async () =>
    (await metricValue(registry, "callplane_tls_reloads_total", { material, result: "applied" })) >= count
      ? true
      : undefined,
  );
}

test("frontend and pod certificates rotate under load without one failed callback", LIMIT, async (t) => {
  const plane = await startPlane(t, {
    replicas: 2,
    replicaHosts: HOSTS,
    proxy: true,
    workers: 2,
    workerEnv: POSTED_ANSWERS,
  });
  const proxy = plane.proxy!;
  const traffic = load(t, plane, 20);
  await sleep(1000);

  // (a) the proxy's frontend certificate
  const front = await proxy.pki.issue(["*.worker.callplane.test", "worker.callplane.test"]);
  writePair(proxy.frontendDir, front);
  await waitForApplied(proxy.registry, "frontend", 1);
  await sleep(1000);

  // (b) every replica's worker-listener certificate
  const pods = await reissuePods(plane, proxy.pki);
  for (const r of plane.replicas) await waitForApplied(r.service.registry, POD_LISTENER, 1);
  await sleep(1500);

  const { ok, failures } = await traffic.stop();
  assert.deepEqual(failures, [], "no invocation failed while certificates rotated");
  assert.ok(ok > 50, `only ${ok} invocations in 4 s`);
  for (const r of plane.replicas) {
    assert.equal(
      await metricValue(r.service.registry, "callplane_tls_reloads_total", { result: "rejected" }),
      0,
    );
  }

  assertAllForwarded(proxy);

  // new TLS sessions get the new certificates
  const ca = proxy.pki.ca.certPem;
  assert.equal(
    await peerFingerprint(proxy.host, proxy.port, "invocation.worker.callplane.test", ca),
    fingerprint(front.certPem),
  );
  for (const [i, r] of plane.replicas.entries()) {
    assert.equal(await peerFingerprint(r.host, proxy.podPort, podName(r.host), ca), fingerprint(pods[i]));
  }
});

// The whole plane under load while the stack CA rotates. HAProxy 2.6's own `commit ssl ca-file`
// does not reach its server lines, so the keeper gives each TLS server to pods a successor that
// verifies against the new bundle (ca-rotation.test.ts checks new pod connections after each step).
test(
  "a CA rotation (old+new bundle, pods re-issued, new CA alone) keeps callbacks working",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, {
      replicas: 2,
      replicaHosts: HOSTS,
      proxy: true,
      workers: 2,
      workerEnv: POSTED_ANSWERS,
    });
    const proxy = plane.proxy!;
    const oldCa = proxy.pki.ca.certPem;
    const next = await testPki();
    const traffic = load(t, plane, 16);
    await sleep(500);

    // 1. the proxy trusts both CAs
    writeFileAtomic(proxy.caFile, `${oldCa.trim()}\n${next.ca.certPem}`, 0o644);
    await waitForApplied(proxy.registry, "pod-ca", 1);
    await sleep(500);
    // 2. pods get certificates from the new CA
    const pods = await reissuePods(plane, next);
    for (const r of plane.replicas) await waitForApplied(r.service.registry, POD_LISTENER, 1);
    await sleep(500);
    // 3. the proxy drops the old CA
    writeFileAtomic(proxy.caFile, next.ca.certPem, 0o644);
    await waitForApplied(proxy.registry, "pod-ca", 2);
    await sleep(1000);

    const { ok, failures } = await traffic.stop();
    assert.deepEqual(failures, [], "no invocation failed while the CA rotated");
    assert.ok(ok > 30, `only ${ok} invocations`);
    assert.equal(await metricValue(proxy.registry, "callplane_tls_reloads_total", { result: "rejected" }), 0);
    // every pod now presents a certificate from the new CA, and the old CA no longer verifies it
    for (const [i, r] of plane.replicas.entries()) {
      assert.equal(
        await peerFingerprint(r.host, proxy.podPort, podName(r.host), next.ca.certPem),
        fingerprint(pods[i]),
      );
      await assert.rejects(peerFingerprint(r.host, proxy.podPort, podName(r.host), oldCa));
    }
    assertAllForwarded(proxy);
  },
);
