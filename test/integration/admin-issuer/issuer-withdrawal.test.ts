// The admin token issuer, withdrawn in one switch (adminIssuerProxy.enabled: false): not started,
// no route, its key not loaded, the tokens it issued before refused by the API, other admin
// tokens unaffected; turned back on, it works again. In this process, then with the real
// processes (node dist/src/services/{api,admin-issuer}/main.js), then the stack's key handling.
import assert from "node:assert/strict";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import {
  ADMIN_ISSUER,
  STACK_ADMIN_ISSUER,
  createAdminTokenSigner,
  ensureAdminKeyPair,
  ensureOperatorCredential,
  ensureServiceTokens,
  readOperatorCredential,
} from "../../../src/lib/identity/index.js";
import { loadConfig } from "../../../src/lib/config/index.js";
import { ensureKeyringFile } from "../../../src/lib/secrets/index.js";
import { LocalStack } from "../../../src/stack/stack.js";
import {
  call,
  distRoot,
  startApi,
  startIssuer,
  startNats,
  tmpDir,
  type JsonResponse,
} from "../../testkit/index.js";
import { reverseScope, startService } from "../../testkit/processes.js";

interface Problem {
  code: string;
  detail: string;
}
const problem = (r: JsonResponse<unknown>, status: number, code: string): Problem => {
  assert.equal(r.status, status, r.text);
  const p = r.body as Problem;
  assert.equal(p.code, code, r.text);
  return p;
};

test("disabled, the API refuses the issuer's earlier tokens and has no issuer route; re-enabled, it accepts them", async (t) => {
  const dir = tmpDir(t);
  const on = await startApi(t, { dir });
  const issuer = await startIssuer(t, on.issuerKeyFile);
  const minted = await call<{ value: string }>(`${issuer.url}/v1/admin/keys`, {
    body: {},
    token: issuer.credential,
  });
  assert.equal(minted.status, 200, minted.text);
  const fromIssuer = minted.body.value;
  const list = (url: string, token: string) => call(`${url}/v2/nvcf/functions`, { token });
  assert.equal((await list(on.url, fromIssuer)).status, 200, "enabled: the issuer's token works");

  // the same database and keys, the issuer turned off
  const off = await startApi(t, { dir, issuer: false });
  const refused = problem(await list(off.url, fromIssuer), 401, "TOKEN_ISSUER_DISABLED");
  assert.match(refused.detail, /adminIssuerProxy\.enabled: false/);
  assert.match(refused.detail, /CALLPLANE_TOKEN/);
  assert.equal(
    (await list(off.url, await off.adminToken())).status,
    200,
    "the stack's admin key still works",
  );
  problem(await call(`${off.url}/v1/admin/keys`, { body: {} }), 404, "NOT_FOUND");
  const info = await call<{ adminIssuer: { enabled: boolean; tokensAccepted: boolean } }>(
    `${off.url}/v1/info`,
  );
  assert.deepEqual(info.body.adminIssuer, { enabled: false, gatewayEnabled: false, tokensAccepted: false });

  // the two keys are not interchangeable: each issuer's tokens pass only with its own key
  const issuerKeyAsStack = await createAdminTokenSigner(
    readFileSync(on.issuerKeyFile, "utf8"),
    600,
    STACK_ADMIN_ISSUER,
  );
  problem(await list(off.url, (await issuerKeyAsStack.sign()).token), 401, "TOKEN_INVALID");
  problem(await list(on.url, (await issuerKeyAsStack.sign()).token), 401, "TOKEN_INVALID");
  const stackKeyAsIssuer = await createAdminTokenSigner(
    readFileSync(on.privateKeyFile, "utf8"),
    600,
    ADMIN_ISSUER,
  );
  problem(await list(on.url, (await stackKeyAsIssuer.sign()).token), 401, "TOKEN_INVALID");

  // turned back on: nothing to do by hand
  const again = await startApi(t, { dir, issuer: true });
  assert.equal((await list(again.url, fromIssuer)).status, 200);
});

