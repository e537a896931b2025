// `callplane secret ...`, `callplane secrets ...`, and `init`/`status` against a disabled issuer,
// run as child processes against a real API, each in its own empty folder and HOME. No value a
// test sets ever appears in what the CLI prints.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import {
  call,
  CLI_CLEAN_ENV,
  runCli,
  sampleFunction,
  startApi,
  tmpDir,
  type ApiFixture,
} from "../../testkit/index.js";

function cli(t: TestContext, env: NodeJS.ProcessEnv) {
  const dir = tmpDir(t, "callplane-cli-");
  const base = { ...CLI_CLEAN_ENV, HOME: dir, CALLPLANE_STATE_DIR: join(dir, "state"), ...env };
  return {
    dir,
    run: (args: string[], opts: { input?: string; env?: NodeJS.ProcessEnv } = {}) =>
      runCli(args, {
        cwd: dir,
        env: { ...base, ...opts.env },
        ...(opts.input !== undefined ? { input: opts.input } : {}),
      }),
  };
}

/** A port nothing listens on, on an address of its own: other test files' servers on 127.0.0.1 may take a freed port there. */
const CLOSED_HOST = "127.0.73.1";
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, CLOSED_HOST, r));
  const { port } = s.address() as AddressInfo;
  await new Promise((r) => s.close(r));
  return port;
}

async function withFunction(t: TestContext, api: ApiFixture) {
  const admin = await api.adminToken();
  const r = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
    token: admin,
    body: sampleFunction("cli-secrets"),
  });
  assert.equal(r.status, 200, r.text);
  return {
    c: cli(t, { CALLPLANE_API_URL: api.url, CALLPLANE_TOKEN: admin }),
    fid: r.body.function.id,
    vid: r.body.function.versionId,
  };
}

test("secret set|list|delete: values from stdin or a file, stored, listed by name, never printed", async (t) => {
  const api = await startApi(t);
  const { c, fid, vid } = await withFunction(t, api);
  const fromStdin = `stdin-marker-${randomBytes(6).toString("hex")}`;
  const fromFile = `file-marker-${randomBytes(6).toString("hex")}`;
  const outputs: string[] = [];
  const run = async (args: string[], opts: { input?: string } = {}) => {
    const r = await c.run(args, opts);
    outputs.push(r.stdout, r.stderr);
    return r;
  };

  const set1 = await run(["secret", "set", "cli-secrets", "API_TOKEN"], { input: `${fromStdin}\n` });
  assert.equal(set1.code, 0, set1.stderr);
  assert.match(set1.stdout, /^set secret API_TOKEN on cli-secrets \(version [0-9a-f-]{36}\)\n$/);
  writeFileSync(join(c.dir, "value.txt"), fromFile);
  const set2 = await run(["secret", "set", "cli-secrets", "db.password", "--from-file", "value.txt"]);
  assert.equal(set2.code, 0, set2.stderr);
  writeFileSync(join(c.dir, "obj.json"), JSON.stringify({ user: "u", password: fromFile }));
  const set3 = await run(["secret", "set", "cli-secrets", "creds", "--from-file", "obj.json", "--object"]);
  assert.equal(set3.code, 0, set3.stderr);

  const values = await call<{ values: Record<string, unknown> }>(
    `${api.url}/v1/internal/secrets/functions/${fid}/versions/${vid}`,
    { token: api.serviceToken("compute") },
  );
  assert.deepEqual(values.body.values, {
    API_TOKEN: fromStdin, // the newline echo adds is not part of the value
    "db.password": fromFile,
    creds: { user: "u", password: fromFile },
  });

  const list = await run(["secret", "list", "cli-secrets", "--check"]);
  assert.equal(list.code, 0, list.stderr);
  assert.match(list.stdout, /^NAME +UPDATED +READABLE\n/);
  assert.match(list.stdout, /API_TOKEN .* yes\n/);
  assert.match(list.stdout, /creds .* yes\n/);
  const json = await run(["--json", "secret", "list", "cli-secrets"]);
  assert.deepEqual(
    (JSON.parse(json.stdout) as { secrets: Array<{ name: string }> }).secrets.map((s) => s.name),
    ["API_TOKEN", "creds", "db.password"],
  );
  const get = await run(["function", "get", "cli-secrets"]);
  assert.match(get.stdout, /secrets: +API_TOKEN, creds, db\.password \(names only\)/);

  const del = await run(["secret", "delete", "cli-secrets", "creds"]);
  assert.equal(del.code, 0, del.stderr);
  assert.match(del.stdout, /deleted secret creds of cli-secrets/);
  const again = await run(["secret", "delete", "cli-secrets", "creds"]);
  assert.equal(again.code, 1);
  assert.match(
    again.stderr,
    /^callplane: Secret not found: .*no secret named "creds".* \(SECRET_NOT_FOUND\)\n/,
  );

  for (const out of outputs) {
    assert.ok(!out.includes(fromStdin), "a value was printed");
    assert.ok(!out.includes(fromFile), "a value was printed");
  }
});

