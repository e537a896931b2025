// The API's front door and every TLS listener, attacked as issue 19 found them: a foreign or doubled
// Host, JSON-like content types parsed as JSON, invalid UTF-8 stored as U+FFFD, JSON nested 10,000
// deep (a 500 from a stack overflow), and TCP connections that never start TLS held for minutes.
// The corpus's `api-bodies` section is sent as raw HTTP; then what must still work does.
import assert from "node:assert/strict";
import { connect, type Socket } from "node:net";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { connect as tlsConnect, type Server as TlsServer } from "node:tls";
import { Router, createHttpService, sendJson } from "../../../src/lib/http/index.js";
import { silentLogger } from "../../../src/lib/log.js";
import { createRegistry } from "../../../src/lib/metrics.js";
import { createTlsFrontend, limitHandshake } from "../../../src/lib/tls/index.js";
import { ClientListener } from "../../../src/services/grpc-proxy/listeners.js";
import type { Calls } from "../../../src/services/grpc-proxy/calls.js";
import { call, sampleFunction, startApi, tmpDir } from "../../testkit/index.js";
import { testPki } from "../../testkit/tls.js";
import { corpusSection, sendEntry } from "./corpus-http.js";

async function apiWithFunction(t: TestContext, hosts: string[] = []) {
  const api = await startApi(t, { hosts });
  const admin = await api.adminToken();
  const fn = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
    token: admin,
    body: sampleFunction("front-doors"),
  });
  assert.equal(fn.status, 200, fn.text);
  return { api, admin, fid: fn.body.function.id, vid: fn.body.function.versionId };
}

test("every hostile request in the corpus's api-bodies section is refused with its code", async (t) => {
  const { api, admin, fid, vid } = await apiWithFunction(t);
  const vars = { admin, fid, vid };
  for (const e of corpusSection("api-bodies")) {
    await t.test(e.name, async () => {
      const r = await sendEntry(api.url, e, vars);
      assert.equal(r.status, e.expect.status, `${r.head}\n${r.text.slice(0, 500)}`);
      assert.equal(r.body?.code, e.expect.code, r.text.slice(0, 500));
      assert.ok((r.body?.detail ?? "").length > 20, "the refusal says what was wrong");
    });
  }
  // nothing of them was stored
  const list = await call<{ functions: Array<{ name: string }> }>(`${api.url}/v2/nvcf/functions`, {
    token: admin,
  });
  assert.deepEqual(
    list.body.functions.map((f) => f.name),
    ["front-doors"],
  );
});

test("the refusals name the place: the path where JSON got too deep, the offset of the bad byte", async (t) => {
  const { api, admin, fid, vid } = await apiWithFunction(t);
  const send = (path: string, method: string, raw: Buffer | string) =>
    call(`${api.url}${path}`, {
      method,
      token: admin,
      rawBody: raw,
      headers: { "content-type": "application/json" },
    });
  const deep = `{"deploymentSpecifications":[{"gpu":"local","instanceType":"local.cpu","minInstances":0,"maxInstances":1,"configuration":{"models":[${"[".repeat(10_000)}${"]".repeat(10_000)}]}}]}`;
  const d = await send(`/v2/nvcf/deployments/functions/${fid}/versions/${vid}`, "POST", deep);
  assert.equal(d.status, 400, d.text);
  assert.match(
    (d.body as { detail: string }).detail,
    /deeper than 64 levels of objects and arrays, at deploymentSpecifications\[0\]\.configuration\.models\[0\](\[0\])+;/,
  );
  // a secret's value: the path stops before the value's own keys (they may be secret too)
  const s = await send(
    `/v2/nvcf/secrets/functions/${fid}/versions/${vid}`,
    "PUT",
    `{"secrets":[{"name":"DEEP","value":{"private-key-name":${"[".repeat(100)}${"]".repeat(100)}}}]}`,
  );
  assert.equal(s.status, 400, s.text);
  assert.match((s.body as { detail: string }).detail, /at secrets\[0\]\.value…;/);
  assert.doesNotMatch(s.text, /private-key-name/);
  // 64 levels pass the depth check (the schema then judges them)
  const at64 = await send(
    "/v2/nvcf/functions",
    "POST",
    `{"name":"x","tags":${"[".repeat(63)}${"]".repeat(63)}}`,
  );
  assert.equal(at64.status, 400);
  assert.equal((at64.body as { code: string }).code, "VALIDATION_FAILED", at64.text);

  const prefix = Buffer.from('{"name":"caf');
  const bad = Buffer.concat([prefix, Buffer.from([0xe9]), Buffer.from('","inferenceUrl":"/x"}')]);
  const u = await send("/v2/nvcf/functions", "POST", bad);
  assert.equal(u.status, 400, u.text);
  assert.equal((u.body as { code: string }).code, "INVALID_UTF8");
  assert.match((u.body as { detail: string }).detail, new RegExp(`offset ${prefix.length} \\(0xe9\\)`));
  // well-formed UTF-8 of every length still passes
  const ok = await call<{ function: { description?: string } }>(`${api.url}/v2/nvcf/functions`, {
    token: admin,
    body: sampleFunction("utf8-ok", { description: "café ✓ 𝄞" }),
  });
  assert.equal(ok.status, 200, ok.text);
});

