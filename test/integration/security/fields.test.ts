// Issue 19, input hygiene of stored text: names, descriptions, tags and the other text fields of
// functions, keys and deployments refuse control and bidirectional-formatting characters (NUL, ESC,
// U+202E, the bidi isolates, C1 controls, lone surrogates) with VALIDATION_FAILED naming the field,
// while ordinary Unicode is text like any other; the CLI prints what a server sends with such
// characters escaped; a token claim naming an Object.prototype member is just an unknown value.
//
// The hostile requests are the `api-fields` section of test/corpus/hostile-requests.json; in them
// `{adminToken}` stands for an admin token and `{functionId}`/`{versionId}` for a function the test
// creates first.
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { SignJWT, importPKCS8 } from "jose";
import {
  call,
  repoRoot,
  runCli,
  sampleFunction,
  startApi,
  tmpDir,
  type ApiFixture,
} from "../../testkit/index.js";

interface Entry {
  name: string;
  finding: string;
  request: { method: string; path: string; headers: Record<string, string>; body?: unknown };
  expect: { status: number; code: string; field?: string };
}

interface Problem {
  status: number;
  code: string;
  detail: string;
  errors?: Array<{ field: string; message: string }>;
}

const corpus = JSON.parse(
  readFileSync(join(repoRoot, "test", "corpus", "hostile-requests.json"), "utf8"),
) as {
  "api-fields": Entry[];
};

/** A character that must never reach a terminal raw (C0 but newline, DEL, C1, bidi, lone surrogates). */
const RAW =
  // eslint-disable-next-line no-control-regex -- finding control characters is the point
  /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]|[\ud800-\udfff]/u;
const HOSTILE = "evil\u001b[2J\u001b]0;pwned\u0007 txt.\u202eexe \u2066x\u2069 \u009b31m \u0000end";
const PLAIN = "café 東京 😀 naïve Ελληνικά";

/** The CLI run in an empty folder with its own HOME and state, pointed at `apiUrl`. */
function cli(t: TestContext, apiUrl: string, token: string) {
  const dir = tmpDir(t, "callplane-fields-");
  const env: NodeJS.ProcessEnv = {
    CALLPLANE_TOKEN: token,
    CALLPLANE_API_URL: apiUrl,
    CALLPLANE_ISSUER_URL: undefined,
    CALLPLANE_INVOCATION_URL: undefined,
    CALLPLANE_API_KEY: undefined,
    CALLPLANE_CLI_CONFIG: undefined,
    CALLPLANE__GLOBAL__DATA_DIR: undefined,
    HOME: dir,
    CALLPLANE_STATE_DIR: join(dir, "state"),
  };
  return (args: string[]) => runCli(args, { cwd: dir, env });
}

function assertNoRaw(out: { stdout: string; stderr: string }, what: string): void {
  assert.doesNotMatch(out.stdout, RAW, `${what}: stdout ${JSON.stringify(out.stdout)}`);
  assert.doesNotMatch(out.stderr, RAW, `${what}: stderr ${JSON.stringify(out.stderr)}`);
}

async function withFunction(
  t: TestContext,
): Promise<{ api: ApiFixture; token: string; fid: string; vid: string }> {
  const api = await startApi(t);
  const token = await api.adminToken();
  const r = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
    token,
    body: sampleFunction("fields-base"),
  });
  assert.equal(r.status, 200, r.text);
  return { api, token, fid: r.body.function.id, vid: r.body.function.versionId };
}

