// The `callplane` command, run as a child process against a real API and admin issuer on port 0.
// Each test runs the CLI in its own empty folder with its own HOME and state folder, so no
// stack.json, config file or saved token from the machine leaks in.
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import {
  CLI_CLEAN_ENV,
  call,
  runCli,
  sampleFunction,
  startApi,
  startIssuer,
  tmpDir,
  type ApiFixture,
} from "../../testkit/index.js";

const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/;

interface Cli {
  dir: string;
  stateFile: string;
  run(args: string[], env?: NodeJS.ProcessEnv): ReturnType<typeof runCli>;
}

function cli(t: TestContext, env: NodeJS.ProcessEnv = {}): Cli {
  const dir = tmpDir(t, "callplane-cli-");
  const base = { ...CLI_CLEAN_ENV, HOME: dir, CALLPLANE_STATE_DIR: join(dir, "state"), ...env };
  return {
    dir,
    stateFile: join(dir, "state", "state.json"),
    run: (args, extra = {}) => runCli(args, { cwd: dir, env: { ...base, ...extra } }),
  };
}

/** A CLI pointed at a fresh API with an admin token in CALLPLANE_TOKEN. */
async function withApi(t: TestContext): Promise<{ api: ApiFixture; c: Cli }> {
  const api = await startApi(t);
  const c = cli(t, { CALLPLANE_API_URL: api.url, CALLPLANE_TOKEN: await api.adminToken() });
  return { api, c };
}

/** A loopback port with nothing listening on it. */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const { port } = s.address() as AddressInfo;
  await new Promise((r) => s.close(r));
  return port;
}

async function httpServer(
  t: TestContext,
  handler: (req: IncomingMessage, res: ServerResponse) => void,
): Promise<string> {
  const s = createServer(handler);
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  t.after(() => {
    s.closeAllConnections();
    s.close();
  });
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
}

function assertNoUsage(out: { stdout: string; stderr: string }): void {
  assert.doesNotMatch(out.stdout + out.stderr, /Usage:/);
}

test("--help works for the program and every noun and verb", async (t) => {
  const c = cli(t);
  const commands = [
    [],
    ["init"],
    ["status"],
    ["function"],
    ["function", "create"],
    ["function", "list"],
    ["function", "get"],
    ["function", "delete"],
    ["deploy"],
    ["deploy", "create"],
    ["deploy", "get"],
    ["deploy", "delete"],
    ["key"],
    ["key", "create"],
    ["key", "list"],
    ["key", "revoke"],
    ["invoke"],
    ["admin"],
    ["admin", "token"],
    ["nats"],
    ["nats", "rotate-worker-key"],
    ["nats", "auth-config"],
    ["render"],
    ["credentials"],
    ["credentials", "generate"],
  ];
  for (const words of commands) {
    const r = await c.run([...words, "--help"]);
    assert.equal(r.code, 0, `${words.join(" ")} --help: ${r.stderr}`);
    assert.match(r.stdout, new RegExp(`^Usage: callplane${words.map((w) => ` ${w}`).join("")} `));
    assert.equal(r.stderr, "");
  }
  const top = await c.run(["--help"]);
  for (const where of [
    "CALLPLANE_TOKEN",
    "CALLPLANE_API_URL",
    "CALLPLANE_STATE_DIR",
    "~/.config/callplane/config.yaml",
    "stack.json",
  ]) {
    assert.ok(top.stdout.includes(where), `--help mentions ${where}`);
  }
  const fn = await c.run(["function", "create", "--help"]);
  assert.match(fn.stdout, /--inference-url <path>/);
  assert.match(fn.stdout, /Needs an admin token: CALLPLANE_TOKEN/);
});

test("init saves the admin token in the state file (0600) and later commands use it", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const c = cli(t);
  const r = await c.run([
    "init",
    "--issuer",
    issuer.url,
    "--api",
    api.url,
    "--operator-credential",
    issuer.credentialFile,
  ]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /saved an admin token in .*state\.json/);
  assert.match(r.stdout, /^expires:\s+\S+ \(in 1[12]h \d+m\)$/m);
  const state = JSON.parse(readFileSync(c.stateFile, "utf8")) as {
    token: { value: string; expiresAt: string };
  };
  assert.equal(state.token.value.split(".").length, 3);
  assert.ok(!r.stdout.includes(state.token.value), "init never prints the token");
  assert.equal(statSync(c.stateFile).mode & 0o777, 0o600);

  const list = await c.run(["function", "list", "--api", api.url]);
  assert.equal(list.code, 0, list.stderr);
  assert.equal(list.stdout, "no functions yet; create one with `callplane function create`\n");

  const json = await c.run(["init", "--json"], {
    CALLPLANE_ISSUER_URL: issuer.url,
    CALLPLANE_OPERATOR_CREDENTIAL_FILE: issuer.credentialFile,
  });
  assert.equal(json.code, 0, json.stderr);
  const out = JSON.parse(json.stdout) as { stateFile: string; expiresAt: string };
  assert.equal(out.stateFile, c.stateFile);
  assert.ok(Date.parse(out.expiresAt) > Date.now());
});

