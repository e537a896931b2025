// Rotating the CA the callback proxy verifies pods against, on a running HAProxy: with the old and
// new CA in the bundle, a pod with a certificate from either is reached; with the new CA alone, a pod
// still showing the old CA's certificate is refused. Every check is made on a new connection to the
// pod (the pod closes its connections when its certificate changes), which is what HAProxy 2.6's
// own `commit ssl ca-file` got wrong: its server lines kept verifying against the first bundle.
import assert from "node:assert/strict";
import type { Socket } from "node:net";
import { test } from "node:test";
import { DOMAIN, POD, startProxyFixture } from "../../testkit/callback-proxy.js";
import { rawTls, testPki, type TestPki } from "../../testkit/tls.js";

const GRPC_POD = `127-0-0-1.grpc-headless.${DOMAIN}`;
const PATH = "/v2/nvcf/worker/request-attach";

test("a CA rotation reaches the connections HAProxy opens to pods, callbacks and tunnels alike", async (t) => {
  const { pki, pod, proxy, proxyPort } = await startProxyFixture(t, { grpcPodPort: "pod" });
  // the pod is also the grpc-proxy pod tunnels go to, and takes every CONNECT
  pod.server.on("connect", (_req, socket: Socket) =>
    socket.end("HTTP/1.1 200 Connection Established\r\n\r\n"),
  );
  /** The pod shows a certificate from `ca`'s CA from now on, to new connections only. */
  const podCertFrom = async (ca: TestPki) => {
    const c = await ca.issue([POD, GRPC_POD]);
    pod.server.setSecureContext({ cert: c.certPem, key: c.keyPem });
    pod.server.closeAllConnections();
  };
  const front = { ca: pki.ca.certPem };
  const callback = async () =>
    (
      await rawTls(
        proxyPort,
        [
          `POST http://${POD}:${pod.port}${PATH} HTTP/1.1`,
          `Host: ${POD}:${pod.port}`,
          "Content-Length: 5",
          "Connection: close",
          "",
          "hello",
        ].join("\r\n"),
        front,
      )
    ).status;
  const tunnel = async () =>
    (
      await rawTls(
        proxyPort,
        [`CONNECT ${GRPC_POD}:${pod.port} HTTP/1.1`, `Host: ${GRPC_POD}:${pod.port}`, "", ""].join("\r\n"),
        { ...front, servername: "127-0-0-1.worker.callplane.test", timeoutMs: 1000 },
      )
    ).status;

  await podCertFrom(pki);
  assert.equal(await callback(), 200);
  assert.equal(await tunnel(), 200);

  // 1. the proxy trusts both CAs
  const next = await testPki();
  await proxy.setPodCa(`${pki.ca.certPem.trim()}\n${next.ca.certPem}`);
  assert.equal(await callback(), 200, "a pod with the old CA's certificate, old and new CA trusted");
  // 2. the pod gets a certificate from the new CA
  await podCertFrom(next);
  assert.equal(await callback(), 200, "a pod with the new CA's certificate, old and new CA trusted");
  assert.equal(await tunnel(), 200, "a tunnel to a pod with the new CA's certificate");
  // 3. the proxy drops the old CA
  await proxy.setPodCa(next.ca.certPem);
  assert.equal(await callback(), 200, "a pod with the new CA's certificate, the new CA alone trusted");
  await podCertFrom(pki);
  assert.equal(await callback(), 502, "a pod still showing the old CA's certificate is refused");
  assert.notEqual(await tunnel(), 200, "a tunnel to a pod showing the old CA's certificate is refused");
  await podCertFrom(next);
  assert.equal(await callback(), 200);
  assert.equal(await tunnel(), 200);
});