void test("api-fields corpus: every hostile text field is refused with VALIDATION_FAILED naming the field, and nothing is stored", async (t) => {
  const { api, token, fid, vid } = await withFunction(t);
  const fill = (s: string) =>
    s.replaceAll("{adminToken}", token).replaceAll("{functionId}", fid).replaceAll("{versionId}", vid);
  const entries = corpus["api-fields"];
  assert.ok(entries.length >= 20, "the section holds the hostile requests");
  for (const e of entries) {
    const headers = Object.fromEntries(Object.entries(e.request.headers).map(([k, v]) => [k, fill(v)]));
    const res = await fetch(`${api.url}${fill(e.request.path)}`, {
      method: e.request.method,
      headers,
      ...(e.request.body === undefined ? {} : { body: JSON.stringify(e.request.body) }),
    });
    const text = await res.text();
    assert.equal(res.status, e.expect.status, `${e.name}: ${text}`);
    const p = JSON.parse(text) as Problem;
    assert.equal(p.code, e.expect.code, `${e.name}: ${text}`);
    assert.doesNotMatch(
      text,
      /\\u0000|\\u001b|\\u202e/i,
      `${e.name}: the answer does not echo the character`,
    );
    if (e.expect.field === undefined) continue;
    const named = p.errors?.find((x) => x.field === e.expect.field);
    assert.ok(named, `${e.name}: the errors name ${e.expect.field}: ${text}`);
    assert.ok(p.detail.includes(`${e.expect.field}: `), `${e.name}: ${p.detail}`);
    // names keep their own rule (letters, digits, _ and -); every other field says which character
    if (e.expect.field !== "name")
      assert.match(
        named.message,
        /^must not contain control or bidirectional-formatting characters \(U\+[0-9A-F]{4} at position \d+\)$/,
        `${e.name}: ${named.message}`,
      );
  }
  const rlo = entries.find(
    (e) => e.name === "function create: U+202E (right-to-left override) in the description",
  )!;
  const res = await call<Problem>(`${api.url}${rlo.request.path}`, { token, body: rlo.request.body });
  assert.equal(
    res.body.detail,
    "description: must not contain control or bidirectional-formatting characters (U+202E at position 5)",
  );
  const list = await call<{ functions: Array<{ name: string; description?: string; tags: string[] }> }>(
    `${api.url}/v2/nvcf/functions`,
    { token },
  );
  assert.deepEqual(
    list.body.functions.map((f) => f.name),
    ["fields-base"],
    "no hostile function was stored",
  );
  assert.equal(list.body.functions[0].description, undefined, "the refused update changed nothing");
  const keys = await call<{ keys: Array<{ description: string }> }>(`${api.url}/v1/keys`, { token });
  assert.equal(keys.body.keys.length, 0, "no hostile key was stored");
});

void test("ordinary Unicode (accents, CJK, emoji, Greek) is accepted and kept as sent in descriptions, tags and updates", async (t) => {
  const { api, token, fid, vid } = await withFunction(t);
  const created = await call<{ function: { description: string; tags: string[] } }>(
    `${api.url}/v2/nvcf/functions`,
    {
      token,
      body: sampleFunction("fields-unicode", { description: PLAIN, tags: ["東京", "😀", "naïve"] }),
    },
  );
  assert.equal(created.status, 200, created.text);
  assert.equal(created.body.function.description, PLAIN);
  assert.deepEqual(created.body.function.tags, ["東京", "😀", "naïve"]);
  const updated = await call<{ function: { description: string } }>(
    `${api.url}/v2/nvcf/functions/${fid}/versions/${vid}`,
    { method: "PUT", token, body: { description: `${PLAIN} v2`, tags: ["Ελληνικά"] } },
  );
  assert.equal(updated.status, 200, updated.text);
  assert.equal(updated.body.function.description, `${PLAIN} v2`);
  const key = await call<{ description: string }>(`${api.url}/v1/keys`, {
    token,
    body: { description: PLAIN },
  });
  assert.equal(key.status, 200, key.text);
  assert.equal(key.body.description, PLAIN);
});

void test("the CLI escapes control and bidi characters of text stored before the rule (a key description in the database)", async (t) => {
  const api = await startApi(t);
  const token = await api.adminToken();
  const key = await call<{ id: string }>(`${api.url}/v1/keys`, { token, body: { description: "old" } });
  assert.equal(key.status, 200, key.text);
  // what an older version stored: the API no longer accepts it, the database still holds it
  api.db.prepare("UPDATE api_keys SET description = ? WHERE key_id = ?").run(HOSTILE, key.body.id);
  const run = cli(t, api.url, token);
  const table = await run(["key", "list"]);
  assert.equal(table.code, 0, table.stderr);
  assertNoRaw(table, "key list");
  assert.ok(
    table.stdout.includes("evil\\x1b[2J\\x1b]0;pwned\\x07 txt.\\u202eexe \\u2066x\\u2069 \\x9b31m \\0end"),
    table.stdout,
  );
  const json = await run(["--json", "key", "list"]);
  assert.equal(json.code, 0, json.stderr);
  assertNoRaw(json, "key list --json");
  const parsed = JSON.parse(json.stdout) as { keys: Array<{ description: string }> };
  assert.equal(parsed.keys[0].description, HOSTILE, "--json still gives a script the exact value");
});

