// The secret store through the API, in this process, against real SQLite and a real keyring file:
// names only on every read, the tamper corpus on stored rows (each corrupt row refused with a
// reason, the others unaffected), 1,000 concurrent encryptions, NEK rotation, the NEK cache through
// a MEK-provider outage, a keyring that turns bad, a plugin provider, and MEK rotation in one
// process (full, aborted, rolled back). Two API processes through a rotation are in
// test/secrets-rotation.test.ts; delivery to inference servers in test/secrets-delivery.test.ts.
import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { createLogger, silentLogger } from "../../../src/lib/log.js";
import {
  aad,
  createEnvMekProvider,
  createFileMekProvider,
  encodeHeader,
  gcmSeal,
  IV_BYTES,
  KEYRING_FORMAT,
  loadMekPlugin,
  type MekProvider,
  MekProviderError,
  nekContext,
  newKeyringEntry,
  parseEnvelope,
} from "../../../src/lib/secrets/index.js";
import { openSqliteSecretStorage } from "../../../src/services/api/secrets/storage.js";
import { createSecretStore } from "../../../src/services/api/secrets/store.js";
import { openSqliteStore } from "../../../src/services/api/store/sqlite.js";
import { waitFor } from "../../testkit/client.js";
import {
  call,
  repoRoot,
  sampleFunction,
  startApi,
  tmpDir,
  type ApiFixture,
  type JsonResponse,
} from "../../testkit/index.js";

interface Problem {
  code: string;
  status: number;
  detail: string;
  errors?: Array<{ field: string; message: string }>;
}

const marker = () => `plaintext-marker-${randomBytes(6).toString("hex")}`;

function problem(r: JsonResponse<unknown>, status: number, code: string): Problem {
  assert.equal(r.status, status, r.text);
  assert.match(r.headers.get("content-type") ?? "", /^application\/problem\+json/);
  const p = r.body as Problem;
  assert.equal(p.code, code, r.text);
  assert.ok(p.detail.length > 10, "the detail says what was wrong");
  return p;
}

async function newFunction(
  api: ApiFixture,
  admin: string,
  name: string,
  extra: Record<string, unknown> = {},
): Promise<{ fid: string; vid: string; url: string; text: string; secrets: string[] }> {
  const r = await call<{ function: { id: string; versionId: string; secrets: string[] } }>(
    `${api.url}/v2/nvcf/functions`,
    { token: admin, body: sampleFunction(name, extra) },
  );
  assert.equal(r.status, 200, r.text);
  const f = r.body.function;
  return {
    fid: f.id,
    vid: f.versionId,
    url: `${api.url}/v2/nvcf/secrets/functions/${f.id}/versions/${f.versionId}`,
    text: r.text,
    secrets: f.secrets,
  };
}

const internalValues = (api: ApiFixture, fid: string, vid: string) =>
  call<{
    revision: number;
    values: Record<string, unknown>;
    unreadable: Array<{ name: string; code: string; problem: string }>;
  }>(`${api.url}/v1/internal/secrets/functions/${fid}/versions/${vid}`, {
    token: api.serviceToken("compute"),
  });

test("secrets on create and PUT are merged by name, listed by name only, and never shown or logged", async (t) => {
  const dir = tmpDir(t);
  const logFile = join(dir, "api.log");
  const logger = createLogger("api", { destination: logFile, sync: true, level: "trace" });
  const api = await startApi(t, { logger });
  const admin = await api.adminToken();
  const [m1, m2, m3, m4] = [marker(), marker(), marker(), marker()];
  const answers: string[] = [];

  const f = await newFunction(api, admin, "with-secrets", {
    secrets: [
      { name: "API_TOKEN", value: m1 },
      { name: "testing.site.com", value: { AWS_REGION: "us-west-2", key: m2 } },
    ],
  });
  answers.push(f.text);
  assert.deepEqual(f.secrets, ["API_TOKEN", "testing.site.com"]);

  const put = await call(f.url, {
    method: "PUT",
    token: admin,
    body: {
      secrets: [
        { name: "API_TOKEN", value: m3 },
        { name: "OTHER", value: m4 },
      ],
    },
  });
  assert.equal(put.status, 204, put.text);
  assert.equal(put.text, "");

  const one = await call<{ function: { secrets: string[] } }>(
    `${api.url}/v2/nvcf/functions/${f.fid}/versions/${f.vid}`,
    { token: admin },
  );
  answers.push(one.text);
  assert.deepEqual(one.body.function.secrets, ["API_TOKEN", "OTHER", "testing.site.com"]);
  const all = await call(`${api.url}/v2/nvcf/functions`, { token: admin });
  answers.push(all.text);
  assert.match(all.text, /"secrets":\["API_TOKEN","OTHER","testing.site.com"\]/);

  const listed = await call<{ secrets: Array<{ name: string; updatedAt: string; readable?: boolean }> }>(
    `${f.url}?check=true`,
    { token: admin },
  );
  answers.push(listed.text);
  assert.equal(listed.status, 200, listed.text);
  assert.deepEqual(
    listed.body.secrets.map((s) => [s.name, s.readable]),
    [
      ["API_TOKEN", true],
      ["OTHER", true],
      ["testing.site.com", true],
    ],
  );

  // only the compute agent's service token reads values
  const values = await internalValues(api, f.fid, f.vid);
  assert.equal(values.status, 200, values.text);
  assert.deepEqual(values.body.values, {
    API_TOKEN: m3,
    OTHER: m4,
    "testing.site.com": { AWS_REGION: "us-west-2", key: m2 },
  });
  assert.equal(values.body.revision, 2, "the create and the PUT each bumped the revision");
  assert.equal(values.headers.get("cache-control"), "no-store");
  problem(
    await call(`${api.url}/v1/internal/secrets/functions/${f.fid}/versions/${f.vid}`, { token: admin }),
    403,
    "FORBIDDEN_SCOPE",
  );
  problem(
    await call(`${api.url}/v1/internal/secrets/functions/${f.fid}/versions/${f.vid}`, {
      token: api.serviceToken("invocation"),
    }),
    403,
    "FORBIDDEN_SCOPE",
  );

  const del = await call(`${f.url}/OTHER`, { method: "DELETE", token: admin });
  assert.equal(del.status, 204, del.text);
  const again = await call(`${f.url}/OTHER`, { method: "DELETE", token: admin });
  answers.push(problem(again, 404, "SECRET_NOT_FOUND").detail);
  assert.deepEqual(Object.keys((await internalValues(api, f.fid, f.vid)).body.values).sort(), [
    "API_TOKEN",
    "testing.site.com",
  ]);

  // deleting the function's last version deletes its secrets and its NEK
  const gone = await call(`${api.url}/v2/nvcf/functions/${f.fid}/versions/${f.vid}`, {
    method: "DELETE",
    token: admin,
  });
  assert.equal(gone.status, 204, gone.text);
  const rows = api.db.prepare("SELECT COUNT(*) AS n FROM secret_values").get() as { n: number };
  const neks = api.db
    .prepare("SELECT COUNT(*) AS n FROM secret_neks WHERE namespace = ?")
    .get(`function:${f.fid}`) as { n: number };
  assert.deepEqual([rows.n, neks.n], [0, 0]);

  // nowhere in plaintext: answers, the log (at trace level), metrics, the database files
  const metrics = await api.metrics();
  const db = [api.dbPath, `${api.dbPath}-wal`]
    .filter((p) => existsSync(p))
    .map((p) => readFileSync(p).toString("latin1"))
    .join("");
  const log = readFileSync(logFile, "utf8");
  assert.match(log, /secrets stored/, "the log has the secret lines, with names");
  for (const m of [m1, m2, m3, m4]) {
    for (const [where, text] of [
      ["an API answer", answers.join("\n")],
      ["the log", log],
      ["metrics", metrics],
      ["the database files", db],
    ] as const)
      assert.ok(!text.includes(m), `a value appears in ${where}`);
  }
  assert.match(metrics, /callplane_secret_encryptions_total\{what="secret"[^}]*\} [1-9]/);
});

