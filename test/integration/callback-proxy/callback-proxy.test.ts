// The worker callback proxy against a corpus of hostile and malformed requests. Every refusal is
// checked for its status and for opening no connection to the pod; accepted callbacks for what the
// pod receives. The pod is a real HTTPS server with a certificate from a real test CA.
import assert from "node:assert/strict";
import { createServer as createHttpServer } from "node:http";
import { connect as netConnect, type AddressInfo } from "node:net";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { connect as tlsConnect } from "node:tls";
import { Agent } from "undici";
import { DOMAIN, POD, startProxyFixture, type ProxyFixtureOptions } from "../../testkit/callback-proxy.js";
import { rawTls, type CountingPod, type TestPki } from "../../testkit/tls.js";

const PATH = "/v2/nvcf/worker/request-attach";

interface Fixture {
  pki: TestPki;
  pod: CountingPod;
  proxyPort: number;
  target: string;
  accessLog: () => Array<Record<string, unknown>>;
}

async function fixture(t: TestContext, opts: ProxyFixtureOptions = {}): Promise<Fixture> {
  const { pki, pod, proxyPort, lines } = await startProxyFixture(t, opts);
  return {
    pki,
    pod,
    proxyPort,
    target: `http://${POD}:${pod.port}`,
    accessLog: () =>
      lines.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === "callback"),
  };
}

function req(lines: string[], body = ""): string {
  return `${lines.join("\r\n")}\r\n\r\n${body}`;
}

function post(f: Fixture, extra: string[] = [], body = "hello", target = `${f.target}${PATH}`): string {
  return req(
    [
      `POST ${target} HTTP/1.1`,
      `Host: ${POD}:${f.pod.port}`,
      "Authorization: Bearer t0k3n",
      `Content-Length: ${Buffer.byteLength(body)}`,
      "Connection: close",
      ...extra,
    ],
    body,
  );
}

test("a well-formed callback reaches the pod with its token, and leaves one access-log line", async (t) => {
  const f = await fixture(t);
  const r = await rawTls(f.proxyPort, post(f, ["Proxy-Connection: keep-alive", "Keep-Alive: timeout=5"]), {
    ca: f.pki.ca.certPem,
  });
  assert.equal(r.status, 200, r.text);
  assert.equal(f.pod.requests.length, 1);
  const seen = f.pod.requests[0];
  assert.equal(seen.method, "POST");
  assert.equal(seen.url, PATH);
  assert.equal(seen.body, "hello");
  assert.equal(seen.headers.authorization, "Bearer t0k3n");
  assert.equal(seen.headers.host, `${POD}:${f.pod.port}`);
  assert.equal(seen.headers["proxy-connection"], undefined, "Proxy-Connection is stripped, not refused");
  assert.equal(seen.headers["keep-alive"], undefined);
  await sleep(50);
  const line = f.accessLog().at(-1)!;
  assert.equal(line.status, 200);
  assert.equal(line.outcome, "forwarded");
  assert.equal(line.target, POD);
  assert.equal(line.path, PATH);
  // HAProxy counts the request head as well as the body
  assert.ok(typeof line.bytesIn === "number" && line.bytesIn > 5, String(line.bytesIn));
  assert.ok(typeof line.bytesOut === "number" && line.bytesOut > 0);
  assert.ok(typeof line.durationMs === "number");
  assert.match(String(line.worker), /^127\.0\.0\.1:\d+$/);
  assert.ok(!JSON.stringify(line).includes("t0k3n"), "the access log never holds the token");
});

test("a callback with Expect: 100-continue is forwarded: the proxy answers the expectation itself", async (t) => {
  const f = await fixture(t);
  // what curl sends for bodies over 1 MiB; the upstream client refused it before, and the worker
  // got a 502 for a callback that was fine
  const r = await rawTls(f.proxyPort, post(f, ["Expect: 100-continue"]), { ca: f.pki.ca.certPem });
  assert.match(r.text, /^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 /, r.text);
  assert.equal(f.pod.requests.length, 1);
  assert.equal(f.pod.requests[0].body, "hello");
  assert.equal(f.pod.requests[0].headers.expect, undefined, "the pod is not asked to continue again");
});

