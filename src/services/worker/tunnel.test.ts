import assert from "node:assert/strict";
import { createServer, type AddressInfo } from "node:net";
import { test } from "node:test";
import { podAwareLookup } from "../../lib/net/index.js";
import type { TunnelError } from "./tunnel.js";
import { openTunnel } from "./tunnel.js";

/** A CONNECT listener that answers every request with `answer` and counts connections. */
async function fakeProxy(t: { after(f: () => void): void }, answer: (n: number) => string | undefined) {
  let connections = 0;
  const requests: string[] = [];
  const server = createServer((s) => {
    const n = ++connections;
    s.on("error", () => undefined);
    s.once("data", (d: Buffer) => {
      requests.push(d.toString("latin1"));
      const a = answer(n);
      if (a === undefined) s.destroy();
      else s.end(a);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => server.close());
  return { port: (server.address() as AddressInfo).port, connections: () => connections, requests };
}

const opts = { lookup: podAwareLookup(new Map(), "nvcf.svc.cluster.local"), secureContext: undefined };
const target = (port: number) => ({
  proxyUri: `http://127-0-0-1.grpc-headless.nvcf.svc.cluster.local:${port}/v1/proxy`,
  token: "abc.def",
  requestId: "00000000-0000-8000-8000-000000000001",
});

test("the worker's CONNECT carries the token and request id; 401 and 403 are final, other failures are retried", async (t) => {
  const refusing = await fakeProxy(t, () => "HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n");
  await assert.rejects(
    openTunnel(target(refusing.port), opts),
    (e: TunnelError) => e.final && /403/.test(e.message),
  );
  assert.equal(refusing.connections(), 1, "a 403 is not retried");
  assert.match(
    refusing.requests[0],
    /^CONNECT http:\/\/127-0-0-1\.grpc-headless\.nvcf\.svc\.cluster\.local:\d+\/v1\/proxy HTTP\/1\.1\r\n/,
  );
  assert.match(refusing.requests[0], /\r\nAuthorization: Bearer abc\.def\r\n/);
  assert.match(refusing.requests[0], /\r\nX-Request-ID: 00000000-0000-8000-8000-000000000001\r\n/);

  const flaky = await fakeProxy(t, (n) =>
    n < 3 ? undefined : "HTTP/1.1 200 Connection Established\r\n\r\n",
  );
  const socket = await openTunnel(target(flaky.port), opts);
  socket.destroy();
  assert.equal(flaky.connections(), 3, "two broken dials, then the tunnel");

  const down = await fakeProxy(t, () => undefined);
  await assert.rejects(openTunnel(target(down.port), opts, 3), (e: TunnelError) => !e.final);
  assert.equal(down.connections(), 3, "at most `attempts` dials");
});