test("bad secret input is refused by field, and no refusal quotes a value", async (t) => {
  const api = await startApi(t);
  const admin = await api.adminToken();
  const f = await newFunction(api, admin, "bad-input");
  const put = (body: unknown) => call(f.url, { method: "PUT", token: admin, body });
  const m = marker();
  const cases: Array<[string, unknown, string[]]> = [
    ["a name with a slash", { secrets: [{ name: "a/b", value: m }] }, ["secrets.0.name"]],
    ["a name of 49 characters", { secrets: [{ name: "A".repeat(49), value: m }] }, ["secrets.0.name"]],
    ["an empty value", { secrets: [{ name: "A", value: "" }] }, ["secrets.0.value"]],
    ["a blank value", { secrets: [{ name: "A", value: "   " }] }, ["secrets.0.value"]],
    [
      "a value too long",
      { secrets: [{ name: "A", value: `${m}${"x".repeat(32_769)}` }] },
      ["secrets.0.value"],
    ],
    ["an array value", { secrets: [{ name: "A", value: [m] }] }, ["secrets.0.value"]],
    ["a number value", { secrets: [{ name: "A", value: 42 }] }, ["secrets.0.value"]],
    [
      "a name twice",
      {
        secrets: [
          { name: "A", value: m },
          { name: "A", value: m },
        ],
      },
      ["secrets.1.name"],
    ],
    ["no secrets", { secrets: [] }, ["secrets"]],
    ["no field", {}, ["secrets"]],
    ["an unknown field", { secrets: [{ name: "A", value: m, kind: "x" }] }, ["secrets.0.kind"]],
  ];
  for (const [what, body, fields] of cases) {
    const r = await put(body);
    const p = problem(r, 400, "VALIDATION_FAILED");
    assert.deepEqual(
      p.errors?.map((e) => e.field),
      fields,
      `${what}: ${r.text.slice(0, 300)}`,
    );
    assert.ok(!r.text.includes(m), `${what}: the refusal quotes the value`);
  }
  // malformed JSON holding a value: the parser's message (which quotes the text) is not repeated
  const bad = await call(f.url, {
    method: "PUT",
    token: admin,
    rawBody: `{"secrets":[{"name":"A","value":"${m}"`,
    headers: { "content-type": "application/json" },
  });
  const p = problem(bad, 400, "MALFORMED_JSON");
  assert.ok(!bad.text.includes(m), p.detail);
  const badCreate = await call(`${api.url}/v2/nvcf/functions`, {
    token: admin,
    rawBody: `{"name":"x","secrets":[{"name":"A","value":"${m}"}`,
    headers: { "content-type": "application/json" },
  });
  problem(badCreate, 400, "MALFORMED_JSON");
  assert.ok(!badCreate.text.includes(m));

  // scope, unknown function or version
  const key = await call<{ value: string }>(`${api.url}/v1/keys`, { token: admin, body: {} });
  const withoutScope = await call(f.url, {
    method: "PUT",
    token: key.body.value,
    body: { secrets: [{ name: "A", value: m }] },
  });
  assert.equal(
    (problem(withoutScope, 403, "FORBIDDEN_SCOPE") as Problem & { requiredScope: string }).requiredScope,
    "update_secrets",
  );
  problem(
    await call(`${api.url}/v2/nvcf/secrets/functions/${f.fid}/versions/${f.fid}`, {
      method: "PUT",
      token: admin,
      body: { secrets: [{ name: "A", value: m }] },
    }),
    404,
    "VERSION_NOT_FOUND",
  );
  problem(
    await call(`${api.url}/v2/nvcf/secrets/functions/${f.vid}/versions/${f.vid}`, {
      method: "PUT",
      token: admin,
      body: { secrets: [{ name: "A", value: m }] },
    }),
    404,
    "FUNCTION_NOT_FOUND",
  );
  // at most 256 per version, counted with those it has
  const many = (from: number, n: number) =>
    Array.from({ length: n }, (_, i) => ({ name: `S${from + i}`, value: "v" }));
  assert.equal((await put({ secrets: many(0, 128) })).status, 204);
  assert.equal((await put({ secrets: many(128, 128) })).status, 204);
  const over = problem(await put({ secrets: many(256, 1) }), 400, "VALIDATION_FAILED");
  assert.match(over.detail, /at most 256/);
  problem(await put({ secrets: many(1000, 129) }), 400, "VALIDATION_FAILED");
  // a create with bad secrets creates nothing
  const refusedCreate = await call(`${api.url}/v2/nvcf/functions`, {
    token: admin,
    body: sampleFunction("no-such-thing", { secrets: [{ name: "-bad", value: m }] }),
  });
  problem(refusedCreate, 400, "VALIDATION_FAILED");
  assert.equal(await api.store.getFunctionByName("no-such-thing"), undefined);
});