test("init against a closed port says the issuer is unreachable and how to supply a token", async (t) => {
  const c = cli(t);
  const port = await closedPort();
  const credential = join(c.dir, "operator.secret");
  writeFileSync(credential, "cpo-a-credential-for-the-test\n", { mode: 0o600 });
  const r = await c.run([
    "init",
    "--issuer",
    `http://127.0.0.1:${port}`,
    "--operator-credential",
    credential,
  ]);
  assert.equal(r.code, 1);
  assert.equal(r.stdout, "");
  assertNoUsage(r);
  const lines = r.stderr.trimEnd().split("\n");
  assert.equal(lines.length, 2, r.stderr);
  assert.equal(
    lines[0],
    `callplane: cannot reach the admin token issuer at http://127.0.0.1:${port} (connection refused) (ISSUER_UNREACHABLE)`,
  );
  assert.match(lines[1], /^hint: is the stack running\? start it with `npm start`/);
  assert.match(lines[1], /CALLPLANE_TOKEN/);
  assert.match(lines[1], /`token:` in the CLI config file/);
  assert.match(lines[1], /`callplane admin token --signing-key <file> --save`/);
});

test("init against an issuer that answers 404 says it is disabled", async (t) => {
  const url = await httpServer(t, (_req, res) => {
    res.writeHead(404, { "content-type": "text/plain" }).end("not found");
  });
  const c = cli(t);
  const credential = join(c.dir, "operator.secret");
  writeFileSync(credential, "cpo-a-credential-for-the-test\n", { mode: 0o600 });
  const env = { CALLPLANE_ISSUER_URL: url, CALLPLANE_OPERATOR_CREDENTIAL_FILE: credential };
  const r = await c.run(["init"], env);
  assert.equal(r.code, 1);
  assertNoUsage(r);
  const lines = r.stderr.trimEnd().split("\n");
  assert.equal(lines.length, 2, r.stderr);
  assert.equal(
    lines[0],
    `callplane: the admin token issuer at ${url} is disabled (it answered HTTP 404 to POST /v1/admin/keys) (ISSUER_DISABLED)`,
  );
  assert.match(lines[1], /CALLPLANE_TOKEN/);
  assert.doesNotMatch(r.stderr, /^404$/m);

  const json = await c.run(["init", "--json"], env);
  assert.equal(json.code, 1);
  assert.equal((JSON.parse(json.stdout) as { error: { code: string } }).error.code, "ISSUER_DISABLED");
});

test("URLs come from ./.callplane/stack.json; a stack without an issuer is reported as such", async (t) => {
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const c = cli(t);
  mkdirSync(join(c.dir, ".callplane"));
  const stack = {
    api: api.url,
    issuer: issuer.url,
    issuerCredentialFile: issuer.credentialFile,
    nats: "nats://127.0.0.1:4222",
    invocation: [],
    grpc: [],
    dataDir: join(c.dir, ".callplane"),
  };
  writeFileSync(join(c.dir, ".callplane", "stack.json"), JSON.stringify(stack));
  const init = await c.run(["init"]);
  assert.equal(init.code, 0, init.stderr);
  assert.match(init.stdout, new RegExp(`from:\\s+the admin token issuer at ${issuer.url}`));
  const list = await c.run(["function", "list"]);
  assert.equal(list.code, 0, list.stderr);

  // the data folder can be elsewhere
  const other = join(c.dir, "data");
  mkdirSync(other);
  const { issuer: _issuer, issuerCredentialFile: _file, ...noIssuer } = stack;
  writeFileSync(join(other, "stack.json"), JSON.stringify({ ...noIssuer, dataDir: other }));
  const off = await c.run(["init"], { CALLPLANE__GLOBAL__DATA_DIR: other });
  assert.equal(off.code, 1);
  assert.match(
    off.stderr,
    /^callplane: the local stack in .*data runs without the admin token issuer \(adminIssuerProxy\.enabled: false\), so there is no token to fetch \(ISSUER_DISABLED\)$/m,
  );
  assertNoUsage(off);
});