test("secret set refuses bad input with a usage error, and never echoes the value", async (t) => {
  const api = await startApi(t);
  const { c } = await withFunction(t, api);
  const m = `marker-${randomBytes(6).toString("hex")}`;
  const cases: Array<[string[], string | undefined, RegExp]> = [
    [["secret", "set", "cli-secrets", "bad/name"], m, /"bad\/name" is not a secret name \(USAGE\)/],
    [["secret", "set", "cli-secrets", "EMPTY"], "\n", /the value from stdin is empty \(USAGE\)/],
    [
      ["secret", "set", "cli-secrets", "OBJ", "--object"],
      `{"x": "${m}"`,
      /--object: the value from stdin is not valid JSON \(USAGE\)/,
    ],
    [["secret", "set", "cli-secrets", "OBJ", "--object"], `["${m}"]`, /must be a JSON object/],
    [
      ["secret", "set", "cli-secrets", "F", "--from-file", "nope.txt"],
      undefined,
      /cannot read --from-file nope\.txt: ENOENT \(USAGE\)/,
    ],
    [
      ["secret", "set", "no-such-function", "A"],
      m,
      /no function named "no-such-function" \(FUNCTION_NOT_FOUND\)/,
    ],
  ];
  for (const [args, input, want] of cases) {
    const r = await c.run(args, input === undefined ? {} : { input });
    assert.notEqual(r.code, 0, args.join(" "));
    assert.match(r.stderr, want, args.join(" "));
    assert.ok(!(r.stdout + r.stderr).includes(m), `${args.join(" ")} printed the value`);
    assert.doesNotMatch(r.stderr, /Usage:/);
  }
  writeFileSync(join(c.dir, "binary"), Buffer.from([0xff, 0xfe, 0x00, 0x80]));
  const bin = await c.run(["secret", "set", "cli-secrets", "BIN", "--from-file", "binary"]);
  assert.equal(bin.code, 2);
  assert.match(bin.stderr, /is not UTF-8 text \(USAGE\)\nhint: .*base64/);
  const long = await c.run(["secret", "set", "cli-secrets", "LONG"], { input: "x".repeat(32_769) });
  assert.match(long.stderr, /longer than 32768 characters/);
  for (const words of [
    ["secret"],
    ["secret", "set"],
    ["secret", "list"],
    ["secret", "delete"],
    ["secrets"],
    ["secrets", "rotate-mek"],
    ["secrets", "status"],
    ["secrets", "rotate-nek"],
    ["secrets", "mek-generate"],
  ]) {
    const h = await c.run([...words, "--help"]);
    assert.equal(h.code, 0, words.join(" "));
    assert.match(h.stdout, new RegExp(`^Usage: callplane ${words.join(" ")} `));
  }
});