test("tamper corpus on stored rows: each corrupt row is refused with its reason, the others stay readable", async (t) => {
  const api = await startApi(t);
  const admin = await api.adminToken();
  const good = { GOOD_1: marker(), GOOD_2: marker() };
  const victims = ["HEADER", "IV", "CIPHERTEXT", "TAG", "SHORT_TAG", "UNKNOWN_NEK", "MOVED_NAME", "MOVED_NS"];
  const f1 = await newFunction(api, admin, "tamper-one", {
    secrets: [...Object.entries(good), ...victims.map((n) => [n, marker()])].map(([name, value]) => ({
      name,
      value,
    })),
  });
  const other = marker();
  const f2 = await newFunction(api, admin, "tamper-two", { secrets: [{ name: "OTHER", value: other }] });
  const row = (vid: string, name: string) =>
    api.db
      .prepare("SELECT ciphertext, nek_id FROM secret_values WHERE version_id = ? AND name = ?")
      .get(vid, name) as {
      ciphertext: Buffer;
      nek_id: string;
    };
  const write = (name: string, ct: Buffer, nekId?: string) =>
    api.db
      .prepare(
        "UPDATE secret_values SET ciphertext = ?, nek_id = COALESCE(?, nek_id) WHERE version_id = ? AND name = ?",
      )
      .run(ct, nekId ?? null, f1.vid, name);
  const flip = (name: string, at: (ct: Buffer, header: number) => number) => {
    const ct = Buffer.from(row(f1.vid, name).ciphertext);
    const h = parseEnvelope(ct, "secret").headerBytes.length;
    ct[at(ct, h)] ^= 0x04;
    write(name, ct);
  };
  flip("HEADER", () => 2); // the format version byte
  flip("IV", (_, h) => h + 5);
  flip("CIPHERTEXT", (_, h) => h + IV_BYTES + 1);
  flip("TAG", (ct) => ct.length - 2);
  write(
    "SHORT_TAG",
    row(f1.vid, "SHORT_TAG").ciphertext.subarray(0, row(f1.vid, "SHORT_TAG").ciphertext.length - 12),
  );
  {
    // the header names a NEK that does not exist (the row's own column cannot: it is a foreign key)
    const ct = row(f1.vid, "UNKNOWN_NEK").ciphertext;
    const env = parseEnvelope(ct, "secret");
    const fake = Buffer.from(env.headerBytes);
    fake.write("nek-ffffffffffffffff", fake.length - env.header.nekId.length, "latin1");
    write("UNKNOWN_NEK", Buffer.concat([fake, env.body]));
  }
  write("MOVED_NAME", row(f1.vid, "GOOD_1").ciphertext);
  const o = row(f2.vid, "OTHER");
  write("MOVED_NS", o.ciphertext, o.nek_id);

  const expected: Record<string, RegExp> = {
    HEADER: /format version 5 is not one this callplane reads/,
    IV: /failed authentication/,
    CIPHERTEXT: /failed authentication/,
    TAG: /failed authentication/,
    SHORT_TAG: /failed authentication/,
    UNKNOWN_NEK: /header names NEK nek-ffffffffffffffff/,
    MOVED_NAME: /failed authentication: it was altered, or it belongs to another row/,
    MOVED_NS: /encrypted for another namespace/,
  };
  const listed = await call<{ secrets: Array<{ name: string; readable: boolean; problem?: string }> }>(
    `${f1.url}?check=true`,
    { token: admin },
  );
  assert.equal(listed.status, 200, listed.text);
  for (const s of listed.body.secrets) {
    if (s.name in good) assert.equal(s.readable, true, s.name);
    else {
      assert.equal(s.readable, false, s.name);
      assert.match(s.problem ?? "", /^SECRET_UNREADABLE: /, s.name);
      assert.match(s.problem ?? "", expected[s.name], s.name);
    }
  }
  const values = await internalValues(api, f1.fid, f1.vid);
  assert.equal(values.status, 200, values.text);
  assert.deepEqual(values.body.values, good, "the readable ones come through");
  assert.deepEqual(values.body.unreadable.map((u) => u.name).sort(), [...victims].sort());
  assert.ok(values.body.unreadable.every((u) => u.code === "SECRET_UNREADABLE"));
  assert.deepEqual(
    (await internalValues(api, f2.fid, f2.vid)).body.values,
    { OTHER: other },
    "the other function",
  );
  for (const text of [listed.text, values.text.replace(/"values":\{[^}]*\}/, "")])
    for (const v of victims) assert.ok(!text.includes(`"${v}":"plaintext`), "no value of a victim is shown");

  // a corrupt NEK: its function's secrets are refused, the others' are not
  api.secrets.cache.clear();
  const nek = api.db
    .prepare("SELECT nek_id, wrapped FROM secret_neks WHERE namespace = ?")
    .get(`function:${f2.fid}`) as {
    nek_id: string;
    wrapped: Buffer;
  };
  const w = Buffer.from(nek.wrapped);
  w[w.length - 1] ^= 1;
  api.db.prepare("UPDATE secret_neks SET wrapped = ? WHERE nek_id = ?").run(w, nek.nek_id);
  const broken = await internalValues(api, f2.fid, f2.vid);
  assert.deepEqual(broken.body.values, {});
  assert.match(broken.body.unreadable[0].problem, /NEK .* cannot be unwrapped/);
  assert.deepEqual((await internalValues(api, f1.fid, f1.vid)).body.values, good);
  // a NEK wrapped with a MEK the provider does not have: unavailable (503 on a write), not corrupt
  const f3 = await newFunction(api, admin, "tamper-three", { secrets: [{ name: "X", value: marker() }] });
  api.secrets.cache.clear();
  // only the row's column changed: its header disagrees, which is corruption
  api.db
    .prepare("UPDATE secret_neks SET mek_kid = 'mek-not-in-any-keyring' WHERE namespace = ?")
    .run(`function:${f3.fid}`);
  const mismatch = await internalValues(api, f3.fid, f3.vid);
  assert.equal(mismatch.body.unreadable[0].code, "SECRET_UNREADABLE", mismatch.text);
  assert.match(
    mismatch.body.unreadable[0].problem,
    /its header names NEK .* under MEK mek-.*, its row .* under MEK mek-not-in-any-keyring/,
  );
  // a well-formed NEK wrapped under a key id the provider does not know (a keyring that lost a key)
  const row3 = api.db
    .prepare("SELECT nek_id FROM secret_neks WHERE namespace = ?")
    .get(`function:${f3.fid}`) as {
    nek_id: string;
  };
  const header = encodeHeader({ kind: "nek", mekKid: "mek-not-in-any-keyring", nekId: row3.nek_id });
  const rewrapped = Buffer.concat([
    header,
    gcmSeal(randomBytes(32), aad(header, nekContext(`function:${f3.fid}`)), randomBytes(32)),
  ]);
  api.db.prepare("UPDATE secret_neks SET wrapped = ? WHERE nek_id = ?").run(rewrapped, row3.nek_id);
  const missing = await internalValues(api, f3.fid, f3.vid);
  assert.equal(missing.body.unreadable[0].code, "SECRET_KEY_UNAVAILABLE", missing.text);
  const write3 = await call(f3.url, {
    method: "PUT",
    token: admin,
    body: { secrets: [{ name: "Y", value: "v" }] },
  });
  assert.match(problem(write3, 503, "SECRET_KEY_UNAVAILABLE").detail, /mek-not-in-any-keyring/);

  // the privileged path: deleting never decrypts, so corrupt secrets can be removed
  for (const v of victims) {
    const r = await call(`${f1.url}/${v}`, { method: "DELETE", token: admin });
    assert.equal(r.status, 204, `${v}: ${r.text}`);
  }
  const after = await call<{ secrets: Array<{ name: string; readable: boolean }> }>(`${f1.url}?check=true`, {
    token: admin,
  });
  assert.deepEqual(
    after.body.secrets.map((s) => [s.name, s.readable]),
    [
      ["GOOD_1", true],
      ["GOOD_2", true],
    ],
  );
});