test("function create, list, get and delete address functions by name", async (t) => {
  const { c } = await withApi(t);
  const create = await c.run([
    "function",
    "create",
    "--name",
    "echo",
    "--inference-url",
    "/echo",
    "--image",
    "local/echo",
    "--health-uri",
    "/health",
    "--env",
    "GREETING=hi",
    "--tag",
    "demo",
    "--description",
    "the echo example",
  ]);
  assert.equal(create.code, 0, create.stderr);
  assert.match(create.stdout, /^name:\s+echo$/m);
  assert.match(create.stdout, /^image:\s+local\/echo$/m);
  assert.match(create.stdout, /^health:\s+HTTP \/health on port 8000, expects 200 within PT10S$/m);
  assert.match(create.stdout, /^environment:\s+GREETING=hi$/m);
  assert.match(create.stderr, /callplane deploy create echo/);
  const fid = UUID.exec(/^function id:\s+(\S+)$/m.exec(create.stdout)![1])![0];

  const list = await c.run(["function", "list"]);
  assert.equal(list.code, 0, list.stderr);
  const [header, row] = list.stdout.trimEnd().split("\n");
  assert.match(header, /^NAME\s+FUNCTION ID\s+VERSION ID\s+STATUS\s+IMAGE\s+CREATED$/);
  assert.match(row, new RegExp(`^echo\\s+${fid}\\s+${UUID.source}\\s+INACTIVE\\s+local/echo\\s+\\S+$`));

  const listJson = await c.run(["function", "list", "--json"]);
  const parsed = JSON.parse(listJson.stdout) as { functions: Array<{ id: string; name: string }> };
  assert.deepEqual(
    parsed.functions.map((f) => [f.id, f.name]),
    [[fid, "echo"]],
  );

  const get = await c.run(["function", "get", "echo"]);
  assert.equal(get.code, 0, get.stderr);
  assert.match(get.stdout, new RegExp(`^function id:\\s+${fid}$`, "m"));
  assert.match(get.stdout, /^description:\s+the echo example$/m);
  const byId = await c.run(["--json", "function", "get", fid]);
  assert.equal((JSON.parse(byId.stdout) as { functions: unknown[] }).functions.length, 1);

  const dup = await c.run([
    "function",
    "create",
    "--name",
    "echo",
    "--inference-url",
    "/echo",
    "--image",
    "local/echo",
  ]);
  assert.equal(dup.code, 1);
  assert.match(
    dup.stderr,
    /^callplane: Function name already in use: a function named "echo" exists.* \(FUNCTION_NAME_TAKEN\)$/m,
  );

  const del = await c.run(["function", "delete", "echo"]);
  assert.equal(del.code, 0, del.stderr);
  assert.match(del.stdout, new RegExp(`^deleted version ${UUID.source} of function echo$`, "m"));
  const gone = await c.run(["function", "get", "echo"]);
  assert.equal(gone.code, 1);
  assert.match(gone.stderr, /^callplane: no function named "echo" \(FUNCTION_NOT_FOUND\)$/m);
  assertNoUsage(gone);
});

test("function create says which required flags are missing, and reads --file", async (t) => {
  const { c } = await withApi(t);
  const missing = await c.run(["function", "create", "--name", "x"]);
  assert.equal(missing.code, 2);
  assert.match(missing.stderr, /^callplane: function create needs --inference-url, --image \(USAGE\)$/m);
  const file = join(c.dir, "fn.json");
  writeFileSync(file, JSON.stringify(sampleFunction("from-file")));
  const r = await c.run(["function", "create", "--file", file, "--inference-port", "9000"]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^name:\s+from-file$/m);
  assert.match(r.stdout, /^inference port:\s+9000$/m);
  const bad = await c.run([
    "function",
    "create",
    "--name",
    "bad name",
    "--inference-url",
    "/x",
    "--image",
    "i",
  ]);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /\(VALIDATION_FAILED\)$/m);
  assert.match(bad.stderr, /name: must start with a letter or digit/);
});