test("secrets rotate-mek follows a rotation to the end; status, rotate-nek, mek-generate", async (t) => {
  const api = await startApi(t, { secrets: { refreshMs: 100, rotationGraceMs: 300 } });
  const { c, fid, vid } = await withFunction(t, api);
  assert.equal((await c.run(["secret", "set", "cli-secrets", "A"], { input: "a-value" })).code, 0);
  const before = await c.run(["secrets", "status"]);
  assert.equal(before.code, 0, before.stderr);
  assert.match(before.stdout, /^provider: +file \(keys: mek-/);
  assert.match(before.stdout, /rotation: +none yet/);

  const abort = await c.run(["secrets", "rotate-mek", "--abort"]);
  assert.equal(abort.code, 1);
  assert.match(abort.stderr, /No key rotation to act on: no MEK rotation is in progress.* \(NO_ROTATION\)/);

  const r = await c.run(["secrets", "rotate-mek", "--interval", "1"]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stderr, /started: mek-\S+ replaces mek-\S+; promotion not before/);
  assert.match(r.stderr, /\] distributing mek-\S+ -> mek-\S+: the new MEK is decrypt-only/);
  assert.match(r.stdout, /^done mek-\S+ -> mek-\S+: mek-\S+ is retired and removed from the provider\n$/);
  const after = await c.run(["--json", "secrets", "status"]);
  const st = JSON.parse(after.stdout) as { rotation: { phase: string; toKid: string }; primaryKid: string };
  assert.equal(st.rotation.phase, "done");
  assert.equal(st.primaryKid, st.rotation.toKid);

  const nek = await c.run(["secrets", "rotate-nek", "cli-secrets"]);
  assert.equal(nek.code, 0, nek.stderr);
  assert.match(nek.stdout, new RegExp(`new NEK for function:${fid}`));
  const values = await call<{ values: Record<string, unknown> }>(
    `${api.url}/v1/internal/secrets/functions/${fid}/versions/${vid}`,
    { token: api.serviceToken("compute") },
  );
  assert.deepEqual(values.body.values, { A: "a-value" });

  const gen = await c.run(["secrets", "mek-generate", "--keyring"]);
  assert.equal(gen.code, 0);
  const ring = JSON.parse(gen.stdout) as { format: string; keys: Array<{ kid: string; key: string }> };
  assert.equal(ring.format, "callplane-mek-keyring/v1");
  assert.equal(Buffer.from(ring.keys[0].key, "base64").length, 32);
});

test("init against a disabled issuer says so and how to supply a token; status shows the issuer disabled", async (t) => {
  const api = await startApi(t, { issuer: false });
  const port = await closedPort();
  const c = cli(t, { CALLPLANE_API_URL: api.url, CALLPLANE_ISSUER_URL: `http://${CLOSED_HOST}:${port}` });
  const init = await c.run(["init"]);
  assert.equal(init.code, 1);
  assert.match(
    init.stderr,
    /^callplane: the admin token issuer is turned off \(the API at http:\/\/127\.0\.0\.1:\d+ says adminIssuerProxy\.enabled is false\), so there is no token to fetch \(ISSUER_DISABLED\)\nhint: supply an admin token instead: set CALLPLANE_TOKEN, or put `token:` in the CLI config file/,
  );
  assert.doesNotMatch(init.stderr, /Usage:/);
  const status = await c.run(["status"]);
  assert.equal(status.code, 0, status.stderr);
  assert.match(status.stdout, /issuer: +- +disabled: adminIssuerProxy\.enabled is false/);
  assert.match(
    status.stdout,
    /admin issuer: +disabled \(adminIssuerProxy\.enabled: false\): no issuer, and its earlier tokens are refused/,
  );
  const json = JSON.parse((await c.run(["--json", "status"])).stdout) as {
    adminIssuer: { enabled: boolean };
  };
  assert.equal(json.adminIssuer.enabled, false);

  // an enabled issuer's status says so
  const on = await startApi(t);
  const c2 = cli(t, { CALLPLANE_API_URL: on.url, CALLPLANE_ISSUER_URL: `http://${CLOSED_HOST}:${port}` });
  assert.match(
    (await c2.run(["status"])).stdout,
    /admin issuer: +enabled \(its tokens are accepted; public route on\)/,
  );
});