test("a Connection header cannot strip the Authorization a callback needs", async (t) => {
  const f = await fixture(t);
  const r = await rawTls(f.proxyPort, post(f, ["Connection: close, authorization, x-drop"], "x"), {
    ca: f.pki.ca.certPem,
  });
  assert.equal(r.status, 200, r.text);
  assert.equal(f.pod.requests[0].headers.authorization, "Bearer t0k3n");
});

test("hostile targets and paths are refused without any connection to the pod", async (t) => {
  const f = await fixture(t);
  const p = f.pod.port;
  const corpus: Array<[string, string, number]> = [
    ["another path", `http://${POD}:${p}/v2/nvcf/functions`, 404],
    ["trailing slash", `http://${POD}:${p}${PATH}/`, 404],
    ["dot segments", `http://${POD}:${p}/v2/nvcf/worker/../worker/request-attach`, 404],
    ["encoded slash", `http://${POD}:${p}/v2/nvcf/worker%2frequest-attach`, 404],
    ["double slash", `http://${POD}:${p}/${PATH}`, 404],
    ["matrix parameter", `http://${POD}:${p}${PATH};x=1`, 404],
    ["upper-case path", `http://${POD}:${p}${PATH.toUpperCase()}`, 404],
    ["a query", `http://${POD}:${p}${PATH}?x=1`, 400],
    ["origin form", PATH, 400],
    ["a foreign host", `http://example.com${PATH}`, 400],
    ["a foreign host with the port", `http://example.com:${p}${PATH}`, 400],
    ["an IP literal", `http://127.0.0.1:${p}${PATH}`, 400],
    ["outside the pod networks", `http://10-0-0-1.invocation.${DOMAIN}:${p}${PATH}`, 403],
    ["just outside the /29", `http://127-0-0-9.invocation.${DOMAIN}:${p}${PATH}`, 403],
    ["a leading zero", `http://127-0-0-01.invocation.${DOMAIN}:${p}${PATH}`, 400],
    ["an octet above 255", `http://127-0-0-256.invocation.${DOMAIN}:${p}${PATH}`, 400],
    ["an extra label", `http://x.${POD}:${p}${PATH}`, 400],
    ["another domain", `http://127-0-0-1.invocation.evil.example:${p}${PATH}`, 400],
    ["the domain as a prefix", `http://127-0-0-1.invocation.${DOMAIN}.evil.example:${p}${PATH}`, 400],
    ["a trailing dot", `http://${POD}.:${p}${PATH}`, 400],
    ["another port", `http://${POD}:${p + 1}${PATH}`, 400],
    ["no port", `http://${POD}${PATH}`, 400],
    ["user information", `http://user@${POD}:${p}${PATH}`, 400],
    ["an https target", `https://${POD}:${p}${PATH}`, 400],
    ["percent-encoded host", `http://127%2D0-0-1.invocation.${DOMAIN}:${p}${PATH}`, 400],
  ];
  for (const [name, target, want] of corpus) {
    // the Host header names what the target names, so that the target's own checks are what refuse
    // it (a Host that disagrees is the next test's)
    const host = /^[a-z]+:\/\/(?:[^/?#@]*@)?([^/?#]*)/i.exec(target)?.[1] ?? `${POD}:${p}`;
    const r = await rawTls(
      f.proxyPort,
      req([`POST ${target} HTTP/1.1`, `Host: ${host}`, "Content-Length: 0", "Connection: close"]),
      { ca: f.pki.ca.certPem },
    );
    assert.equal(r.status, want, `${name}: ${r.text.split("\r\n")[0]}`);
    if (want !== 404) assert.match(r.text, /application\/problem\+json/, name);
  }
  assert.equal(f.pod.connections, 0, "no refused request opened a connection to the pod");
  await sleep(50);
  const refusals = f.accessLog().filter((l) => String(l.outcome).startsWith("refused"));
  assert.equal(refusals.length, corpus.length, "every refusal is one access-log line");
  assert.ok(
    refusals.every((l) => typeof l.reason === "string" && l.reason.length > 0),
    "every refusal logs its reason",
  );
});

// HAProxy's parser refuses a Host that disagrees with an absolute-form target, and a second Host,
// before any rule of callplane's runs: its answer is its own 400 (HAProxy 2.6 answers its parser's
// refusals with a built-in page); the rule that would answer PROXY_HOST_MISMATCH stays behind it.
const HOST_REFUSED = /PROXY_HOST_MISMATCH|400 Bad request/;

test("a Host header that disagrees with the target is refused", async (t) => {
  const f = await fixture(t);
  for (const host of ["evil.example", `127-0-0-2.invocation.${DOMAIN}:${f.pod.port}`, `${POD}:1`]) {
    const r = await rawTls(
      f.proxyPort,
      post(f, [], "", `${f.target}${PATH}`).replace(`Host: ${POD}:${f.pod.port}`, `Host: ${host}`),
      { ca: f.pki.ca.certPem },
    );
    assert.equal(r.status, 400, host);
    assert.match(r.text, HOST_REFUSED);
  }
  // two Host headers, the first one right: refused outright
  const twice = await rawTls(f.proxyPort, post(f, ["Host: evil.example"]), { ca: f.pki.ca.certPem });
  assert.equal(twice.status, 400, twice.text);
  assert.match(twice.text, HOST_REFUSED);
  assert.equal(f.pod.connections, 0);
  // no Host at all is fine: the target names the pod, and the pod gets it as Host
  const none = await rawTls(f.proxyPort, post(f).replace(`Host: ${POD}:${f.pod.port}\r\n`, ""), {
    ca: f.pki.ca.certPem,
  });
  assert.equal(none.status, 200, none.text);
  assert.equal(f.pod.requests.at(-1)?.headers.host, `${POD}:${f.pod.port}`);
});

test("an Expect other than 100-continue is 417 with a problem body, never forwarded", async (t) => {
  const f = await fixture(t);
  const r = await rawTls(f.proxyPort, post(f, ["Expect: 200-ok"]), { ca: f.pki.ca.certPem });
  assert.equal(r.status, 417, r.text);
  assert.match(r.text, /application\/problem\+json[\s\S]*EXPECTATION_FAILED/);
  assert.equal(f.pod.connections, 0);
});

test("methods other than GET and POST are refused; CONNECT is refused with 405 (no tunnels to invocation pods)", async (t) => {
  const f = await fixture(t);
  const put = await rawTls(
    f.proxyPort,
    req([
      `PUT ${f.target}${PATH} HTTP/1.1`,
      `Host: ${POD}:${f.pod.port}`,
      "Content-Length: 0",
      "Connection: close",
    ]),
    { ca: f.pki.ca.certPem },
  );
  assert.equal(put.status, 405);
  const connect = await rawTls(
    f.proxyPort,
    req([`CONNECT ${POD}:${f.pod.port} HTTP/1.1`, `Host: ${POD}:${f.pod.port}`]),
    { ca: f.pki.ca.certPem },
  );
  assert.equal(connect.status, 405);
  assert.match(connect.text, /CONNECT_DISABLED/);
  assert.equal(f.pod.connections, 0);
});

test("ambiguous framing is refused and the connection closed", async (t) => {
  const f = await fixture(t);
  const target = `${f.target}${PATH}`;
  const host = `Host: ${POD}:${f.pod.port}`;
  // Content-Length beside Transfer-Encoding: chunked is not refused but made unambiguous, as RFC 9112
  // (6.3) asks of an intermediary: the Content-Length is removed, the body goes on chunked, and the
  // worker's connection closes after the answer
  const both = await rawTls(
    f.proxyPort,
    req([`POST ${target} HTTP/1.1`, host, "Content-Length: 5", "Transfer-Encoding: chunked"], "0\r\n\r\n"),
    { ca: f.pki.ca.certPem },
  );
  assert.equal(both.status, 200, both.text);
  assert.ok(both.closed, "the connection closes after a request that carried both");
  assert.equal(f.pod.requests.at(-1)?.headers["content-length"], undefined);
  assert.equal(f.pod.requests.at(-1)?.body, "");
  // an obsolete line folding is replaced by a space (RFC 9112 5.2), never passed on as it came
  const folded = await rawTls(
    f.proxyPort,
    req([`POST ${target} HTTP/1.1`, host, "X-Folded: a", " b", "Content-Length: 0", "Connection: close"]),
    { ca: f.pki.ca.certPem },
  );
  assert.equal(folded.status, 200, folded.text);
  assert.match(String(f.pod.requests.at(-1)?.headers["x-folded"]), /^a\s+b$/);
  // a bare LF ending a header line is read as a line end (RFC 9112 2.2); HAProxy writes the head
  // anew for the pod, so the pod reads what HAProxy read
  const lf = await rawTls(
    f.proxyPort,
    `POST ${target} HTTP/1.1\r\n${host}\nContent-Length: 0\r\nConnection: close\r\n\r\n`,
    { ca: f.pki.ca.certPem },
  );
  assert.equal(lf.status, 200, lf.text);
  const forwarded = f.pod.connections;
  const corpus: Array<[string, string]> = [
    [
      "odd Transfer-Encoding (,chunked)",
      req([`POST ${target} HTTP/1.1`, host, "Transfer-Encoding: ,chunked"], "0\r\n\r\n"),
    ],
    [
      "Transfer-Encoding chunked, gzip",
      req([`POST ${target} HTTP/1.1`, host, "Transfer-Encoding: chunked, gzip"], "0\r\n\r\n"),
    ],
    [
      "Transfer-Encoding identity",
      req([`POST ${target} HTTP/1.1`, host, "Transfer-Encoding: identity", "Content-Length: 1"], "x"),
    ],
    [
      "a bad chunk size",
      req([`POST ${target} HTTP/1.1`, host, "Transfer-Encoding: chunked"], "zz\r\nhello\r\n0\r\n\r\n"),
    ],
    ["a signed Content-Length", req([`POST ${target} HTTP/1.1`, host, "Content-Length: +5"], "hello")],
    [
      "two different Content-Lengths",
      req([`POST ${target} HTTP/1.1`, host, "Content-Length: 5", "Content-Length: 6"], "hello!"),
    ],
    ["space before the colon", req([`POST ${target} HTTP/1.1`, host, "Content-Length : 5"], "hello")],
    ["a NUL in a header value", req([`POST ${target} HTTP/1.1`, host, "X-A: a\0b", "Content-Length: 0"])],
    ["HTTP/1.32", req([`POST ${target} HTTP/1.32`, host, "Content-Length: 0"])],
  ];
  for (const [name, payload] of corpus) {
    const before = f.pod.connections;
    const r = await rawTls(f.proxyPort, payload, { ca: f.pki.ca.certPem });
    assert.equal(f.pod.connections, before, `${name}: reached the pod (${r.text.split("\r\n")[0]})`);
    assert.ok(
      r.status !== undefined && r.status >= 400 && r.status < 500,
      `${name}: got ${r.text.split("\r\n")[0]}`,
    );
    assert.ok(r.closed, `${name}: the connection must be closed`);
  }
  assert.equal(f.pod.connections, forwarded, "no ambiguous request reached the pod");
});

// HAProxy's parser refuses a head larger than its buffer, or with more than 100 fields, with 400
test("oversized heads are refused with 400", async (t) => {
  const f = await fixture(t);
  const big = await rawTls(f.proxyPort, post(f, [`X-Big: ${"a".repeat(20_000)}`]), { ca: f.pki.ca.certPem });
  assert.equal(big.status, 400);
  const many = await rawTls(
    f.proxyPort,
    post(
      f,
      Array.from({ length: 120 }, (_, i) => `X-H${i}: 1`),
    ),
    { ca: f.pki.ca.certPem },
  );
  assert.equal(many.status, 400);
  assert.equal(f.pod.connections, 0);
});

test("a slow client that never finishes its headers is cut off", async (t) => {
  const f = await fixture(t, { headersMs: 1000 });
  const started = Date.now();
  const r = await rawTls(
    f.proxyPort,
    `POST ${f.target}${PATH} HTTP/1.1\r\nHost: ${POD}:${f.pod.port}\r\nX-Slow: `,
    { ca: f.pki.ca.certPem, timeoutMs: 20_000 },
  );
  assert.ok(r.closed, "the proxy closed the connection");
  assert.ok(Date.now() - started < 19_000, "well before the client's own timeout");
  assert.equal(f.pod.connections, 0);
});

test("a pod certificate from another CA, or for another pod, is rejected with 502 and the reason logged", async (t) => {
  for (const podCert of ["other-ca", "other-name"] as const) {
    const f = await fixture(t, { podCert });
    const r = await rawTls(f.proxyPort, post(f), { ca: f.pki.ca.certPem });
    assert.equal(r.status, 502, `${podCert}: ${r.text}`);
    assert.match(r.text, /UPSTREAM_UNAVAILABLE/);
    assert.equal(f.pod.requests.length, 0, "nothing was sent to an unverified pod");
    await sleep(50);
    const line = f.accessLog().at(-1)!;
    assert.equal(line.status, 502);
    assert.match(String(line.reason), /certificate/i, String(line.reason));
  }
});

test("an upstream that answers 101 gets the worker a 502", async (t) => {
  const f = await fixture(t, {
    podHandler: (_req, res) => {
      res.writeHead(101, { connection: "upgrade", upgrade: "h2c" });
      res.end();
    },
  });
  const r = await rawTls(f.proxyPort, post(f, ["Upgrade: h2c", "Connection: upgrade"]), {
    ca: f.pki.ca.certPem,
  });
  assert.equal(r.status, 502, r.text);
  assert.equal(f.pod.requests[0].headers.upgrade, undefined, "Upgrade is never passed to the pod");
});

test("an upstream that stalls is ended after the idle timeout with 504", async (t) => {
  const f = await fixture(t, { idleMs: 800, podHandler: () => undefined });
  const r = await rawTls(f.proxyPort, post(f), { ca: f.pki.ca.certPem, timeoutMs: 10_000 });
  assert.equal(r.status, 504, r.text);
  assert.match(r.text, /UPSTREAM_TIMEOUT/);
});

test("a pod that is gone gets the worker a clear 502 at once", async (t) => {
  const f = await fixture(t);
  f.pod.server.close();
  f.pod.server.closeAllConnections();
  await sleep(50);
  const started = Date.now();
  const r = await rawTls(f.proxyPort, post(f), { ca: f.pki.ca.certPem });
  assert.equal(r.status, 502);
  assert.match(r.text, /nothing listens/);
  assert.ok(Date.now() - started < 2000);
});

test("callbacks to one pod reuse a pooled connection, and large bodies stream both ways", async (t) => {
  const f = await fixture(t, {
    podHandler: (_req, res, body) => {
      res.writeHead(200, { "content-type": "application/octet-stream" });
      res.end(Buffer.alloc(body.length * 2, "y"));
    },
  });
  const agent = new Agent({
    connect: { ca: f.pki.ca.certPem, servername: "invocation.worker.callplane.test" },
  });
  t.after(() => agent.close());
  for (let i = 0; i < 10; i++) {
    const r = await agent.request({
      origin: `https://127.0.0.1:${f.proxyPort}`,
      method: "POST",
      path: `${f.target}${PATH}`,
      headers: { host: `${POD}:${f.pod.port}`, authorization: "Bearer x" },
      // the Host header names the pod; the TLS session is with the proxy
      ...({ servername: "invocation.worker.callplane.test" } as object),
      body: Buffer.alloc(i === 9 ? 8 * 1024 * 1024 : 100, "x"),
    });
    const got = Buffer.from(await r.body.arrayBuffer());
    assert.equal(r.statusCode, 200);
    assert.equal(got.length, i === 9 ? 16 * 1024 * 1024 : 200);
  }
  assert.equal(f.pod.connections, 1, "ten callbacks, one upstream connection");
});

test("a worker that sends no server name gets the same frontend certificate", async (t) => {
  const f = await fixture(t);
  const s = tlsConnect({ host: "127.0.0.1", port: f.proxyPort, rejectUnauthorized: false });
  await new Promise<void>((r) => s.once("secureConnect", () => r()));
  const cert = s.getPeerCertificate();
  s.destroy();
  assert.match(cert.subjectaltname ?? "", /\*\.worker\.callplane\.test/);
});

test("plain HTTP to the frontend is not served", async (t) => {
  const f = await fixture(t);
  const answer = await new Promise<string>((resolve) => {
    const s = netConnect(f.proxyPort, "127.0.0.1", () => s.write(post(f)));
    let text = "";
    s.on("data", (d: Buffer) => (text += d.toString("latin1")));
    s.on("close", () => resolve(text));
    s.on("error", () => resolve(text));
  });
  assert.doesNotMatch(answer, /^HTTP\/1\.1 200/);
  assert.equal(f.pod.connections, 0);
  // keep the import of createHttpServer honest: a plain server is what a pod without TLS would be
  assert.equal(typeof createHttpServer, "function");
  void (null as unknown as AddressInfo);
});

test("gRPC tunnels: the server name is the target, checked before anything is dialed", async (t) => {
  const f = await fixture(t);
  const connect = (name: string, lines?: string[]) =>
    rawTls(
      f.proxyPort,
      req(lines ?? [`CONNECT ${POD}:${f.pod.port} HTTP/1.1`, `Host: ${POD}:${f.pod.port}`]),
      { ca: f.pki.ca.certPem, servername: name },
    );
  const cases: Array<[string, string, number, RegExp]> = [
    ["not a pod address", "grpc.worker.callplane.test", 400, /PROXY_TARGET_INVALID/],
    ["an octet above 255", "127-0-0-256.worker.callplane.test", 400, /PROXY_TARGET_INVALID/],
    ["a leading zero", "127-0-0-01.worker.callplane.test", 400, /PROXY_TARGET_INVALID/],
    ["outside the pod networks", "10-0-0-1.worker.callplane.test", 403, /PROXY_TARGET_FORBIDDEN/],
    ["no grpc-proxy pods configured", "127-0-0-1.worker.callplane.test", 405, /CONNECT_DISABLED/],
  ];
  for (const [name, servername, want, code] of cases) {
    const r = await connect(servername);
    assert.equal(r.status, want, `${name}: ${r.text.split("\r\n")[0]}`);
    assert.match(r.text, code, name);
  }
  assert.equal(f.pod.connections, 0, "no refused tunnel dialed anything");
  const lines = f.accessLog().filter((l) => l.method === "CONNECT");
  assert.equal(lines.length, cases.length);
  assert.ok(lines.every((l) => String(l.outcome).startsWith("refused") && String(l.reason).length > 0));
});

test("gRPC tunnels: only a CONNECT goes to the grpc-proxy pod, whose certificate must be for its own name", async (t) => {
  // the counting pod's certificate is for its invocation name, not <dashed-ip>.grpc-headless.<domain>
  const f = await fixture(t, { grpcPodPort: "pod" });
  const servername = "127-0-0-1.worker.callplane.test";
  const post = await rawTls(f.proxyPort, req([`POST ${PATH} HTTP/1.1`, "Host: x", "Content-Length: 0"]), {
    ca: f.pki.ca.certPem,
    servername,
  });
  assert.equal(post.status, 405, post.text);
  assert.match(post.text, /METHOD_NOT_ALLOWED/);
  const tunnel = await rawTls(
    f.proxyPort,
    req([
      `CONNECT 127-0-0-1.grpc-headless.${DOMAIN}:${f.pod.port} HTTP/1.1`,
      `Host: 127-0-0-1.grpc-headless.${DOMAIN}:${f.pod.port}`,
    ]),
    { ca: f.pki.ca.certPem, servername },
  );
  assert.equal(tunnel.status, 502, tunnel.text);
  assert.match(tunnel.text, /UPSTREAM_UNAVAILABLE/);
  assert.equal(f.pod.requests.length, 0, "nothing reached a pod whose certificate is not its own");
  await sleep(50);
  const line = f.accessLog().at(-1)!;
  assert.equal(line.target, `127-0-0-1.grpc-headless.${DOMAIN}`);
  assert.equal(line.outcome, "upstream_error");
});