test("deploy create, get and delete; a deployed version cannot be deleted", async (t) => {
  const { api, c } = await withApi(t);
  const create = await c.run([
    "function",
    "create",
    "--name",
    "echo",
    "--inference-url",
    "/echo",
    "--image",
    "local/echo",
  ]);
  assert.equal(create.code, 0, create.stderr);

  const dep = await c.run(["deploy", "create", "echo", "--min", "1", "--max", "2", "--concurrency", "4"]);
  assert.equal(dep.code, 0, dep.stderr);
  assert.match(dep.stdout, /^status:\s+DEPLOYING$/m);
  assert.match(dep.stdout, /^spec:\s+gpu local, instance type local\.cpu, 1 to 2 instances, concurrency 4$/m);
  assert.match(dep.stdout, /^instances: none yet$/m);

  const again = await c.run(["deploy", "create", "echo"]);
  assert.equal(again.code, 1);
  assert.match(again.stderr, /\(DEPLOYMENT_EXISTS\)$/m);

  const refused = await c.run(["function", "delete", "echo"]);
  assert.equal(refused.code, 1);
  assertNoUsage(refused);
  assert.match(
    refused.stderr,
    /^callplane: Function version is deployed: version .* is deployed; undeploy it first.* \(VERSION_DEPLOYED\)$/m,
  );
  assert.match(refused.stderr, /^hint: undeploy it first with `callplane deploy delete echo --version /m);

  // the compute agent reports an instance; deploy get shows it
  const fn = JSON.parse((await c.run(["function", "get", "echo", "--json"])).stdout) as {
    functions: Array<{ id: string; versionId: string }>;
  };
  const { id, versionId } = fn.functions[0];
  const d = JSON.parse((await c.run(["deploy", "get", "echo", "--json"])).stdout) as {
    deployment: { deploymentId: string };
  };
  const now = new Date().toISOString();
  const report = await call(`${api.url}/v1/internal/instances`, {
    method: "PUT",
    token: api.serviceToken("compute"),
    body: {
      reporter: "test",
      instances: [
        {
          instanceId: "local-1",
          deploymentId: d.deployment.deploymentId,
          functionId: id,
          versionId,
          status: "ACTIVE",
          instanceType: "local.cpu",
          gpu: "local",
          backend: "local",
          location: "127.0.3.1",
          createdAt: now,
          updatedAt: now,
        },
      ],
    },
  });
  assert.equal(report.status, 204, report.text);
  const get = await c.run(["deploy", "get", "echo"]);
  assert.equal(get.code, 0, get.stderr);
  assert.match(get.stdout, /^status:\s+ACTIVE$/m);
  assert.match(get.stdout, /^INSTANCE ID\s+STATUS\s+TYPE\s+GPU\s+LOCATION\s+UPDATED\s+MESSAGE$/m);
  assert.match(get.stdout, /^local-1\s+ACTIVE\s+local\.cpu\s+local\s+127\.0\.3\.1\s+\S+$/m);

  const del = await c.run(["deploy", "delete", "echo", "--json"]);
  assert.equal(del.code, 0, del.stderr);
  assert.equal(
    (JSON.parse(del.stdout) as { deployment: { functionStatus: string } }).deployment.functionStatus,
    "INACTIVE",
  );
  const notDeployed = await c.run(["deploy", "get", "echo"]);
  assert.equal(notDeployed.code, 1);
  assert.match(notDeployed.stderr, /\(DEPLOYMENT_NOT_FOUND\)$/m);
  const fnDel = await c.run(["function", "delete", "echo"]);
  assert.equal(fnDel.code, 0, fnDel.stderr);
});

test("a function with several versions needs --version, and the message lists them", async (t) => {
  const { api, c } = await withApi(t);
  const token = await api.adminToken();
  const first = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
    token,
    body: sampleFunction("multi"),
  });
  const second = await call<{ function: { versionId: string } }>(
    `${api.url}/v2/nvcf/functions/${first.body.function.id}/versions`,
    { token, body: sampleFunction("multi") },
  );
  const r = await c.run(["deploy", "create", "multi"]);
  assert.equal(r.code, 2);
  assertNoUsage(r);
  assert.match(
    r.stderr,
    /^callplane: function "multi" has 2 versions; choose one with --version <versionId>: /m,
  );
  assert.ok(r.stderr.includes(first.body.function.versionId));
  assert.ok(r.stderr.includes(second.body.function.versionId));
  const ok = await c.run(["deploy", "create", "multi", "--version", second.body.function.versionId]);
  assert.equal(ok.code, 0, ok.stderr);
  assert.match(ok.stdout, new RegExp(`^version id:\\s+${second.body.function.versionId}$`, "m"));
  // deleting every version: the deployed one is refused before any other is deleted
  const del = await c.run(["function", "delete", "multi"]);
  assert.equal(del.code, 1);
  assert.match(del.stderr, /\(VERSION_DEPLOYED\)$/m);
  const still = JSON.parse((await c.run(["--json", "function", "get", "multi"])).stdout) as {
    functions: unknown[];
  };
  assert.equal(still.functions.length, 2);
});

test("key create shows the value once; key list and key revoke", async (t) => {
  const { c } = await withApi(t);
  const create = await c.run([
    "key",
    "create",
    "--description",
    "ci",
    "--scopes",
    "invoke_function,list_functions",
    "--expires-in",
    "24h",
  ]);
  assert.equal(create.code, 0, create.stderr);
  assert.match(create.stdout, /^value:\s+nvapi-\S+$/m);
  assert.match(create.stdout, /^scopes:\s+invoke_function, list_functions$/m);
  assert.match(create.stdout, /^expires:\s+\S+ \(in (23h 59m|1d 0h)\)$/m);
  assert.match(create.stderr, /shown only once/);
  const keyId = /^key id:\s+(\S+)$/m.exec(create.stdout)![1];
  const value = /^value:\s+(\S+)$/m.exec(create.stdout)![1];

  const list = await c.run(["key", "list"]);
  assert.equal(list.code, 0, list.stderr);
  assert.match(list.stdout, /^KEY ID\s+STATUS\s+EXPIRES\s+SCOPES\s+DESCRIPTION$/m);
  assert.match(
    list.stdout,
    new RegExp(`^${keyId}\\s+ACTIVE\\s+\\S+\\s+invoke_function,list_functions\\s+ci$`, "m"),
  );
  assert.ok(!list.stdout.includes(value), "key list never shows a key's value");

  const json = await c.run(["key", "create", "--json"]);
  assert.equal(json.code, 0, json.stderr);
  const k = JSON.parse(json.stdout) as { id: string; value: string };
  assert.match(k.value, /^nvapi-/);

  const revoke = await c.run(["key", "revoke", keyId]);
  assert.equal(revoke.code, 0, revoke.stderr);
  assert.match(revoke.stdout, new RegExp(`^revoked API key ${keyId}$`, "m"));
  assert.match(revoke.stdout, /^status:\s+REVOKED$/m);
  const after = JSON.parse((await c.run(["key", "list", "--json"])).stdout) as {
    keys: Array<{ id: string; status: string }>;
  };
  assert.deepEqual(after.keys.map((x) => x.status).sort(), ["ACTIVE", "REVOKED"]);

  const unknown = await c.run(["key", "revoke", "00000000-0000-4000-8000-000000000000"]);
  assert.equal(unknown.code, 1);
  assert.match(
    unknown.stderr,
    /^callplane: API key not found: no API key with id 00000000-0000-4000-8000-000000000000 in account \S+ \(KEY_NOT_FOUND\)$/m,
  );
});

test("CALLPLANE_TOKEN takes precedence over the state file, and an expired one says what to do", async (t) => {
  const api = await startApi(t);
  const c = cli(t, { CALLPLANE_API_URL: api.url });
  const saved = await c.run(["admin", "token", "--signing-key", api.privateKeyFile, "--save"]);
  assert.equal(saved.code, 0, saved.stderr);
  assert.match(saved.stdout, /^saved an admin token in /m);
  assert.equal((await c.run(["function", "list"])).code, 0);

  const expired = await api.adminToken({ ttlSeconds: -60 });
  const r = await c.run(["function", "list"], { CALLPLANE_TOKEN: expired });
  assert.equal(r.code, 1);
  assertNoUsage(r);
  assert.match(r.stderr, /^callplane: Token expired: .* \(TOKEN_EXPIRED\)$/m);
  assert.match(
    r.stderr,
    /^hint: the admin token from CALLPLANE_TOKEN has expired; set CALLPLANE_TOKEN to a fresh token/m,
  );

  const status = await c.run(["status"], { CALLPLANE_TOKEN: expired });
  assert.match(status.stdout, /^token:\s+admin token from CALLPLANE_TOKEN, EXPIRED /m);
  const statusJson = JSON.parse((await c.run(["status", "--json"], { CALLPLANE_TOKEN: expired })).stdout) as {
    token: { from: string; expired: boolean };
  };
  assert.deepEqual([statusJson.token.from, statusJson.token.expired], ["CALLPLANE_TOKEN", true]);

  // and the other way round: a good CALLPLANE_TOKEN wins over a state file holding an expired one
  const c2 = cli(t, { CALLPLANE_API_URL: api.url });
  mkdirSync(join(c2.dir, "state"));
  writeFileSync(c2.stateFile, JSON.stringify({ token: { value: expired } }));
  assert.equal((await c2.run(["function", "list"])).code, 1);
  const ok = await c2.run(["function", "list"], { CALLPLANE_TOKEN: await api.adminToken() });
  assert.equal(ok.code, 0, ok.stderr);
  const stateExpired = await c2.run(["function", "list"]);
  assert.match(
    stateExpired.stderr,
    /^hint: the admin token from the state file .* has expired; run `callplane init` to get a new admin token$/m,
  );
});

test("bad flag values are usage errors that name the flag (exit 2, no usage text)", async (t) => {
  const { c } = await withApi(t);
  const cases: Array<[string[], RegExp]> = [
    [
      ["deploy", "create", "echo", "--min", "abc"],
      /^callplane: option '--min <count>' argument 'abc' is invalid\. Use a whole number from 0 to 1000\. \(USAGE\)$/m,
    ],
    [
      ["deploy", "create", "echo", "--min", "3", "--max", "1"],
      /^callplane: --min 3 is larger than --max 1 \(USAGE\)$/m,
    ],
    [["deploy", "create", "echo", "--concurrency", "0"], /'--concurrency <n>' argument '0' is invalid/],
    [
      ["function", "create", "--name", "x", "--inference-url", "echo", "--image", "i"],
      /'--inference-url <path>' argument 'echo' is invalid\. Use a path beginning with \//,
    ],
    [
      ["function", "create", "--name", "x", "--inference-url", "/x", "--image", "i", "--env", "NOEQUALS"],
      /--env "NOEQUALS" is not KEY=VALUE/,
    ],
    [["key", "create", "--expires-in", "soon"], /'--expires-in <duration>' argument 'soon' is invalid/],
    [["key", "create", "--scopes", "fly"], /Unknown scope fly; the scopes are: /],
    [
      ["function", "list", "--api", "not a url"],
      /^callplane: --api is "not a url", which is not an http:\/\/ or https:\/\/ URL \(USAGE\)$/m,
    ],
    [["function", "get"], /^callplane: missing required argument 'function' \(USAGE\)$/m],
    [["function", "lst"], /^callplane: unknown command 'lst' \(USAGE\)$/m],
  ];
  for (const [args, expected] of cases) {
    const r = await c.run(args);
    assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
    assert.match(r.stderr, expected);
    assert.equal(r.stdout, "");
    assertNoUsage(r);
  }
  const json = await c.run(["--json", "deploy", "create", "echo", "--min", "x"]);
  assert.equal(json.code, 2);
  assert.deepEqual(JSON.parse(json.stdout), {
    error: {
      code: "USAGE",
      message: "option '--min <count>' argument 'x' is invalid. Use a whole number from 0 to 1000.",
    },
  });
});

test("admin token mints a token offline from the signing key", async (t) => {
  const api = await startApi(t);
  const c = cli(t, { CALLPLANE_API_URL: api.url });
  const r = await c.run(["admin", "token", "--signing-key", api.privateKeyFile, "--ttl", "600"]);
  assert.equal(r.code, 0, r.stderr);
  const token = r.stdout.trim();
  assert.equal(token.split(".").length, 3);
  assert.match(r.stderr, /expires at \S+ \(in (9|10)m\)/);
  const list = await c.run(["function", "list"], { CALLPLANE_TOKEN: token });
  assert.equal(list.code, 0, list.stderr);

  const missing = await c.run(["admin", "token"]);
  assert.equal(missing.code, 1);
  assert.match(
    missing.stderr,
    /^callplane: cannot read the admin signing key .*\.callplane\/keys\/admin-signing\.key\.pem: no such file \(SIGNING_KEY_MISSING\)$/m,
  );
  assertNoUsage(missing);
});

test("the CLI config file supplies the token and URLs; unknown keys are named", async (t) => {
  const api = await startApi(t);
  const c = cli(t);
  const file = join(c.dir, "cli.yaml");
  writeFileSync(file, `apiUrl: ${api.url}\ntoken: ${await api.adminToken()}\n`);
  const r = await c.run(["--config", file, "function", "list"]);
  assert.equal(r.code, 0, r.stderr);
  const viaEnv = await c.run(["function", "list"], { CALLPLANE_CLI_CONFIG: file });
  assert.equal(viaEnv.code, 0, viaEnv.stderr);
  // ~/.config/callplane/config.yaml is read when it exists
  mkdirSync(join(c.dir, ".config", "callplane"), { recursive: true });
  writeFileSync(join(c.dir, ".config", "callplane", "config.yaml"), readFileSync(file));
  assert.equal((await c.run(["function", "list"])).code, 0);

  writeFileSync(file, `apiUrl: ${api.url}\ntokn: abc\n`);
  const bad = await c.run(["--config", file, "function", "list"]);
  assert.equal(bad.code, 1);
  assert.match(
    bad.stderr,
    /^callplane: the CLI config file .*cli\.yaml is invalid: unknown key "tokn" \(CONFIG_INVALID\)$/m,
  );
  assert.match(
    bad.stderr,
    /^hint: the keys it may hold are token, apiUrl, issuerUrl, invocationUrl, grpcUrl, apiKey$/m,
  );
});

test("status shows each service, the token's source and expiry, never the token", async (t) => {
  const api = await startApi(t);
  const port = await closedPort();
  const token = await api.adminToken();
  const c = cli(t, {
    CALLPLANE_API_URL: api.url,
    CALLPLANE_ISSUER_URL: `http://127.0.0.1:${port}`,
    CALLPLANE_TOKEN: token,
  });
  const r = await c.run(["status"]);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, new RegExp(`^api:\\s+${api.url}  ok  \\(from CALLPLANE_API_URL\\)$`, "m"));
  assert.match(
    r.stdout,
    new RegExp(
      `^issuer:\\s+http://127.0.0.1:${port}  unreachable: connection refused  \\(from CALLPLANE_ISSUER_URL\\)$`,
      "m",
    ),
  );
  assert.match(r.stdout, /^token:\s+admin token from CALLPLANE_TOKEN, expires \S+ \(in 1[12]h \d+m\)$/m);
  assert.ok(!r.stdout.includes(token));
  const json = JSON.parse((await c.run(["status", "--json"])).stdout) as {
    services: Array<{ name: string; state: string }>;
  };
  assert.deepEqual(
    json.services.map((s) => [s.name, s.state]),
    [
      ["api", "ok"],
      ["issuer", "unreachable"],
      ["invocation", "not configured"],
    ],
  );
  const down = await c.run(["status"], { CALLPLANE_API_URL: `http://127.0.0.1:${port}` });
  assert.equal(down.code, 1);
  assert.match(down.stdout, /^api:\s+\S+ {2}unreachable: connection refused/m);
});