test("1,000 concurrent encryptions: 1,000 distinct IVs, all readable, all counted on the NEK", async (t) => {
  const api = await startApi(t);
  const admin = await api.adminToken();
  const f = await newFunction(api, admin, "many");
  const versions = [f.vid];
  for (let i = 0; i < 3; i++) {
    const v = await call<{ function: { versionId: string } }>(
      `${api.url}/v2/nvcf/functions/${f.fid}/versions`,
      {
        token: admin,
        body: sampleFunction("many"),
      },
    );
    versions.push(v.body.function.versionId);
  }
  const value = (vid: string, i: number) => `v-${vid.slice(0, 8)}-${i}`;
  await Promise.all(
    versions.flatMap((vid) =>
      Array.from({ length: 250 }, (_, i) =>
        api.secrets.put({ functionId: f.fid, versionId: vid }, [{ name: `S${i}`, value: value(vid, i) }]),
      ),
    ),
  );
  const rows = api.db.prepare("SELECT ciphertext, nek_id FROM secret_values").all() as Array<{
    ciphertext: Buffer;
    nek_id: string;
  }>;
  assert.equal(rows.length, 1000);
  const ivs = new Set(
    rows.map((r) => {
      const h = parseEnvelope(r.ciphertext, "secret").headerBytes.length;
      return r.ciphertext.subarray(h, h + IV_BYTES).toString("hex");
    }),
  );
  assert.equal(ivs.size, 1000, "every encryption has its own IV");
  const neks = api.db.prepare("SELECT nek_id, encryptions FROM secret_neks").all() as Array<{
    nek_id: string;
    encryptions: number;
  }>;
  assert.equal(neks.length, 1, "one NEK for the function, even when created under concurrency");
  assert.equal(neks[0].encryptions, 1000, "each encryption counted");
  // names of many versions at once (a function listing): past 500 ids, read another way
  const many = [...versions, ...Array.from({ length: 600 }, () => randomUUID())];
  const names = await api.secrets.names(many);
  assert.deepEqual([...names.keys()].sort(), [...versions].sort());
  assert.ok([...names.values()].every((n) => n.length === 250));
  for (const vid of versions) {
    const got = await internalValues(api, f.fid, vid);
    assert.equal(Object.keys(got.body.values).length, 250);
    for (let i = 0; i < 250; i++) assert.equal(got.body.values[`S${i}`], value(vid, i));
  }
});

