// The operator console (/console on the API) over HTTP, as a browser or a script uses it: a real
// API (SQLite, NATS from testkit) on 127.0.0.1:0. Who gets in (no token, an API key, an account's
// admin token, a bad token, a plane-wide admin by Bearer and by the login cookie), what the pages
// show (health rows and certificates, functions filtered by name, a function's deployments and
// instances), the actions (deploy, scale, undeploy, revoke: bad input refused with its code,
// confirmed first, then applied, then in the audit log), and the same-origin rule. Then
// over a running plane (an invocation replica, a worker): what the replicas report shows on the
// health, live, request and functions pages, and a function's last hour on its page.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { IncomingMessage, ServerResponse } from "node:http";
import { test } from "node:test";
import { handle as exampleHandler } from "../../../examples/inference-server.js";
import { holderHex } from "../../../src/lib/ids.js";
import { createCallbackProxy } from "../../../src/services/callback-proxy/service.js";
import { freePort } from "../../testkit/plane.js";
import { waitFor } from "../../testkit/client.js";
import { startPlane } from "../../testkit/plane.js";
import { testPki } from "../../testkit/tls.js";
import {
  call,
  sampleDeployment,
  sampleFunction,
  startApi,
  startNats,
  type ApiFixture,
} from "../../testkit/index.js";

interface FunctionDto {
  id: string;
  versionId: string;
  name: string;
}

interface Page {
  status: number;
  headers: Headers;
  text: string;
}

async function get(url: string, headers: Record<string, string> = {}): Promise<Page> {
  const r = await fetch(url, { headers, redirect: "manual" });
  return { status: r.status, headers: r.headers, text: await r.text() };
}

async function post(
  url: string,
  form: Record<string, string>,
  headers: Record<string, string> = {},
): Promise<Page> {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded", ...headers },
    body: new URLSearchParams(form).toString(),
    redirect: "manual",
  });
  return { status: r.status, headers: r.headers, text: await r.text() };
}

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

/** The opening tags of a table's rows that carry `attr` (the contract's data- attributes). */
function rows(page: string, attr: string): string[] {
  return [...page.matchAll(new RegExp(`<tr\\s[^>]*${attr}="[^"]*"[^>]*>`, "g"))].map((m) => m[0]);
}

/** The detail cell (the last) of the first row of `component` on the health page. */
function detailOf(page: string, component: string): string {
  const cells = cellsOf(page, `data-component="${component}"`);
  return cells[cells.length - 1] ?? "";
}

function attrOf(tag: string, name: string): string | undefined {
  return new RegExp(`${name}="([^"]*)"`).exec(tag)?.[1];
}

/** The error code a console page shows (data-code on #error). */
function errorCode(page: string): string | undefined {
  return /id="error"[^>]*data-code="([A-Z_]+)"/.exec(page)?.[1];
}

async function createFunction(api: ApiFixture, token: string, name: string): Promise<FunctionDto> {
  const r = await call<{ function: FunctionDto }>(`${api.url}/v2/nvcf/functions`, {
    token,
    body: sampleFunction(name),
  });
  assert.equal(r.status, 200, r.text);
  return r.body.function;
}

async function deploy(api: ApiFixture, token: string, f: FunctionDto, min = 1, max = 2): Promise<void> {
  const r = await call(`${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`, {
    token,
    body: sampleDeployment(min, max),
  });
  assert.equal(r.status, 200, r.text);
}

async function deploymentSpec(api: ApiFixture, token: string, f: FunctionDto) {
  const r = await call<{
    deployment: { deploymentSpecifications: Array<{ minInstances: number; maxInstances: number }> };
  }>(`${api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`, { token });
  return { status: r.status, spec: r.body?.deployment?.deploymentSpecifications[0] };
}

