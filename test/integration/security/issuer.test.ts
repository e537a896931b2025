// The admin token issuer, attacked as issue 19 found it: a bare POST, a DNS-rebinding page's
// request (its own Host, no content type), a browser's (Origin), a form post, a wrong or missing
// operator credential. Every entry of the corpus's `issuer` section is sent as raw HTTP and must be
// refused with its code and no token; then what the operator does works: the credential the stack
// writes (mode 0600), `callplane init` from the stack's folder, the names of global.hosts.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { chmodSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { decodeJwt } from "jose";
import { loadConfig } from "../../../src/lib/config/index.js";
import { LocalStack } from "../../../src/stack/stack.js";
import { call, CLI_CLEAN_ENV, runCli, startApi, startIssuer, tmpDir } from "../../testkit/index.js";
import { corpusSection, sendEntry } from "./corpus-http.js";

interface AdminKey {
  value: string;
  authorizations: { policies: Array<{ resources: Array<{ id: string; type: string }> }> };
}

const execFileAsync = promisify(execFile);

test("every hostile request in the corpus's issuer section is refused, and none gets a token", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const vars = { operator: issuer.credential, admin: await api.adminToken() };
  for (const e of corpusSection("issuer")) {
    await t.test(e.name, async () => {
      const r = await sendEntry(issuer.url, e, vars);
      assert.doesNotMatch(r.text, /eyJ/, "no token in the answer");
      assert.equal(r.status, e.expect.status, `${r.head}\n${r.text}`);
      assert.equal(r.body?.code, e.expect.code, r.text);
      assert.ok((r.body?.detail ?? "").length > 20, "the refusal says what was wrong");
    });
  }
  // what the refusals say: what was wrong and what to do
  const bare = corpusSection("issuer").find((e) => e.name === "JSON without the operator credential")!;
  const said = await sendEntry(issuer.url, bare, vars);
  assert.match(said.body?.detail ?? "", /operator credential.*Authorization: Bearer.*callplane init/);
});

test("with the operator credential the issuer mints a plane-wide token, with or without a body", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const r = await call<AdminKey>(`${issuer.url}/v1/admin/keys`, { body: {}, token: issuer.credential });
  assert.equal(r.status, 200, r.text);
  assert.equal(decodeJwt(r.body.value).account, "*");
  assert.deepEqual(r.body.authorizations.policies[0].resources[0], { id: "*", type: "accounts" });
  const bare = await call<AdminKey>(`${issuer.url}/v1/admin/keys`, {
    method: "POST",
    token: issuer.credential,
    headers: { "content-type": "application/json" },
  });
  assert.equal(bare.status, 200, bare.text);
  const charset = await call<AdminKey>(`${issuer.url}/v1/admin/keys`, {
    rawBody: "{}",
    headers: { "content-type": "application/json; charset=UTF-8" },
    token: issuer.credential,
  });
  assert.equal(charset.status, 200, charset.text);
  // the token works at the API
  assert.equal((await call(`${api.url}/v2/nvcf/functions`, { token: r.body.value })).status, 200);
  // localhost is loopback
  const local = await call(`${issuer.url.replace("127.0.0.1", "localhost")}/v1/admin/keys`, {
    body: {},
    token: issuer.credential,
  });
  assert.equal(local.status, 200, local.text);
});

test("peer credentials: a loopback caller of the stack's own user mints without the file; another user does not", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile, 43_200, { peerCredentials: true });
  // this process runs as the issuer's user
  const mine = await call<{ value: string }>(`${issuer.url}/v1/admin/keys`, { body: {} });
  assert.equal(mine.status, 200, mine.text);
  assert.equal(typeof mine.body.value, "string");
  // the same request from a process of another user (nobody), as a function instance would send it
  if (process.getuid?.() !== 0) return t.skip("needs root to run a process as another user");
  const script = `fetch(${JSON.stringify(`${issuer.url}/v1/admin/keys`)}, {method: "POST", headers: {"content-type": "application/json"}, body: "{}"}).then(async (r) => { console.log(r.status, await r.text()); })`;
  // (asynchronously: the issuer answers from this process's event loop)
  const other = await execFileAsync(process.execPath, ["-e", script], { uid: 65534, gid: 65534, cwd: "/" });
  assert.match(other.stdout, /^401 .*OPERATOR_CREDENTIAL_REQUIRED/);
  // and without a content type, even this user gets nothing
  const bare = await fetch(`${issuer.url}/v1/admin/keys`, { method: "POST" });
  assert.equal(bare.status, 415, await bare.text());
});