test("NEK rotation moves every secret to a new NEK and removes the old; maxEncryptions rotates on its own", async (t) => {
  const api = await startApi(t);
  const admin = await api.adminToken();
  const f = await newFunction(api, admin, "rotate-nek", {
    secrets: Array.from({ length: 60 }, (_, i) => ({ name: `S${i}`, value: `value-${i}` })),
  });
  const before = (api.db.prepare("SELECT nek_id FROM secret_neks").get() as { nek_id: string }).nek_id;
  const key = await call<{ value: string }>(`${api.url}/v1/keys`, { token: admin, body: {} });
  problem(
    await call(`${api.url}/v1/admin/secrets/nek/rotate`, { token: key.body.value, body: {} }),
    403,
    "FORBIDDEN_SCOPE",
  );
  const r = await call<{ rotated: string[] }>(`${api.url}/v1/admin/secrets/nek/rotate`, {
    token: admin,
    body: { functionId: f.fid },
  });
  assert.equal(r.status, 202, r.text);
  assert.deepEqual(r.body.rotated, [`function:${f.fid}`]);
  await waitFor(
    "the old NEK emptied and removed",
    async () => {
      await api.secrets.tick();
      const ids = (api.db.prepare("SELECT nek_id FROM secret_neks").all() as Array<{ nek_id: string }>).map(
        (x) => x.nek_id,
      );
      return ids.length === 1 && ids[0] !== before;
    },
    20_000,
  );
  api.secrets.cache.clear();
  const got = await internalValues(api, f.fid, f.vid);
  assert.equal(Object.keys(got.body.values).length, 60);
  assert.equal(got.body.values.S59, "value-59");
  assert.match(await api.metrics(), /callplane_secret_values_reencrypted_total\{[^}]*\} 60/);

  const small = await startApi(t, { secrets: { maxNekEncryptions: 5 } });
  const admin2 = await small.adminToken();
  const g = await newFunction(small, admin2, "small-nek");
  const ref = { functionId: g.fid, versionId: g.vid };
  for (let i = 0; i < 3; i++) await small.secrets.put(ref, [{ name: `S${i}`, value: `v${i}` }]);
  for (let i = 0; i < 3; i++) await small.secrets.put(ref, [{ name: "S0", value: `v0-${i}` }]);
  const states = small.db
    .prepare("SELECT state, encryptions FROM secret_neks ORDER BY created_ms")
    .all() as Array<{
    state: string;
    encryptions: number;
  }>;
  assert.deepEqual(
    states.map((s) => [s.state, s.encryptions]),
    [
      ["retiring", 5],
      ["active", 1],
    ],
    "the sixth encryption went to a new NEK",
  );
  await waitFor("the full NEK emptied", async () => {
    await small.secrets.tick();
    return (small.db.prepare("SELECT COUNT(*) AS n FROM secret_neks").get() as { n: number }).n === 1;
  });
  assert.deepEqual((await internalValues(small, g.fid, g.vid)).body.values, {
    S0: "v0-2",
    S1: "v1",
    S2: "v2",
  });
  const left = small.db.prepare("SELECT encryptions FROM secret_neks").get() as { encryptions: number };
  assert.equal(left.encryptions, 3, "the two moved over were counted too");
});

/** A MEK provider that can be made to fail, as an external KMS does during an outage. */
function flaky(inner: MekProvider): MekProvider & { down: boolean; unwraps: number } {
  const p = {
    name: "flaky",
    down: false,
    unwraps: 0,
    refresh: () =>
      p.down ? Promise.reject(new MekProviderError("KMS unreachable", "unavailable")) : inner.refresh(),
    keyIds: () => inner.keyIds(),
    wrap: (kid: string, pt: Buffer, a: Buffer) =>
      p.down
        ? Promise.reject(new MekProviderError("KMS unreachable", "unavailable"))
        : inner.wrap(kid, pt, a),
    unwrap: (kid: string, body: Buffer, a: Buffer) => {
      p.unwraps++;
      return p.down
        ? Promise.reject(new MekProviderError("KMS unreachable", "unavailable"))
        : inner.unwrap(kid, body, a);
    },
  };
  return p;
}