void test("the operator console", async (t) => {
  const nats = await startNats(t);
  // certificate files the health page shows: the stack CA, one that expires in 5 days, one absent
  const certDir = mkdtempSync(join(tmpdir(), "callplane-console-certs-"));
  t.after(() => rmSync(certDir, { recursive: true, force: true }));
  const pki = await testPki();
  const soon = await pki.issue(["soon.example"], { notAfter: new Date(Date.now() + 5.5 * 86_400_000) });
  writeFileSync(join(certDir, "ca.crt"), pki.ca.certPem);
  writeFileSync(join(certDir, "soon.crt"), soon.certPem);
  // a short audit log: three rows (the tests below make four actions before the deploy)
  const api = await startApi(t, {
    nats,
    audit: { maxRows: 3, maxAgeDays: 30 },
    consoleCertificateFiles: [
      { name: "stack-ca", file: join(certDir, "ca.crt") },
      { name: "soon", file: join(certDir, "soon.crt") },
      { name: "absent", file: join(certDir, "absent.crt") },
    ],
  });
  const admin = await api.adminToken();
  const c = `${api.url}/console`;
  const echo = await createFunction(api, admin, "console-echo");
  const other = await createFunction(api, admin, "console-other");
  await deploy(api, admin, echo, 1, 2);

  await t.test(
    "without a token, pages send the browser to the login page and show no plane data",
    async () => {
      for (const path of ["", "/health", "/functions", `/functions/${echo.id}`, "/live", "/audit"]) {
        const p = await get(`${c}${path}`);
        assert.equal(p.status, 303, `${path}: ${p.text}`);
        const want = path === "" ? "/console/health" : "/console/login";
        assert.equal(p.headers.get("location"), want, path);
        assert.doesNotMatch(p.text, /console-echo/);
      }
      const login = await get(`${c}/login`);
      assert.equal(login.status, 200);
      assert.match(login.headers.get("content-type") ?? "", /^text\/html/);
      assert.match(login.text, /<form id="login" method="post" action="\/console\/login"/);
      assert.match(login.text, /<input id="token" name="token" type="password"/);
      assert.match(login.text, /<button id="login-submit"/);
      assert.match(login.text, /callplane init/);
      assert.doesNotMatch(login.text, /console-echo|console-other/);
      assert.doesNotMatch(login.text, /https?:\/\//, "no outside URL in a page");
    },
  );

  await t.test(
    "an API key, or an account's admin token, is refused with CONSOLE_ADMIN_REQUIRED",
    async () => {
      const key = await call<{ value: string }>(`${api.url}/v1/keys`, { token: admin, body: {} });
      assert.equal(key.status, 200, key.text);
      const byKey = await get(`${c}/functions`, bearer(key.body.value));
      assert.equal(byKey.status, 403, byKey.text);
      assert.equal(errorCode(byKey.text), "CONSOLE_ADMIN_REQUIRED");
      assert.match(byKey.text, /API key/);
      assert.doesNotMatch(byKey.text, /console-echo/);

      const accountToken = await api.adminToken({ account: "callplane" });
      const byAccount = await get(`${c}/health`, bearer(accountToken));
      assert.equal(byAccount.status, 403, byAccount.text);
      assert.equal(errorCode(byAccount.text), "CONSOLE_ADMIN_REQUIRED");

      const service = await get(`${c}/health`, bearer(api.serviceToken("compute")));
      assert.equal(service.status, 403);
      assert.equal(errorCode(service.text), "CONSOLE_ADMIN_REQUIRED");
    },
  );

  await t.test("a bad or expired token answers 401 on the login page with its code", async () => {
    const bad = await get(`${c}/health`, bearer("not-a-token"));
    assert.equal(bad.status, 401, bad.text);
    assert.equal(errorCode(bad.text), "TOKEN_INVALID");
    assert.match(bad.text, /<form id="login"/);

    const expired = await api.adminToken({ ttlSeconds: -60 });
    const old = await get(`${c}/health`, { cookie: `callplane_console=${expired}` });
    assert.equal(old.status, 401, old.text);
    assert.equal(errorCode(old.text), "TOKEN_EXPIRED");
    // the cookie that no longer works is cleared
    assert.match(old.headers.get("set-cookie") ?? "", /^callplane_console=;.*Max-Age=0/);
  });

  await t.test("the health page lists the API, its database and NATS, up", async () => {
    const p = await get(`${c}/health`, bearer(admin));
    assert.equal(p.status, 200, p.text);
    assert.match(p.text, /<table id="components">/);
    assert.match(p.headers.get("content-security-policy") ?? "", /default-src 'none'/);
    const byName = new Map(rows(p.text, "data-component").map((r) => [attrOf(r, "data-component"), r]));
    for (const name of ["api", "database", "nats"]) {
      assert.ok(byName.has(name), `a row for ${name}: ${p.text}`);
      assert.equal(attrOf(byName.get(name)!, "data-state"), "up", name);
    }
    // the NATS row names the server's version, as its connection's INFO gave it
    const natsRow = p.text.slice(p.text.indexOf('data-component="nats"'));
    assert.match(natsRow.slice(0, natsRow.indexOf("</tr>")), /<td>2\.\d+\.\d+/);
    // the issuer is on in this API: its row is there
    assert.ok(byName.has("admin-issuer"));
    assert.match(p.text, /aria-current="page">Health/);
    // NATS beyond the connection: the one server (healthy, JetStream on), the APP account's
    // JetStream, and the auth callout the test's NATS runs, as the server sees it
    const node = detailOf(p.text, "nats-node");
    assert.equal(attrOf(byName.get("nats-node")!, "data-state"), "up", node);
    assert.match(node, /^healthy; no cluster routes \(one server\); JetStream: \d+ streams, \d+ consumers, /);
    assert.equal(attrOf(byName.get("jetstream")!, "data-state"), "up");
    // the deployed version's work queue is one of the account's streams
    assert.match(
      detailOf(p.text, "jetstream"),
      /^[1-9]\d* streams \(no account limit\), [1-9]\d* consumers, /,
    );
    assert.equal(attrOf(byName.get("auth-callout")!, "data-state"), "up");
    assert.match(
      detailOf(p.text, "auth-callout"),
      /subscribed to \$SYS\.REQ\.USER\.AUTH \(as NATS sees it\); worker auth nkey/,
    );
    // the MEK provider: the file keyring, its one key primary, a round trip that works
    assert.equal(attrOf(byName.get("mek-provider")!, "data-state"), "up");
    assert.equal(attrOf(byName.get("mek-provider")!, "data-id"), "file");
    assert.match(
      detailOf(p.text, "mek-provider"),
      /^keys \S+ \(primary\); wrapped and unwrapped a test key under /,
    );
    const ring = JSON.parse(readFileSync(api.mekFile, "utf8")) as { keys: Array<{ key: string }> };
    for (const k of ring.keys) assert.ok(!p.text.includes(k.key), "no key material on the page");
    // the callback proxy is off for this API: no row at all (not a red one)
    assert.ok(!byName.has("callback-proxy"), "no callback proxy row while it is off");
  });

  await t.test(
    "the health page lists the certificates with their expiry; one under 14 days is a warning",
    async () => {
      const p = await get(`${c}/health`, bearer(admin));
      assert.match(p.text, /<table id="certificates"/);
      const certs = new Map(rows(p.text, "data-certificate").map((r) => [attrOf(r, "data-certificate"), r]));
      assert.deepEqual([...certs.keys()], ["stack-ca", "soon"], "the absent file has no row");
      assert.equal(attrOf(certs.get("stack-ca")!, "data-state"), "ok");
      assert.ok(Number(attrOf(certs.get("stack-ca")!, "data-days-left")) > 300);
      assert.equal(attrOf(certs.get("soon")!, "data-state"), "warning");
      assert.equal(attrOf(certs.get("soon")!, "data-days-left"), "5");
      const cells = cellsOf(p.text, 'data-certificate="soon"');
      // name, state, served by, subject, issuer, not after, days left
      assert.equal(cells[1], "warning");
      assert.match(cells[3], /CN=soon\.example/);
      assert.match(cells[4], /callplane test CA/);
      assert.match(cells[5], /^\d{4}-\d\d-\d\dT/);
    },
  );

  await t.test("the functions page lists every function and filters by name on the server", async () => {
    const all = await get(`${c}/functions`, bearer(admin));
    assert.equal(all.status, 200, all.text);
    assert.match(all.text, /<table id="functions">/);
    const names = rows(all.text, "data-function-id").map((r) => attrOf(r, "data-function-name"));
    assert.deepEqual(names, ["console-echo", "console-other"]);
    assert.match(all.text, new RegExp(`href="/console/functions/${echo.id}"`));

    const some = await get(`${c}/functions?q=ECHO`, bearer(admin));
    const filtered = rows(some.text, "data-function-id");
    assert.equal(filtered.length, 1, some.text);
    assert.equal(attrOf(filtered[0], "data-function-id"), echo.id);
    assert.match(some.text, /value="ECHO"/);

    const none = await get(`${c}/functions?q=${encodeURIComponent('<script>"')}`, bearer(admin));
    assert.equal(rows(none.text, "data-function-id").length, 0);
    assert.doesNotMatch(none.text, /<script>"/, "the filter is escaped where the page repeats it");
    assert.match(none.text, /&lt;script&gt;&quot;/);
  });

  await t.test(
    "a function's page shows its versions, its deployment with the scale form, and its instances",
    async () => {
      const p = await get(`${c}/functions/${echo.id}`, bearer(admin));
      assert.equal(p.status, 200, p.text);
      assert.match(p.text, /<table id="versions"/);
      assert.match(p.text, /<table id="deployments"/);
      assert.match(p.text, /<table id="instances"/);
      assert.equal(rows(p.text, "data-version-id").filter((r) => !r.includes("<td")).length >= 1, true);
      assert.match(p.text, /<form class="scale" method="post" action="\/console\/actions\/scale">/);
      assert.match(p.text, new RegExp(`name="versionId" value="${echo.versionId}"`));
      assert.match(p.text, />Scale…<\/button>/);

      const missing = await get(`${c}/functions/${randomUUID()}`, bearer(admin));
      assert.equal(missing.status, 404);
      assert.equal(errorCode(missing.text), "FUNCTION_NOT_FOUND");
    },
  );

  await t.test(
    "scale asks to confirm first, then changes the deployment and is in the audit log",
    async () => {
      const form = { functionId: echo.id, versionId: echo.versionId, minInstances: "0", maxInstances: "3" };
      const ask = await post(`${c}/actions/scale`, form, bearer(admin));
      assert.equal(ask.status, 200, ask.text);
      assert.match(ask.text, /<button id="confirm"/);
      assert.match(ask.text, /name="confirmed" value="1"/);
      assert.match(ask.text, /from\s+1–2\s+to\s+<strong>0–3<\/strong>/);
      // nothing changed yet
      const before = (await deploymentSpec(api, admin, echo)).spec;
      assert.deepEqual([before.minInstances, before.maxInstances], [1, 2]);
      assert.equal((await get(`${c}/audit`, bearer(admin))).text.includes('data-action="scale"'), false);

      const done = await post(`${c}/actions/scale`, { ...form, confirmed: "1" }, bearer(admin));
      assert.equal(done.status, 303, done.text);
      assert.equal(done.headers.get("location"), `/console/functions/${echo.id}`);
      const spec = (await deploymentSpec(api, admin, echo)).spec;
      assert.equal(spec.minInstances, 0);
      assert.equal(spec.maxInstances, 3);

      const audit = await get(`${c}/audit`, bearer(admin));
      assert.match(audit.text, /<table id="audit">/);
      const entries = rows(audit.text, "data-action");
      assert.equal(entries.length, 1, audit.text);
      assert.equal(attrOf(entries[0], "data-action"), "scale");
      assert.match(audit.text, new RegExp(`${echo.id}/${echo.versionId}`));
      assert.match(audit.text, /&quot;maxInstances&quot;:3/);

      // the API's own rule for a deployment holds here too: min above max is refused, nothing changes
      const wrong = await post(
        `${c}/actions/scale`,
        { ...form, minInstances: "5", maxInstances: "1", confirmed: "1" },
        bearer(admin),
      );
      assert.equal(wrong.status, 400, wrong.text);
      assert.equal(errorCode(wrong.text), "VALIDATION_FAILED");
      assert.equal((await deploymentSpec(api, admin, echo)).spec.maxInstances, 3);
    },
  );

  await t.test("a cross-origin POST is refused and changes nothing", async () => {
    const form = {
      functionId: echo.id,
      versionId: echo.versionId,
      minInstances: "2",
      maxInstances: "2",
      confirmed: "1",
    };
    const p = await post(`${c}/actions/scale`, form, { ...bearer(admin), origin: "https://evil.example" });
    assert.equal(p.status, 403, p.text);
    assert.equal(errorCode(p.text), "CONSOLE_CROSS_ORIGIN");
    assert.equal((await deploymentSpec(api, admin, echo)).spec.minInstances, 0);
    const nullOrigin = await post(`${c}/login`, { token: admin }, { origin: "null" });
    assert.equal(nullOrigin.status, 403);
    assert.equal(nullOrigin.headers.get("set-cookie"), null);
    // the console's own origin is fine
    const same = await post(
      `${c}/actions/scale`,
      { ...form, confirmed: "" },
      { ...bearer(admin), origin: api.url },
    );
    assert.equal(same.status, 200, same.text);
  });

  await t.test(
    "the login form sets an HttpOnly, SameSite=Strict cookie that opens the console; logout clears it",
    async () => {
      const refused = await post(`${c}/login`, { token: "nope" });
      assert.equal(refused.status, 401);
      assert.equal(errorCode(refused.text), "TOKEN_INVALID");
      assert.equal(refused.headers.get("set-cookie"), null);

      const ok = await post(`${c}/login`, { token: admin }, { origin: api.url });
      assert.equal(ok.status, 303, ok.text);
      assert.equal(ok.headers.get("location"), "/console/health");
      const setCookie = ok.headers.get("set-cookie") ?? "";
      assert.match(setCookie, /^callplane_console=[^;]+;/);
      assert.match(setCookie, /; HttpOnly/);
      assert.match(setCookie, /; SameSite=Strict/);
      assert.match(setCookie, /; Path=\/console/);
      assert.doesNotMatch(setCookie, /Secure/, "plain HTTP: no Secure flag");
      const cookie = setCookie.split(";")[0];

      const p = await get(`${c}/functions`, { cookie });
      assert.equal(p.status, 200, p.text);
      assert.match(p.text, /data-function-name="console-echo"/);

      const out = await post(`${c}/logout`, {}, { cookie });
      assert.equal(out.status, 303);
      assert.equal(out.headers.get("location"), "/console/login");
      assert.match(out.headers.get("set-cookie") ?? "", /^callplane_console=;.*Max-Age=0/);
    },
  );

  await t.test(
    "undeploy and revoke-identity are confirmed, applied as the API's routes apply them, and audited",
    async () => {
      await deploy(api, admin, other);
      const ask = await post(
        `${c}/actions/undeploy`,
        { functionId: other.id, versionId: other.versionId },
        bearer(admin),
      );
      assert.equal(ask.status, 200, ask.text);
      assert.match(ask.text, /<button id="confirm"/);
      assert.equal((await deploymentSpec(api, admin, other)).status, 200);
      const done = await post(
        `${c}/actions/undeploy`,
        { functionId: other.id, versionId: other.versionId, confirmed: "1" },
        bearer(admin),
      );
      assert.equal(done.status, 303, done.text);
      assert.equal((await deploymentSpec(api, admin, other)).status, 404);

      // an instance of echo with an identity the API issued (as the compute agent has it issued)
      const d = await call<{ deployment: { deploymentId: string } }>(
        `${api.url}/v2/nvcf/deployments/functions/${echo.id}/versions/${echo.versionId}`,
        { token: admin },
      );
      const instanceId = randomUUID();
      const issued = await call(`${api.url}/v1/internal/instances/${instanceId}/identity`, {
        token: api.serviceToken("compute"),
        body: {
          functionId: echo.id,
          versionId: echo.versionId,
          deploymentId: d.body.deployment.deploymentId,
        },
      });
      assert.equal(issued.status, 200, issued.text);
      const revokeForm = { functionId: echo.id, instanceId };
      const askRevoke = await post(`${c}/actions/revoke-identity`, revokeForm, bearer(admin));
      assert.equal(askRevoke.status, 200, askRevoke.text);
      assert.match(askRevoke.text, /Revoke the worker identity of instance/);
      const revoked = await post(
        `${c}/actions/revoke-identity`,
        { ...revokeForm, confirmed: "1" },
        bearer(admin),
      );
      assert.equal(revoked.status, 303, revoked.text);
      const record = await call<{ status: string }>(
        `${api.url}/v1/internal/instances/${instanceId}/identity`,
        {
          token: api.serviceToken("compute"),
        },
      );
      assert.equal(record.body.status, "REVOKED");

      const unknown = await post(
        `${c}/actions/revoke-identity`,
        { functionId: echo.id, instanceId: randomUUID() },
        bearer(admin),
      );
      assert.equal(unknown.status, 404);
      assert.equal(errorCode(unknown.text), "IDENTITY_NOT_FOUND");

      const audit = await get(`${c}/audit`, bearer(admin));
      assert.deepEqual(
        rows(audit.text, "data-action").map((r) => attrOf(r, "data-action")),
        ["revoke-identity", "undeploy", "scale"],
        "newest first",
      );
    },
  );

  await t.test(
    "the audit log says who (the admin token's subject and id) and keeps at most api.audit.maxRows",
    async () => {
      const claims = JSON.parse(Buffer.from(admin.split(".")[1], "base64url").toString("utf8")) as {
        sub: string;
        jti: string;
      };
      const before = await get(`${c}/audit`, bearer(admin));
      const entries = rows(before.text, "data-action");
      assert.equal(entries.length, 3, before.text);
      for (const e of entries) assert.equal(attrOf(e, "data-subject"), claims.sub);
      assert.equal(cellsOf(before.text, entries[0])[2], claims.jti, "the token's id, in its own column");
      assert.match(before.text, /Kept: the newest\s+3\s+actions\s+of\s+the\s+last\s+30\s+days/);

      // a fourth action: the oldest (the first scale) goes
      const form = { functionId: echo.id, versionId: echo.versionId, minInstances: "1", maxInstances: "3" };
      assert.equal(
        (await post(`${c}/actions/scale`, { ...form, confirmed: "1" }, bearer(admin))).status,
        303,
      );
      const after = await get(`${c}/audit`, bearer(admin));
      assert.deepEqual(
        rows(after.text, "data-action").map((r) => attrOf(r, "data-action")),
        ["scale", "revoke-identity", "undeploy"],
      );
    },
  );

  await t.test(
    "deploy, from a version's form: bad input gets its code, a good one is confirmed, deployed as the API deploys, and audited",
    async () => {
      // other was undeployed above: its page offers the deploy form with the cluster's instance type
      const p = await get(`${c}/functions/${other.id}`, bearer(admin));
      assert.match(
        p.text,
        /<form\s+id="deploy"\s+class="deploy"\s+method="post"\s+action="\/console\/actions\/deploy"/,
      );
      assert.match(p.text, new RegExp(`<option value="${other.versionId}">`));
      const localType = JSON.stringify(["local", "local.cpu"]);
      assert.ok(p.text.includes(`<option value="${localType.replace(/"/g, "&quot;")}">`), p.text);
      const form = {
        functionId: other.id,
        versionId: other.versionId,
        instanceType: localType,
        minInstances: "0",
        maxInstances: "2",
        maxRequestConcurrency: "4",
      };
      const refused = async (fields: Record<string, string>, status: number, code: string) => {
        const r = await post(`${c}/actions/deploy`, { ...form, ...fields, confirmed: "1" }, bearer(admin));
        assert.equal(r.status, status, r.text);
        assert.equal(errorCode(r.text), code, r.text);
        assert.equal((await deploymentSpec(api, admin, other)).status, 404, "nothing deployed");
      };
      await refused({ minInstances: "3", maxInstances: "1" }, 400, "VALIDATION_FAILED");
      await refused({ maxInstances: "" }, 400, "VALIDATION_FAILED");
      await refused({ instanceType: "local.cpu" }, 400, "VALIDATION_FAILED");
      await refused({ instanceType: JSON.stringify(["A100", "a100.x8"]) }, 400, "INSTANCE_TYPE_UNAVAILABLE");
      await refused({ versionId: randomUUID() }, 404, "VERSION_NOT_FOUND");
      const twice = await post(
        `${c}/actions/deploy`,
        { ...form, functionId: echo.id, versionId: echo.versionId },
        bearer(admin),
      );
      assert.equal(twice.status, 409, twice.text);
      assert.equal(errorCode(twice.text), "DEPLOYMENT_EXISTS");

      const ask = await post(`${c}/actions/deploy`, form, bearer(admin));
      assert.equal(ask.status, 200, ask.text);
      assert.match(ask.text, /Deploy version/);
      assert.match(ask.text, /local\/local\.cpu/);
      assert.match(ask.text, /<strong>0–2<\/strong>/);
      assert.equal((await deploymentSpec(api, admin, other)).status, 404, "not before the confirmation");
      const done = await post(`${c}/actions/deploy`, { ...form, confirmed: "1" }, bearer(admin));
      assert.equal(done.status, 303, done.text);
      assert.equal(done.headers.get("location"), `/console/functions/${other.id}`);
      const r = await call<{
        deployment: {
          deploymentSpecifications: Array<{
            gpu: string;
            instanceType: string;
            minInstances: number;
            maxInstances: number;
            maxRequestConcurrency: number;
          }>;
        };
      }>(`${api.url}/v2/nvcf/deployments/functions/${other.id}/versions/${other.versionId}`, {
        token: admin,
      });
      assert.equal(r.status, 200, r.text);
      const spec = r.body.deployment.deploymentSpecifications[0];
      assert.deepEqual(
        [spec.gpu, spec.instanceType, spec.minInstances, spec.maxInstances, spec.maxRequestConcurrency],
        ["local", "local.cpu", 0, 2, 4],
      );
      const page = await get(`${c}/functions/${other.id}`, bearer(admin));
      assert.equal(rows(page.text, "data-version-id").filter((t) => t.includes(other.versionId)).length, 2);
      assert.doesNotMatch(page.text, /<form\s+id="deploy"/, "no version left to deploy");
      const audit = await get(`${c}/audit`, bearer(admin));
      assert.equal(attrOf(rows(audit.text, "data-action")[0], "data-action"), "deploy");
      assert.match(audit.text, new RegExp(`${other.id}/${other.versionId}`));
      assert.match(audit.text, /&quot;instanceType&quot;:&quot;local.cpu&quot;/);
    },
  );

  await t.test("the live page and its event stream", async () => {
    const p = await get(`${c}/live`, bearer(admin));
    assert.equal(p.status, 200, p.text);
    assert.match(p.text, /<table id="inflight">/);
    assert.match(p.text, /<form id="lookup" method="get" action="\/console\/requests"/);
    assert.match(p.text, /<script src="\/console\/assets\/live.js" defer><\/script>/);

    const ac = new AbortController();
    const r = await fetch(`${c}/live/events`, { headers: bearer(admin), signal: ac.signal });
    assert.equal(r.status, 200);
    assert.match(r.headers.get("content-type") ?? "", /^text\/event-stream/);
    const reader = r.body!.getReader();
    let text = "";
    while (!text.includes("event: inflight\ndata: ")) {
      const { value, done } = (await reader.read()) as { value?: Uint8Array; done: boolean };
      if (done || !value) break;
      text += Buffer.from(value).toString("utf8");
    }
    assert.match(text, /event: inflight\ndata: <tr>/);
    ac.abort();

    const id = randomUUID();
    const lookup = await get(`${c}/requests?id=${id}`, bearer(admin));
    assert.equal(lookup.status, 303);
    assert.equal(lookup.headers.get("location"), `/console/requests/${id}`);
    const req = await get(`${c}/requests/${id}`, bearer(admin));
    assert.equal(req.status, 200, req.text);
    assert.match(req.text, /<dl id="request">/);
    assert.match(req.text, /<dd id="request-state" class="state">unknown<\/dd>/);
    const bad = await get(`${c}/requests?id=nope`, bearer(admin));
    assert.equal(bad.status, 400);
  });

  await t.test("assets are served by the console with a type and cache headers", async () => {
    const css = await get(`${c}/assets/console.css`);
    assert.equal(css.status, 200);
    assert.match(css.headers.get("content-type") ?? "", /^text\/css/);
    assert.match(css.headers.get("cache-control") ?? "", /max-age=\d+/);
    const etag = css.headers.get("etag")!;
    assert.equal((await get(`${c}/assets/console.css`, { "if-none-match": etag })).status, 304);
    const js = await get(`${c}/assets/live.js`);
    assert.match(js.headers.get("content-type") ?? "", /^text\/javascript/);
    assert.match(js.text, /EventSource\("\/console\/live\/events"\)/);
    // uPlot, from the installed package, with its licence notice, and its stylesheet
    const uplot = await get(`${c}/assets/uplot.js`);
    assert.equal(uplot.status, 200);
    assert.match(uplot.headers.get("content-type") ?? "", /^text\/javascript/);
    assert.match(uplot.text, /^\/\*! uPlot \(npm package uplot\), The MIT License/);
    assert.match(uplot.text, /var uPlot=/);
    assert.match((await get(`${c}/assets/uplot.css`)).text, /\.uplot/);
    assert.match((await get(`${c}/assets/graphs.js`)).text, /new uPlot\(/);
    assert.equal((await get(`${c}/assets/nope.css`)).status, 404);
  });
});

/** The text of each cell of the table row that opens with `rowTag`. */
function cellsOf(page: string, rowTag: string): string[] {
  const start = page.indexOf(rowTag);
  assert.ok(start !== -1, `no row ${rowTag}`);
  const row = page.slice(start, page.indexOf("</tr>", start));
  return [...row.matchAll(/<t[dh][^>]*>([\s\S]*?)<\/t[dh]>/g)].map((m) =>
    m[1]
      .replace(/<[^>]+>/g, "")
      .replace(/\s+/g, " ")
      .trim(),
  );
}

/** An inference server whose /hold answers only when the test releases it. */
function heldInference() {
  const waiting: Array<() => void> = [];
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    if (!req.url?.startsWith("/hold")) return exampleHandler(req, res);
    req.resume();
    waiting.push(() => {
      res.writeHead(200, { "content-type": "text/plain" });
      res.end("done");
    });
  };
  return { handler, held: () => waiting.length, release: () => waiting.splice(0).forEach((f) => f()) };
}

void test(
  "the console over a running plane: replicas on the health page, a held request live and looked up, stats per function",
  { timeout: 90_000 },
  async (t) => {
    const inference = heldInference();
    const plane = await startPlane(t, {
      replicas: 1,
      inferenceUrl: "/hold",
      inferenceHandler: inference.handler,
    });
    const admin = await plane.api.adminToken();
    const c = `${plane.api.url}/console`;
    const holder = holderHex(plane.replicas[0].service.holderId);

    const health = await get(`${c}/health`, bearer(admin));
    const replicaRow = rows(health.text, "data-component").find(
      (r) => attrOf(r, "data-component") === "invocation",
    );
    assert.ok(replicaRow, health.text);
    assert.equal(attrOf(replicaRow, "data-id"), holder, health.text);
    assert.equal(attrOf(replicaRow, "data-state"), "up");

    const held = fetch(plane.invokeUrl(0), {
      method: "POST",
      headers: {
        authorization: `Bearer ${plane.fn.apiKey}`,
        "content-type": "application/json",
        "nvcf-poll-seconds": "60",
      },
      body: "{}",
    });
    await waitFor("the request at the inference server", () => inference.held() === 1 || undefined, 20_000);

    // relay is off (startPlane's default), yet the replica is in the registry: a page asks the
    // replicas and is done once the one registered has answered, not after the whole 300 ms
    let fastest = Infinity;
    for (let i = 0; i < 5; i++) {
      const started = performance.now();
      assert.equal((await get(`${c}/live`, bearer(admin))).status, 200);
      fastest = Math.min(fastest, performance.now() - started);
    }
    assert.ok(fastest < 250, `the fastest of 5 live pages took ${Math.round(fastest)} ms (the wait is 300)`);

    const live = await get(`${c}/live`, bearer(admin));
    assert.match(live.text, /<th scope="col">Worker<\/th>/);
    const inflight = rows(live.text, "data-request-id");
    assert.equal(inflight.length, 1, live.text);
    const requestId = attrOf(inflight[0], "data-request-id")!;
    assert.equal(requestId.slice(0, 8), holder, "its id names its replica");
    assert.equal(attrOf(inflight[0], "data-state"), "queued");

    // the event stream carries the same row
    const ac = new AbortController();
    const r = await fetch(`${c}/live/events`, { headers: bearer(admin), signal: ac.signal });
    const reader = r.body!.getReader();
    let text = "";
    while (!text.includes(`data-request-id="${requestId}"`)) {
      const { value, done } = (await reader.read()) as { value?: Uint8Array; done: boolean };
      if (done || !value) break;
      text += Buffer.from(value).toString("utf8");
    }
    ac.abort();
    assert.match(text, /^event: inflight$/m);
    assert.ok(text.includes(`data-request-id="${requestId}"`), text);

    const fns = await get(`${c}/functions`, bearer(admin));
    const cells = cellsOf(fns.text, `data-function-id="${plane.fn.functionId}"`);
    // name, versions, state, ready/desired, in flight, requests/min, error ratio, p50/p99, queue depth
    assert.equal(cells[4], "1", `one request in flight: ${cells.join(" | ")}`);
    assert.equal(cells[8], "0", `the queue is read, and empty (the worker took it): ${cells.join(" | ")}`);

    const queued = await get(`${c}/requests/${requestId}`, bearer(admin));
    assert.match(queued.text, /<dd id="request-state" class="state">\s*queued\s*<\/dd>/, queued.text);

    inference.release();
    assert.equal((await held).status, 200);
    await waitFor("the request answered", async () => {
      const p = await get(`${c}/requests/${requestId}`, bearer(admin));
      return /<dd id="request-state" class="state">\s*answered\s*<\/dd>/.test(p.text) || undefined;
    });
    const after = cellsOf(
      (await get(`${c}/functions`, bearer(admin))).text,
      `data-function-id="${plane.fn.functionId}"`,
    );
    assert.equal(after[5], "1", `one request in the last minute: ${after.join(" | ")}`);
    assert.equal(after[6], "0.000", "no error");
    assert.match(after[7], /^\d+\/\d+$/, "p50/p99 known");

    // the function's page: its last hour, one request in the current minute, for the graphs
    const fnPage = await get(`${c}/functions/${plane.fn.functionId}`, bearer(admin));
    assert.equal(fnPage.status, 200, fnPage.text);
    assert.match(fnPage.text, /<script src="\/console\/assets\/uplot.js" defer><\/script>/);
    assert.match(fnPage.text, /<script src="\/console\/assets\/graphs.js" defer><\/script>/);
    assert.match(fnPage.text, /<link rel="stylesheet" href="\/console\/assets\/uplot.css"/);
    assert.match(fnPage.text, /id="graphs-summary" data-requests="1"/);
    const json = /<script type="application\/json" id="hour-data">([\s\S]*?)<\/script>/.exec(fnPage.text);
    assert.ok(json, fnPage.text);
    const hour = JSON.parse(json[1]) as {
      start: number;
      requests: number[];
      errorRatio: Array<number | null>;
      p99Ms: Array<number | null>;
    };
    assert.equal(hour.requests.length, 60);
    assert.equal(
      hour.requests.reduce((a, b) => a + b, 0),
      1,
    );
    const at = hour.requests.findIndex((n) => n === 1);
    assert.ok(at >= 58, `in the last minute or the one before: ${at}`);
    assert.equal(hour.errorRatio[at], 0);
    assert.ok(hour.p99Ms[at]! >= 1, "a p99 for that minute");
    assert.equal(hour.errorRatio[0], null, "a minute with no request is a gap");
  },
);

void test("the health page asks the callback proxy's /health: up, draining, down; unknown when it cannot", async (t) => {
  const pki = await testPki();
  const front = await pki.issue(["*.worker.callplane.test"]);
  const metricsPort = await freePort("127.0.0.1");
  const proxy = await createCallbackProxy({
    listen: { host: "127.0.0.1", port: await freePort("127.0.0.1") },
    metricsListen: { host: "127.0.0.1", port: metricsPort },
    serviceDomain: "nvcf.svc.cluster.local",
    workerDomain: "worker.callplane.test",
    podNetworks: ["127.0.1.0/24"],
    upstreamTls: true,
    podPort: 8443,
    grpcPodPort: undefined,
    frontend: { cert: front.certPem, key: front.keyPem },
    podCa: pki.ca.certPem,
    timeouts: { headersMs: 10_000, idleMs: 30_000, connectMs: 2000 },
    maxHeaderBytes: 16 * 1024,
    shutdownGraceMs: 5000,
    onAccessLog: () => undefined,
  });
  await proxy.listen();
  t.after(() => proxy.destroy());
  const url = `http://127.0.0.1:${metricsPort}/health`;
  const api = await startApi(t, { consoleCallbackProxy: { url } });
  const admin = await api.adminToken();
  const proxyRow = async () => {
    const p = await get(`${api.url}/console/health`, bearer(admin));
    assert.equal(p.status, 200, p.text);
    const tag = rows(p.text, "data-component").find((r) => attrOf(r, "data-component") === "callback-proxy");
    assert.ok(tag, p.text);
    return {
      state: attrOf(tag, "data-state"),
      cells: cellsOf(p.text, 'data-component="callback-proxy"'),
      page: p.text,
    };
  };

  const up = await proxyRow();
  assert.equal(up.state, "up", up.page);
  assert.equal(up.cells[3], url, "the address asked");
  assert.match(up.cells[4], /^\/health answered 200 in \d+ ms$/);
  // no NATS here: one unknown NATS row, and no node or auth callout rows to fake
  const components = new Map(rows(up.page, "data-component").map((r) => [attrOf(r, "data-component"), r]));
  assert.equal(attrOf(components.get("nats")!, "data-state"), "unknown");
  assert.ok(!components.has("auth-callout") && !components.has("nats-node") && !components.has("jetstream"));

  // a drain: readiness withdrawn at once, HAProxy still serving for the drain delay
  const closed = proxy.close(1000, 3000);
  const draining = await waitFor(
    "the draining proxy's row",
    async () => {
      const r = await proxyRow();
      return r.state === "draining" && r;
    },
    2000,
  );
  assert.match(draining.cells[4], /^\/health answered 503: the proxy is draining/);

  await closed;
  const down = await proxyRow();
  assert.equal(down.state, "down");
  assert.match(down.cells[4], /^\/health unreachable: ECONNREFUSED$/);

  // an address the API cannot dial (a pod's wildcard listener): unknown, with the reason
  const k8s = await startApi(t, { consoleCallbackProxy: { why: "its admin listener names no address" } });
  const p = await get(`${k8s.url}/console/health`, bearer(await k8s.adminToken()));
  const tag = rows(p.text, "data-component").find((r) => attrOf(r, "data-component") === "callback-proxy");
  assert.equal(attrOf(tag ?? "", "data-state"), "unknown", p.text);
  assert.match(
    cellsOf(p.text, 'data-component="callback-proxy"')[4],
    /^not asked: its admin listener names no address$/,
  );
});