test("behind a gateway the issuer answers the names of global.hosts, and only those", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile, 600, {
    hosts: ["api-keys.example.test", "*.svc.example.test"],
  });
  const vars = { operator: issuer.credential };
  const mint = (host: string) =>
    sendEntry(
      issuer.url,
      {
        name: host,
        finding: "19.1",
        request: {
          method: "POST",
          path: "/v1/admin/keys",
          headers: { host, authorization: "Bearer {operator}", "content-type": "application/json" },
          body: {},
        },
        expect: { status: 200, code: "" },
      },
      vars,
    );
  assert.equal((await mint("api-keys.example.test")).status, 200);
  assert.equal((await mint("API-KEYS.example.test.")).status, 200);
  assert.equal((await mint("admin-token-issuer-proxy.svc.example.test:8081")).status, 200);
  for (const host of ["svc.example.test", "example.test", "api-keys.example.test.attacker.example"]) {
    const r = await mint(host);
    assert.equal(r.status, 421, `${host}: ${r.text}`);
    assert.equal(r.body?.code, "HOST_NOT_SERVED");
  }
});

test("the stack writes the operator credential with mode 0600 and takes others' access away", (t) => {
  const dir = tmpDir(t, "callplane-operator-");
  const said: string[] = [];
  const stack = () =>
    new LocalStack({
      config: loadConfig({ env: {}, cwd: dir, overrides: { global: { dataDir: dir } } }),
      configFile: undefined,
      say: (l) => said.push(l),
    });
  stack().prepareSecrets();
  const file = join(dir, "keys", "issuer-operator.secret");
  assert.equal(statSync(file).mode & 0o777, 0o600);
  const secret = readFileSync(file, "utf8").trim();
  assert.match(secret, /^cpo-[A-Za-z0-9_-]{43}$/);
  assert.match(said.join("\n"), /generated the operator credential .*issuer-operator\.secret \(mode 0600/);
  chmodSync(file, 0o644);
  stack().prepareSecrets();
  assert.equal(statSync(file).mode & 0o777, 0o600, "made private again");
  assert.equal(readFileSync(file, "utf8").trim(), secret, "kept, not replaced");
  assert.match(said.join("\n"), /readable by this account only/);
});

test("callplane init from the stack's folder presents the credential; without it, says which file", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const dir = tmpDir(t, "callplane-init-");
  const data = join(dir, ".callplane");
  mkdirSync(join(data, "keys"), { recursive: true });
  // a stack.json without issuerCredentialFile (an older stack): the folder's keys/ is looked in
  writeFileSync(
    join(data, "stack.json"),
    JSON.stringify({ api: api.url, issuer: issuer.url, invocation: [], grpc: [], dataDir: data }),
  );
  const env = { ...CLI_CLEAN_ENV, HOME: dir, CALLPLANE_STATE_DIR: join(dir, "state") };
  const init = () => runCli(["init"], { cwd: dir, env });

  const missing = await init();
  assert.equal(missing.code, 1);
  assert.match(
    missing.stderr,
    /^callplane: cannot read the admin issuer's operator credential .*\.callplane\/keys\/issuer-operator\.secret \(from the local stack's folder .*\): no such file \(OPERATOR_CREDENTIAL_REQUIRED\)$/m,
  );
  assert.match(missing.stderr, /^hint: the stack creates it on start/m);

  writeFileSync(join(data, "keys", "issuer-operator.secret"), `${issuer.credential}\n`, { mode: 0o600 });
  const ok = await init();
  assert.equal(ok.code, 0, ok.stderr);
  assert.match(ok.stdout, /saved an admin token/);

  // a wrong credential: the issuer's own refusal, named
  writeFileSync(join(data, "keys", "issuer-operator.secret"), "cpo-this-is-not-the-operator-credential\n");
  const wrong = await init();
  assert.equal(wrong.code, 1);
  assert.match(wrong.stderr, /OPERATOR_CREDENTIAL_REQUIRED/);

  if (process.getuid?.() !== 0) {
    // (root reads any file: only checked as another user)
    writeFileSync(join(data, "keys", "issuer-operator.secret"), `${issuer.credential}\n`);
    chmodSync(join(data, "keys", "issuer-operator.secret"), 0o000);
    const denied = await init();
    assert.equal(denied.code, 1);
    assert.match(denied.stderr, /permission denied \(OPERATOR_CREDENTIAL_REQUIRED\)/);
    assert.match(denied.stderr, /only the account that runs the stack can read it/);
  }

  // an issuer elsewhere is never offered the local stack's credential unasked
  const remote = await runCli(["init", "--issuer", "https://api-keys.example.test"], { cwd: dir, env });
  assert.equal(remote.code, 1);
  assert.match(
    remote.stderr,
    /is not on this machine, so the local stack's operator credential is not offered/,
  );
  assert.match(remote.stderr, /--operator-credential <file>/);
});