test("the NEK cache keeps decrypts working through a MEK-provider outage, within its TTL and outage window", async (t) => {
  const dir = tmpDir(t);
  const keyring = join(dir, "mek.json");
  writeFileSync(keyring, JSON.stringify({ format: KEYRING_FORMAT, keys: [newKeyringEntry()] }), {
    mode: 0o600,
  });
  const provider = flaky(createFileMekProvider(keyring));
  let clock = Date.now();
  const api = await startApi(t, {
    secrets: { provider, now: () => clock, nekCache: { maxEntries: 10, ttlMs: 60_000, outageMs: 300_000 } },
  });
  const admin = await api.adminToken();
  const m = marker();
  const f = await newFunction(api, admin, "outage", { secrets: [{ name: "A", value: m }] });
  const read = async () => (await internalValues(api, f.fid, f.vid)).body;
  assert.deepEqual((await read()).values, { A: m });

  provider.down = true;
  assert.deepEqual((await read()).values, { A: m }, "fresh in the cache: the provider is not asked");
  clock += 120_000; // past the TTL, inside the outage window
  const unwrapsBefore = provider.unwraps;
  assert.deepEqual((await read()).values, { A: m }, "stale, but the provider is down: the cached NEK serves");
  assert.ok(provider.unwraps > unwrapsBefore, "past its TTL the cache asked the provider first");
  assert.match(await api.metrics(), /callplane_secret_nek_cache_lookups_total\{result="stale"[^}]*\} [1-9]/);
  // a new secret under the same NEK still encrypts (the NEK is at hand); a new function cannot get a NEK
  const put = await call(f.url, {
    method: "PUT",
    token: admin,
    body: { secrets: [{ name: "B", value: "b" }] },
  });
  assert.equal(put.status, 204, put.text);
  const g = await newFunction(api, admin, "outage-two");
  problem(
    await call(g.url, { method: "PUT", token: admin, body: { secrets: [{ name: "C", value: "c" }] } }),
    503,
    "SECRET_KEY_UNAVAILABLE",
  );

  clock += 300_000; // past TTL + outage window: gone from the cache
  const expired = await read();
  assert.deepEqual(expired.values, {});
  assert.deepEqual(
    expired.unreadable.map((u) => [u.name, u.code]),
    [
      ["A", "SECRET_KEY_UNAVAILABLE"],
      ["B", "SECRET_KEY_UNAVAILABLE"],
    ],
  );
  provider.down = false;
  assert.deepEqual((await read()).values, { A: m, B: "b" }, "back with the provider");
  // a cold cache does not survive an outage at all: the cache is what carried it
  api.secrets.cache.clear();
  provider.down = true;
  assert.equal((await read()).unreadable.length, 2);
  provider.down = false;
});

test("a keyring file that turns bad is not applied: the last good keys stay in use, and it is reported", async (t) => {
  const api = await startApi(t);
  const admin = await api.adminToken();
  const m = marker();
  const f = await newFunction(api, admin, "bad-keyring", { secrets: [{ name: "A", value: m }] });
  const good = readFileSync(api.mekFile, "utf8");
  writeFileSync(
    api.mekFile,
    '{"format": "callplane-mek-keyring/v1", "keys": [{"kid": "x", "key": "short"}]}',
  );
  await api.secrets.tick();
  const st = await call<{ provider: { lastRefresh: { ok: boolean; error?: string } } }>(
    `${api.url}/v1/admin/secrets/keys`,
    { token: admin },
  );
  assert.equal(st.body.provider.lastRefresh.ok, false);
  assert.match(st.body.provider.lastRefresh.error ?? "", /keys\.0\.key: must be 32 bytes/);
  assert.ok(!st.text.includes(good.slice(40, 80)), "no key material in the status");
  assert.match(await api.metrics(), /callplane_secret_mek_provider_up\{[^}]*\} 0/);
  api.secrets.cache.clear();
  assert.deepEqual(
    (await internalValues(api, f.fid, f.vid)).body.values,
    { A: m },
    "decrypts with the last good keys",
  );
  writeFileSync(api.mekFile, good);
  await api.secrets.tick();
  assert.match(await api.metrics(), /callplane_secret_mek_provider_up\{[^}]*\} 1/);
});

test("a MEK provider plugin module is loaded by path and used; a bad plugin is refused by name", async (t) => {
  const dir = tmpDir(t);
  const plugin = join(dir, "kms-plugin.mjs");
  writeFileSync(
    plugin,
    `import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
const keys = new Map([["kms-key-1", randomBytes(32)]]);
export function createMekProvider(ctx) {
  ctx.logger.info("test KMS plugin loaded");
  return {
    name: "test-kms",
    refresh: async () => {},
    keyIds: () => [...keys.keys()],
    async wrap(kid, plaintext, aad) {
      const iv = randomBytes(12);
      const c = createCipheriv("aes-256-gcm", keys.get(kid), iv, { authTagLength: 16 });
      c.setAAD(aad);
      return Buffer.concat([Buffer.from("TK"), iv, c.update(plaintext), c.final(), c.getAuthTag()]);
    },
    async unwrap(kid, body, aad) {
      const d = createDecipheriv("aes-256-gcm", keys.get(kid), body.subarray(2, 14), { authTagLength: 16 });
      d.setAAD(aad);
      d.setAuthTag(body.subarray(body.length - 16));
      return Buffer.concat([d.update(body.subarray(14, body.length - 16)), d.final()]);
    },
    async createKey() {
      const kid = "kms-key-" + (keys.size + 1);
      keys.set(kid, randomBytes(32));
      return kid;
    },
  };
}
`,
  );
  const provider = await loadMekPlugin(plugin, { env: {}, logger: silentLogger() });
  assert.equal(provider.name, "test-kms");
  const api = await startApi(t, { secrets: { provider } });
  const admin = await api.adminToken();
  const f = await newFunction(api, admin, "plugin", {
    secrets: [{ name: "A", value: "through the plugin" }],
  });
  api.secrets.cache.clear();
  assert.deepEqual((await internalValues(api, f.fid, f.vid)).body.values, { A: "through the plugin" });
  const wrapped = (api.db.prepare("SELECT wrapped FROM secret_neks").get() as { wrapped: Buffer }).wrapped;
  const env = parseEnvelope(wrapped, "nek");
  assert.equal(env.header.mekKid, "kms-key-1");
  assert.equal(env.body.subarray(0, 2).toString(), "TK", "the body is the plugin's own bytes");

  writeFileSync(join(dir, "none.mjs"), "export const x = 1;\n");
  await assert.rejects(
    loadMekPlugin(join(dir, "none.mjs"), { env: {}, logger: silentLogger() }),
    /does not export a function createMekProvider/,
  );
  writeFileSync(
    join(dir, "half.mjs"),
    'export function createMekProvider() { return { name: "half", keyIds: () => [] }; }\n',
  );
  await assert.rejects(
    loadMekPlugin(join(dir, "half.mjs"), { env: {}, logger: silentLogger() }),
    /without refresh, wrap, unwrap/,
  );
  await assert.rejects(
    loadMekPlugin(join(dir, "missing.mjs"), { env: {}, logger: silentLogger() }),
    /cannot load the MEK provider plugin/,
  );
});