test("the real processes: disabled, the issuer does not start, the API starts without its key and refuses its tokens", async (t) => {
  const ctx = reverseScope(t);
  const dir = tmpDir(t, "callplane-issuer-off-");
  ensureAdminKeyPair(join(dir, "keys", "admin-signing.key.pem"), join(dir, "keys", "admin-signing.pub.pem"));
  ensureAdminKeyPair(join(dir, "keys", "admin-issuer.key.pem"), join(dir, "keys", "admin-issuer.pub.pem"));
  ensureServiceTokens(join(dir, "secrets"));
  ensureKeyringFile(join(dir, "keys", "mek.json"));
  // where the stack puts it (adminIssuerProxy.operatorCredentialFile's default)
  ensureOperatorCredential(join(dir, "keys", "issuer-operator.secret"));
  const operator = readOperatorCredential(join(dir, "keys", "issuer-operator.secret"));
  const nats = await startNats(ctx);
  const base = {
    CALLPLANE__GLOBAL__DATA_DIR: dir,
    CALLPLANE__API__LISTEN: "127.0.0.1:0",
    CALLPLANE__LOG__LEVEL: "warn",
    ...nats.serviceEnv(),
  };
  const api = (name: string, env: Record<string, string> = {}) =>
    startService(ctx, name, join(distRoot, "src", "services", "api", "main.js"), { ...base, ...env });
  const issuerMain = join(distRoot, "src", "services", "admin-issuer", "main.js");

  const apiOn = await api("api-on");
  const iss = await startService(ctx, "issuer", issuerMain, {
    ...base,
    CALLPLANE__ADMIN_ISSUER_PROXY__LISTEN: "127.0.72.1:0",
  });
  const minted = await call<{ value: string }>(`${iss.urls.issuer}/v1/admin/keys`, {
    body: {},
    token: operator,
  });
  assert.equal(minted.status, 200, minted.text);
  const token = minted.body.value;
  assert.equal((await call(`${apiOn.urls.api}/v2/nvcf/functions`, { token })).status, 200);
  await iss.stop();
  await apiOn.stop();

  // off: the issuer refuses to start at all, and the API needs (and reads) no issuer key
  await assert.rejects(
    startService(ctx, "issuer-off", issuerMain, {
      ...base,
      CALLPLANE__ADMIN_ISSUER_PROXY__ENABLED: "false",
      CALLPLANE__ADMIN_ISSUER_PROXY__LISTEN: "127.0.72.1:0",
    }),
    /adminIssuerProxy\.enabled is false: the admin issuer is turned off/,
  );
  const moved = join(dir, "keys", "elsewhere.pub.pem");
  const apiOff = await api("api-off", {
    CALLPLANE__ADMIN_ISSUER_PROXY__ENABLED: "false",
    // a file that does not exist: an API that tried to load the issuer's key would not start
    CALLPLANE__ADMIN_ISSUER_PROXY__PUBLIC_KEY_FILE: moved,
  });
  problem(await call(`${apiOff.urls.api}/v2/nvcf/functions`, { token }), 401, "TOKEN_ISSUER_DISABLED");
  problem(await call(`${apiOff.urls.api}/v1/admin/keys`, { body: {} }), 404, "NOT_FOUND");
  // and nothing answers where the issuer was (the CLI reports that as ISSUER_DISABLED: see secrets-cli)
  await assert.rejects(
    fetch(`${iss.urls.issuer}/v1/admin/keys`, { method: "POST", body: "{}" }),
    /fetch failed/,
  );
  await apiOff.stop();

  // on, with the issuer's key missing: refused, naming the key
  await assert.rejects(
    api("api-nokey", { CALLPLANE__ADMIN_ISSUER_PROXY__PUBLIC_KEY_FILE: moved }),
    /cannot read the admin token issuer's public key at .*elsewhere\.pub\.pem.*adminIssuerProxy\.publicKeyFile/,
  );
  // on, with the issuer's key being the stack's admin key under another name: refused
  writeFileSync(moved, readFileSync(join(dir, "keys", "admin-signing.pub.pem")));
  await assert.rejects(
    api("api-samekey", { CALLPLANE__ADMIN_ISSUER_PROXY__PUBLIC_KEY_FILE: moved }),
    /holds the same key as auth\.adminPublicKeyFile/,
  );
  // back on: the earlier token works again (same key pair: the stack is what replaces it, below)
  const apiBack = await api("api-back");
  assert.equal((await call(`${apiBack.urls.api}/v2/nvcf/functions`, { token })).status, 200);
});

test("the stack makes the issuer its own key pair, and deletes it when the issuer is turned off", (t) => {
  const dir = tmpDir(t, "callplane-stack-keys-");
  const said: string[] = [];
  const stack = (enabled: boolean) =>
    new LocalStack({
      config: loadConfig({
        env: {},
        cwd: dir,
        overrides: { global: { dataDir: dir }, adminIssuerProxy: { enabled } },
      }),
      configFile: undefined,
      say: (l) => said.push(l),
    });
  stack(true).prepareSecrets();
  const issuerKey = join(dir, "keys", "admin-issuer.key.pem");
  const adminKey = join(dir, "keys", "admin-signing.key.pem");
  const mek = join(dir, "keys", "mek.json");
  assert.ok(existsSync(issuerKey) && existsSync(adminKey) && existsSync(mek));
  assert.notEqual(readFileSync(issuerKey, "utf8"), readFileSync(adminKey, "utf8"), "two key pairs");
  assert.match(said.join("\n"), /generated the admin issuer's own signing key/);
  assert.match(
    said.join("\n"),
    /generated the master encryption key \(MEK mek-.*\) in .*mek\.json \(mode 0600/,
  );
  stack(false).prepareSecrets();
  assert.ok(
    !existsSync(issuerKey) && !existsSync(join(dir, "keys", "admin-issuer.pub.pem")),
    "the issuer's pair is gone",
  );
  assert.ok(existsSync(adminKey), "the stack's own admin key stays");
  assert.match(said.join("\n"), /deleted its key pair, so the tokens it issued are refused for good/);
  stack(true).prepareSecrets();
  assert.ok(existsSync(issuerKey), "turned back on: a new pair");
});

test("configuration: the issuer's key files must not be the admin key's; the grace must cover two refreshes", () => {
  assert.throws(
    () =>
      loadConfig({
        env: {},
        overrides: {
          adminIssuerProxy: { signingKeyFile: "/k/a.pem" },
          auth: { adminSigningKeyFile: "/k/a.pem" },
        },
      }),
    /adminIssuerProxy\.signingKeyFile and auth\.adminSigningKeyFile name the same file/,
  );
  assert.throws(
    () =>
      loadConfig({
        env: {},
        overrides: { secrets: { mek: { refreshSeconds: 60, rotationGraceSeconds: 90 } } },
      }),
    /secrets\.mek\.rotationGraceSeconds \(90\) is less than twice secrets\.mek\.refreshSeconds \(60\)/,
  );
  assert.throws(
    () => loadConfig({ env: {}, overrides: { secrets: { mek: { provider: "plugin" } } } }),
    /secrets\.mek\.provider is plugin but secrets\.mek\.plugin is empty/,
  );
});