void test("the CLI against a hostile server: names, descriptions, tags, arguments and error details are printed escaped", async (t) => {
  const fn = {
    id: "7d1f7f7c-0000-4000-8000-000000000001",
    versionId: "7d1f7f7c-0000-4000-8000-000000000002",
    name: "hostile",
    status: `ACTIVE${HOSTILE}`,
    inferenceUrl: "/echo",
    inferencePort: 8000,
    containerImage: `local/echo${HOSTILE}`,
    containerArgs: `-c ${HOSTILE}`,
    containerEnvironment: [{ key: "X", value: HOSTILE }],
    tags: [HOSTILE, "ok"],
    description: HOSTILE,
    createdAt: "2026-01-01T00:00:00Z",
    activeInstances: [],
  };
  const server = createServer((req, res) => {
    if (req.method === "GET" && req.url === "/v2/nvcf/functions") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ functions: [fn] }));
      return;
    }
    res.writeHead(400, { "content-type": "application/problem+json" });
    res.end(
      JSON.stringify({
        type: "urn:callplane:problem:validation-failed",
        title: `Invalid${HOSTILE}`,
        status: 400,
        detail: `refused ${HOSTILE}`,
        code: "VALIDATION_FAILED",
      }),
    );
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const run = cli(t, `http://127.0.0.1:${(server.address() as AddressInfo).port}`, "x.y.z");
  const runs = new Map<string, Awaited<ReturnType<typeof run>>>();
  for (const args of [
    ["function", "list"],
    ["function", "get", "hostile"],
    ["--json", "function", "list"],
    ["key", "create", "--description", "x"],
    ["--json", "key", "create", "--description", "x"],
  ]) {
    const out = await run(args);
    assertNoRaw(out, args.join(" "));
    assert.match(out.stdout + out.stderr, /\\u202e/i, `${args.join(" ")} shows the character as an escape`);
    runs.set(args.join(" "), out);
  }
  const get = runs.get("function get hostile")!;
  assert.equal(get.code, 0, get.stderr);
  assert.match(get.stdout, /^description: +evil\\x1b\[2J/m);
  assert.match(get.stdout, /^args: +-c evil\\x1b/m);
  const refused = runs.get("key create --description x")!;
  assert.equal(refused.code, 1);
  assert.match(refused.stderr, /^callplane: Invalid.*refused evil\\x1b\[2J.*\(VALIDATION_FAILED\)$/m);
});

void test("an admin token whose iss names an Object.prototype member is TOKEN_INVALID through the API, never a 500 or a function's text", async (t) => {
  const api = await startApi(t);
  const own = generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey.export({
    type: "pkcs8",
    format: "pem",
  });
  for (const pem of [
    readFileSync(api.issuerKeyFile, "utf8"),
    readFileSync(api.privateKeyFile, "utf8"),
    String(own),
  ]) {
    const key = await importPKCS8(pem, "ES256");
    for (const iss of ["toString", "__proto__", "constructor", "hasOwnProperty"]) {
      const token = await new SignJWT({ scopes: ["list_functions"], account: "toString" })
        .setProtectedHeader({ alg: "ES256", typ: "JWT" })
        .setIssuer(iss)
        .setAudience("callplane-api")
        .setSubject("attacker")
        .setJti("j")
        .setIssuedAt()
        .setExpirationTime("1h")
        .sign(key);
      const r = await call<Problem>(`${api.url}/v2/nvcf/functions`, { token });
      assert.equal(r.status, 401, `iss ${iss}: ${r.text}`);
      assert.equal(r.body.code, "TOKEN_INVALID", `iss ${iss}: ${r.text}`);
      assert.doesNotMatch(r.text, /native code|function /, `iss ${iss}`);
    }
  }
});