interface KeyStatus {
  primaryKid: string;
  meks: Array<{ kid: string; state: string; neks: number }>;
  rotation: null | {
    phase: string;
    fromKid: string;
    toKid: string;
    rolledBack: boolean;
    keyDestroyed: boolean;
    waitingFor: string[];
    neksLeft: number;
  };
}

test("MEK rotation in one API: decrypt-only, promoted after the grace, NEKs re-wrapped, the old key retired", async (t) => {
  const api = await startApi(t, { secrets: { refreshMs: 50, rotationGraceMs: 300 } });
  const admin = await api.adminToken();
  const fns: Array<Awaited<ReturnType<typeof newFunction>>> = [];
  for (let i = 0; i < 3; i++)
    fns.push(await newFunction(api, admin, `rot-${i}`, { secrets: [{ name: "A", value: `value-${i}` }] }));
  const status = async () =>
    (await call<KeyStatus>(`${api.url}/v1/admin/secrets/keys`, { token: admin })).body;
  const first = await status();
  const oldKid = first.primaryKid;
  assert.deepEqual(first.meks, [{ ...first.meks[0], kid: oldKid, state: "primary", neks: 3 }]);

  const started = await call<KeyStatus>(`${api.url}/v1/admin/secrets/mek/rotate`, { token: admin, body: {} });
  assert.equal(started.status, 202, started.text);
  const newKid = started.body.rotation!.toKid;
  assert.notEqual(newKid, oldKid);
  assert.equal(started.body.rotation!.phase, "distributing");
  assert.ok(
    readFileSync(api.mekFile, "utf8").includes(newKid),
    "the file provider added the key to the keyring",
  );
  problem(
    await call(`${api.url}/v1/admin/secrets/mek/rotate`, { token: admin, body: {} }),
    409,
    "ROTATION_IN_PROGRESS",
  );

  // writes go on throughout
  let n = 0;
  let writing = true;
  const writer = (async () => {
    while (writing) {
      const g = fns[n % 3];
      const r = await call(g.url, {
        method: "PUT",
        token: admin,
        body: { secrets: [{ name: `W${n}`, value: `w${n}` }] },
      });
      assert.equal(r.status, 204, r.text);
      n++;
      await sleep(5);
    }
  })();
  const done = await waitFor(
    "the rotation done",
    async () => {
      const s = await status();
      // the retired key leaves the keyring right after the step that retires it
      return s.rotation?.phase === "done" && s.rotation.keyDestroyed && s;
    },
    30_000,
  );
  writing = false;
  await writer;
  assert.equal(done.primaryKid, newKid);
  assert.deepEqual(
    done.meks.map((m) => [m.kid, m.state, m.neks]),
    [
      [oldKid, "retired", 0],
      [newKid, "primary", 3],
    ],
  );
  assert.equal(done.rotation!.keyDestroyed, true);
  assert.ok(
    !readFileSync(api.mekFile, "utf8").includes(oldKid),
    "the retired key was removed from the keyring",
  );
  api.secrets.cache.clear();
  for (const [i, g] of fns.entries()) {
    const v = (await internalValues(api, g.fid, g.vid)).body;
    assert.equal(v.values.A, `value-${i}`);
    assert.deepEqual(v.unreadable, []);
  }
  assert.ok(n > 0, "secrets were written during the rotation");
  for (let i = 0; i < n; i++) {
    const v = (await internalValues(api, fns[i % 3].fid, fns[i % 3].vid)).body.values;
    assert.equal(v[`W${i}`], `w${i}`);
  }
});

test("a MEK rotation can be aborted before promotion, and rolled back after it", async (t) => {
  let clock = Date.now();
  const api = await startApi(t, {
    secrets: { refreshMs: 60_000, rotationGraceMs: 120_000, now: () => clock },
  });
  const admin = await api.adminToken();
  const f = await newFunction(api, admin, "rollback", { secrets: [{ name: "A", value: "a" }] });
  const post = (path: string) =>
    call<KeyStatus>(`${api.url}/v1/admin/secrets/mek/${path}`, { token: admin, body: {} });
  const status = async () =>
    (await call<KeyStatus>(`${api.url}/v1/admin/secrets/keys`, { token: admin })).body;
  const oldKid = (await status()).primaryKid;
  problem(await post("rotate/abort"), 409, "NO_ROTATION");

  // abort in the grace period: the new key is dropped (and removed from the keyring)
  const a = await post("rotate");
  const dropped = a.body.rotation!.toKid;
  assert.match(a.body.rotation!.waitingFor.join(" "), /the grace period: 120 s left/);
  const aborted = await post("rotate/abort");
  assert.equal(aborted.status, 200, aborted.text);
  assert.equal(aborted.body.rotation!.phase, "aborted");
  await api.secrets.tick();
  assert.equal((await status()).primaryKid, oldKid);
  assert.ok(!readFileSync(api.mekFile, "utf8").includes(dropped), "the dropped key left the keyring");

  // a rotation promoted, then rolled back: NEKs go back to the old key and the new one is retired
  const b = await post("rotate");
  const abandoned = b.body.rotation!.toKid;
  await api.secrets.tick();
  assert.equal((await status()).rotation!.phase, "distributing", "not promoted inside the grace period");
  clock += 121_000;
  await api.secrets.tick();
  const promoted = await status();
  assert.equal(promoted.rotation!.phase, "rewrapping");
  assert.equal(promoted.primaryKid, abandoned);
  assert.deepEqual(
    promoted.rotation!.waitingFor.filter((w) => /grace/.test(w)).length,
    1,
    promoted.rotation!.waitingFor.join("; "),
  );
  const rolled = await post("rotate/abort");
  assert.equal(rolled.body.rotation!.rolledBack, true);
  assert.equal(rolled.body.primaryKid, oldKid);
  problem(await post("rotate/abort"), 409, "ROTATION_IN_PROGRESS");
  await api.secrets.tick();
  clock += 121_000;
  await api.secrets.tick();
  const back = await status();
  assert.equal(back.rotation!.phase, "done");
  assert.equal(back.primaryKid, oldKid);
  const byKid = new Map(back.meks.map((m) => [m.kid, [m.state, m.neks]]));
  assert.deepEqual(byKid.get(oldKid), ["primary", 1]);
  assert.deepEqual(byKid.get(abandoned), ["retired", 0]);
  assert.ok(!readFileSync(api.mekFile, "utf8").includes(abandoned));
  api.secrets.cache.clear();
  assert.deepEqual((await internalValues(api, f.fid, f.vid)).body.values, { A: "a" });
});