test("commands against a stopped API say so and suggest starting the stack", async (t) => {
  const port = await closedPort();
  const c = cli(t, { CALLPLANE_API_URL: `http://127.0.0.1:${port}`, CALLPLANE_TOKEN: "x.y.z" });
  const r = await c.run(["function", "list"]);
  assert.equal(r.code, 1);
  assert.equal(
    r.stderr,
    `callplane: cannot reach the API at http://127.0.0.1:${port} (connection refused) (API_UNREACHABLE)\nhint: is the stack running? start it with \`npm start\`\n`,
  );
});

test("invoke streams the answer, polls through 202s with progress, and reports problems", async (t) => {
  // The invocation service is built separately; this stands in for its client-facing contract
  // (contract §2): 202 + NVCF-REQID, then GET /v2/nvcf/pexec/status/{id} until the final answer.
  const fid = "3f0c7a52-51e3-4b3a-9a43-3c1c2e7d9a10";
  const seen: Array<{ method: string; url: string; auth: string | undefined; body: string; poll?: string }> =
    [];
  let polls = 0;
  const url = await httpServer(t, (req, res) => {
    let body = "";
    req.on("data", (d: Buffer) => (body += d.toString()));
    req.on("end", () => {
      seen.push({
        method: req.method!,
        url: req.url!,
        auth: req.headers.authorization,
        body,
        poll: req.headers["nvcf-poll-seconds"] as string | undefined,
      });
      if (req.url === `/v2/nvcf/pexec/functions/${fid}`) {
        res
          .writeHead(202, {
            "nvcf-reqid": "req-1",
            "nvcf-status": "in-progress",
            "nvcf-percent-complete": "50",
          })
          .end();
      } else if (req.url === "/v2/nvcf/pexec/status/req-1") {
        polls++;
        if (polls === 1) res.writeHead(202, { "nvcf-reqid": "req-1", "nvcf-percent-complete": "75" }).end();
        else
          res
            .writeHead(200, { "content-type": "application/json", "nvcf-reqid": "req-1" })
            .end(`{"echo":${body || '"done"'}}`);
      } else {
        res.writeHead(404, { "content-type": "application/problem+json", "nvcf-reqid": "req-2" }).end(
          JSON.stringify({
            title: "Function has no deployed version",
            detail: "function x has no deployed version",
            status: 404,
            code: "FUNCTION_NOT_DEPLOYED",
          }),
        );
      }
    });
  });
  const c = cli(t, { CALLPLANE_INVOCATION_URL: url });
  const r = await c.run([
    "invoke",
    fid,
    "--api-key",
    "nvapi-test",
    "--data",
    '{"message":"hi"}',
    "--poll-seconds",
    "5",
  ]);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, '{"echo":"done"}');
  const progress = r.stderr.trimEnd().split("\n");
  assert.equal(progress.length, 2, r.stderr);
  assert.match(progress[0], /^callplane: request req-1 in progress, 50% complete, \d+s elapsed$/);
  assert.match(progress[1], /^callplane: request req-1 in progress, 75% complete, \d+s elapsed$/);
  assert.deepEqual(
    seen.map((s) => [s.method, s.url, s.auth, s.poll]),
    [
      ["POST", `/v2/nvcf/pexec/functions/${fid}`, "Bearer nvapi-test", "5"],
      ["GET", "/v2/nvcf/pexec/status/req-1", "Bearer nvapi-test", "5"],
      ["GET", "/v2/nvcf/pexec/status/req-1", "Bearer nvapi-test", "5"],
    ],
  );
  assert.equal(seen[0].body, '{"message":"hi"}');

  // the body from a file, the key from the environment, JSON output
  const file = join(c.dir, "body.json");
  writeFileSync(file, '{"from":"file"}');
  polls = 1;
  const json = await c.run(["--json", "invoke", fid, "--data", `@${file}`], {
    CALLPLANE_API_KEY: "nvapi-env",
  });
  assert.equal(json.code, 0, json.stderr);
  assert.deepEqual(JSON.parse(json.stdout), {
    status: 200,
    requestId: "req-1",
    contentType: "application/json",
    body: { echo: "done" },
  });
  assert.equal(seen.at(-2)!.body, '{"from":"file"}');
  assert.equal(seen.at(-2)!.auth, "Bearer nvapi-env");

  const other = "0d6f1d8e-8a55-4d4e-b7a9-54c3f3d1e2aa";
  const failed = await c.run(["invoke", other, "--api-key", "k"]);
  assert.equal(failed.code, 1);
  assert.equal(failed.stdout, "");
  assertNoUsage(failed);
  assert.match(
    failed.stderr,
    /^callplane: Function has no deployed version: function x has no deployed version \(FUNCTION_NOT_DEPLOYED\)$/m,
  );
  assert.match(failed.stderr, /^hint: deploy it with `callplane deploy create 0d6f.*; request id req-2$/m);

  const noKey = await c.run(["invoke", fid]);
  assert.equal(noKey.code, 1);
  assert.match(noKey.stderr, /^callplane: no API key to invoke with \(NO_API_KEY\)$/m);
  const byName = await c.run(["invoke", "echo", "--api-key", "k"]);
  assert.equal(byName.code, 2);
  assert.match(
    byName.stderr,
    /"echo" is not a function id, and there is no admin token to look the name up with/,
  );

  // a local stack's stack.json supplies the URL, the demo key, and the demo function's name
  mkdirSync(join(c.dir, ".callplane"));
  const stack = {
    api: "http://127.0.0.1:1",
    invocation: [url],
    grpc: [],
    dataDir: join(c.dir, ".callplane"),
    demo: { apiKey: "nvapi-demo", httpFunctionId: fid, httpFunctionName: "echo-demo" },
  };
  writeFileSync(join(c.dir, ".callplane", "stack.json"), JSON.stringify(stack));
  polls = 1;
  const demo = await c.run(["invoke", "echo-demo"], { CALLPLANE_INVOCATION_URL: undefined });
  assert.equal(demo.code, 0, demo.stderr);
  assert.equal(demo.stdout, '{"echo":"done"}');
  assert.equal(seen.at(-2)!.auth, "Bearer nvapi-demo");
});

test("invoke resolves a function name with the admin token", async (t) => {
  const { api, c } = await withApi(t);
  const created = await call<{ function: { id: string } }>(`${api.url}/v2/nvcf/functions`, {
    token: await api.adminToken(),
    body: sampleFunction("named"),
  });
  const paths: string[] = [];
  const url = await httpServer(t, (req, res) => {
    paths.push(req.url!);
    res.writeHead(200, { "content-type": "text/plain" }).end("ok\n");
  });
  const r = await c.run(["invoke", "named", "--api-key", "k", "--invocation-url", url]);
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout, "ok\n");
  assert.deepEqual(paths, [`/v2/nvcf/pexec/functions/${created.body.function.id}`]);
});