test("the API answers the names of global.hosts, IP addresses and localhost, and no other", async (t) => {
  const { api, admin } = await apiWithFunction(t, ["api.example.test", "*.svc.example.test"]);
  const get = (host: string) =>
    sendEntry(
      api.url,
      {
        name: host,
        finding: "19.1",
        request: {
          method: "GET",
          path: "/v2/nvcf/functions",
          headers: { host, authorization: "Bearer {admin}" },
        },
        expect: { status: 200, code: "" },
      },
      { admin },
    );
  for (const host of [
    "api.example.test",
    "api.svc.example.test:8080",
    "localhost:8080",
    "127.0.0.1",
    "[::1]:8080",
  ])
    assert.equal((await get(host)).status, 200, host);
  for (const host of ["rebind.attacker.example", "example.test", "api.example.test.attacker.example"]) {
    const r = await get(host);
    assert.equal(r.status, 421, host);
    assert.equal(r.body?.code, "HOST_NOT_SERVED");
    assert.match(r.body?.detail ?? "", /add a name to global\.hosts/);
  }
});

/** Opens a TCP connection that never sends a byte and resolves when the server closes it. */
function silentConnection(port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const s: Socket = connect(port, "127.0.0.1");
    s.on("error", reject);
    s.on("close", () => resolve());
  });
}

async function certFiles(t: TestContext) {
  const pki = await testPki();
  const { certPem, keyPem } = await pki.issue(["localhost", "127.0.0.1"]);
  const dir = tmpDir(t, "callplane-tls-");
  writeFileSync(join(dir, "tls.crt"), certPem);
  writeFileSync(join(dir, "tls.key"), keyPem, { mode: 0o600 });
  return { cert: certPem, key: keyPem, certFile: join(dir, "tls.crt"), keyFile: join(dir, "tls.key") };
}

test(
  "a TCP connection that never starts TLS is closed by every kind of TLS listener",
  { timeout: 60_000 },
  async (t) => {
    const m = await certFiles(t);
    const logger = silentLogger();
    // createHttpService with tls (the API, invocation's worker listener, the issuer when TLS)
    const https = createHttpService({
      name: "tls-http",
      listen: { host: "127.0.0.1", port: 0 },
      logger,
      registry: createRegistry("tls-http", { defaultMetrics: false }),
      router: new Router(),
      tls: { cert: m.cert, key: m.key },
    });
    t.after(() => https.destroy());
    // the TLS front door (the callback proxy, grpc-proxy's worker TLS listener)
    const frontend = createTlsFrontend({ tls: { cert: m.cert, key: m.key }, route: (s) => s.end() });
    t.after(() => frontend.destroy());
    // grpc-proxy's client listener with TLS
    const grpc = new ClientListener(
      { listen: { host: "127.0.0.1", port: 0 }, clientTls: { certFile: m.certFile, keyFile: m.keyFile } },
      {} as Calls,
      { logger, registry: createRegistry("tls-grpc", { defaultMetrics: false }) },
    );
    t.after(() => grpc.destroy());
    const ports = [
      Number((await https.listen()).port),
      Number((await frontend.listen("127.0.0.1", 0)).port),
      Number((await grpc.listen()).port),
    ];
    // every one closes it (the deadline is 5 s; the test's limit is what "before long" means here)
    await Promise.all(ports.map((p) => silentConnection(p)));
  },
);

test("the deadline ends only handshakes: a connection that finished its handshake stays", async (t) => {
  const m = await certFiles(t);
  const router = new Router();
  router.add("GET", "/ping", ({ res }) => sendJson(res, 200, { ok: true }));
  const https = createHttpService({
    name: "tls-http",
    listen: { host: "127.0.0.1", port: 0 },
    logger: silentLogger(),
    registry: createRegistry("tls-http", { defaultMetrics: false }),
    router,
    tls: { cert: m.cert, key: m.key },
  });
  t.after(() => https.destroy());
  // a second, much shorter deadline on the same server (the shorter one decides)
  limitHandshake(https.server as unknown as TlsServer, 200);
  const port = Number((await https.listen()).port);
  const s = tlsConnect({ host: "127.0.0.1", port, rejectUnauthorized: false });
  t.after(() => s.destroy());
  await new Promise<void>((resolve, reject) => {
    s.once("secureConnect", () => resolve());
    s.once("error", reject);
  });
  // well past the short deadline, the connection still carries a request
  await new Promise((r) => setTimeout(r, 1000));
  assert.ok(!s.destroyed, "the connection is still open");
  const answer = await new Promise<string>((resolve, reject) => {
    let text = "";
    s.on("data", (d: Buffer) => {
      text += d.toString();
      if (text.includes('{"ok":true}')) resolve(text);
    });
    s.once("error", reject);
    s.write("GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  });
  assert.match(answer, /^HTTP\/1\.1 200/);
});