test("with the env provider a rotation needs a key the operator added to every replica", async (t) => {
  const k1 = newKeyringEntry();
  const k2 = newKeyringEntry();
  const provider = createEnvMekProvider(
    "KEYRING",
    JSON.stringify({ format: KEYRING_FORMAT, keys: [k1, k2] }),
  );
  const api = await startApi(t, { secrets: { provider, refreshMs: 50, rotationGraceMs: 100 } });
  const admin = await api.adminToken();
  await newFunction(api, admin, "env-rot", { secrets: [{ name: "A", value: "a" }] });
  const rotate = (body: unknown) =>
    call<KeyStatus>(`${api.url}/v1/admin/secrets/mek/rotate`, { token: admin, body });
  assert.match(
    problem(await rotate({}), 400, "VALIDATION_FAILED").detail,
    /keyId: required with the env MEK provider/,
  );
  assert.match(
    problem(await rotate({ keyId: "mek-nope" }), 400, "MEK_UNKNOWN").detail,
    /has no key mek-nope/,
  );
  assert.match(problem(await rotate({ keyId: k1.kid }), 400, "VALIDATION_FAILED").detail, /already known/);
  const r = await rotate({ keyId: k2.kid });
  assert.equal(r.status, 202, r.text);
  const done = await waitFor(
    "done",
    async () => {
      const s = (await call<KeyStatus>(`${api.url}/v1/admin/secrets/keys`, { token: admin })).body;
      return s.rotation?.phase === "done" && s;
    },
    20_000,
  );
  assert.equal(done.primaryKid, k2.kid);
  assert.equal(done.rotation!.keyDestroyed, false, "the env provider cannot remove keys: the operator does");
  const key = await call<{ value: string }>(`${api.url}/v1/keys`, { token: admin, body: {} });
  problem(await call(`${api.url}/v1/admin/secrets/keys`, { token: key.body.value }), 403, "FORBIDDEN_SCOPE");
});

test("golden rows recorded with format 1 read through the whole store, from a new database", async (t) => {
  const golden = JSON.parse(
    readFileSync(join(repoRoot, "test", "fixtures", "secrets-golden-v1.json"), "utf8"),
  ) as {
    mek: { kid: string; key: string };
    neks: Array<{ namespace: string; nekId: string; wrapped: string }>;
    secrets: Array<{
      functionId: string;
      versionId: string;
      name: string;
      nekId: string;
      ciphertext: string;
      value: unknown;
    }>;
  };
  const dir = tmpDir(t);
  const store = openSqliteStore(join(dir, "golden.db"));
  t.after(() => store.close());
  const storage = openSqliteSecretStorage(store.db);
  const now = Date.now();
  store.db
    .prepare("INSERT INTO secret_meks (kid, state, added_ms, promoted_ms) VALUES (?, 'primary', ?, ?)")
    .run(golden.mek.kid, now, now);
  for (const n of golden.neks)
    store.db
      .prepare(
        "INSERT INTO secret_neks (nek_id, namespace, state, mek_kid, wrapped, encryptions, created_ms, wrapped_ms) VALUES (?, ?, 'active', ?, ?, 0, ?, ?)",
      )
      .run(n.nekId, n.namespace, golden.mek.kid, Buffer.from(n.wrapped, "base64"), now, now);
  for (const s of golden.secrets)
    store.db
      .prepare(
        "INSERT INTO secret_values (version_id, name, function_id, nek_id, ciphertext, created_ms, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
      )
      .run(s.versionId, s.name, s.functionId, s.nekId, Buffer.from(s.ciphertext, "base64"), now, now);
  const secrets = createSecretStore({
    storage,
    provider: createEnvMekProvider(
      "GOLDEN",
      JSON.stringify({ format: KEYRING_FORMAT, keys: [{ kid: golden.mek.kid, key: golden.mek.key }] }),
    ),
    refreshMs: 60_000,
    rotationGraceMs: 120_000,
    nekCache: { maxEntries: 10, ttlMs: 60_000, outageMs: 0 },
    maxNekEncryptions: 1000,
  });
  await secrets.start();
  t.after(() => secrets.close());
  for (const s of golden.secrets)
    assert.deepEqual(
      await secrets.value({ functionId: s.functionId, versionId: s.versionId }, s.name),
      s.value,
      s.name,
    );
});
