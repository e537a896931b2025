// Accounts and scoped keys (issue 19, findings 2, 3 and the key lifetime and admin-token items of
// 5): every function and key belongs to an account; a key reaches its account's functions and those
// shared with it, within its policies; a policy the plane cannot enforce is refused, never widened;
// an admin token is for one account or the whole plane. Through the real API (SQLite), with the
// hostile requests of the corpus's `api-accounts` section.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test, type TestContext } from "node:test";
import { call, sampleFunction, startApi, type ApiFixture, type JsonResponse } from "../../testkit/index.js";
import { repoRoot } from "../../testkit/paths.js";

interface CorpusEntry {
  name: string;
  finding: string;
  request: { method: string; path: string; headers?: Record<string, string>; body?: unknown };
  expect: { status: number; code?: string; field?: string; reaches?: string; notReaches?: string };
}
const corpus = (
  JSON.parse(readFileSync(join(repoRoot, "test", "corpus", "hostile-requests.json"), "utf8")) as Record<
    string,
    CorpusEntry[]
  >
)["api-accounts"];

interface Problem {
  code: string;
  detail: string;
  errors?: Array<{ field: string; message: string }>;
}
interface KeyDto {
  id: string;
  value?: string;
  ncaId: string;
  authorizations: { policies: Array<{ scopes: string[]; resources: Array<{ id: string; type: string }> }> };
}
interface FunctionDto {
  id: string;
  versionId: string;
  ncaId: string;
  name: string;
  ownedByDifferentAccount?: boolean;
}

function problem(r: JsonResponse<unknown>, status: number, code: string): Problem {
  assert.equal(r.status, status, `expected ${status} ${code}, got ${r.status}: ${r.text}`);
  const p = r.body as Problem;
  assert.equal(p.code, code, r.text);
  assert.ok(p.detail.length > 0);
  return p;
}

/** Replaces $NAME placeholders anywhere in a corpus entry's body. */
function fill<T>(value: T, ids: Record<string, string>): T {
  return JSON.parse(JSON.stringify(value).replace(/\$([A-Z_]+)/g, (m, name: string) => ids[name] ?? m)) as T;
}

interface World {
  api: ApiFixture;
  admin: string;
  /** Two functions of the default account and one of account B. */
  fn: FunctionDto;
  other: FunctionDto;
  foreign: FunctionDto;
  accountB: string;
  keyA: string;
  keyB: string;
}

async function world(t: TestContext): Promise<World> {
  const api = await startApi(t);
  const admin = await api.adminToken();
  const mk = async (name: string, headers: Record<string, string> = {}) => {
    const r = await call<{ function: FunctionDto }>(`${api.url}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction(name),
      headers,
    });
    assert.equal(r.status, 200, r.text);
    return r.body.function;
  };
  const created = await call<{ account: { id: string } }>(`${api.url}/v1/accounts`, {
    token: admin,
    body: { name: "team-b" },
  });
  assert.equal(created.status, 200, created.text);
  const accountB = created.body.account.id;
  const fn = await mk("a-one");
  const other = await mk("a-two");
  const foreign = await mk("b-one", { "callplane-account": accountB });
  const key = async (headers: Record<string, string> = {}) => {
    const r = await call<KeyDto>(`${api.url}/v1/keys`, { token: admin, body: {}, headers });
    assert.equal(r.status, 200, r.text);
    return r.body.value!;
  };
  return {
    api,
    admin,
    fn,
    other,
    foreign,
    accountB,
    keyA: await key(),
    keyB: await key({ "callplane-account": accountB }),
  };
}

/** The invocation service's question: may this key invoke this function? */
function invocationAuth(w: World, apiKey: string, functionId: string) {
  return call<{ ncaId: string; clientNcaId: string }>(`${w.api.url}/v1/internal/invocation-auth`, {
    token: w.api.serviceToken("invocation"),
    body: { apiKey, functionId },
  });
}

async function deploy(w: World, f: FunctionDto, headers: Record<string, string> = {}) {
  const r = await call(`${w.api.url}/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`, {
    token: w.admin,
    headers,
    body: {
      deploymentSpecifications: [
        { gpu: "local", instanceType: "local.cpu", minInstances: 1, maxInstances: 1 },
      ],
    },
  });
  assert.equal(r.status, 200, r.text);
}

describe("accounts and scoped keys", () => {
  test("every hostile key request of the corpus is refused or stored exactly as asked", async (t) => {
    const w = await world(t);
    const ids = { FUNCTION: w.fn.id, OTHER_FUNCTION: w.other.id, FOREIGN_FUNCTION: w.foreign.id };
    await deploy(w, w.fn);
    await deploy(w, w.other);
    for (const e of corpus) {
      const r = await call<KeyDto>(`${w.api.url}${e.request.path}`, {
        method: e.request.method,
        token: w.admin,
        ...(e.request.headers ? { headers: e.request.headers } : {}),
        ...(e.request.body !== undefined ? { body: fill(e.request.body, ids) } : {}),
      });
      if (e.expect.code) {
        const p = problem(r, e.expect.status, e.expect.code);
        if (e.expect.field)
          assert.ok(
            p.errors?.some((x) => x.field === e.expect.field),
            `${e.name}: names ${e.expect.field}`,
          );
        continue;
      }
      assert.equal(r.status, e.expect.status, `${e.name}: ${r.text}`);
      // stored exactly as asked: its policy names the one function, and it reaches nothing else
      const reaches = fill(e.expect.reaches!, ids);
      assert.deepEqual(r.body.authorizations.policies[0].resources, [
        { id: reaches, type: "account-functions" },
      ]);
      assert.equal((await invocationAuth(w, r.body.value!, reaches)).status, 200);
      problem(
        await invocationAuth(w, r.body.value!, fill(e.expect.notReaches!, ids)),
        404,
        "FUNCTION_NOT_FOUND",
      );
    }
  });

  test("a key of another account sees none of this account's functions, until one is shared", async (t) => {
    const w = await world(t);
    await deploy(w, w.fn);
    const list = async (key: string) =>
      (await call<{ functions: FunctionDto[] }>(`${w.api.url}/v2/nvcf/functions`, { token: key })).body
        .functions;
    assert.deepEqual(
      (await list(w.keyB)).map((f) => f.name),
      ["b-one"],
    );
    assert.deepEqual((await list(w.keyA)).map((f) => f.name).sort(), ["a-one", "a-two"]);
    const get = `${w.api.url}/v2/nvcf/functions/${w.fn.id}/versions/${w.fn.versionId}`;
    problem(await call(get, { token: w.keyB }), 404, "FUNCTION_NOT_FOUND");
    problem(await invocationAuth(w, w.keyB, w.fn.id), 404, "FUNCTION_NOT_FOUND");

    // shared: listed (as another account's), read and invoked, never changed
    const share = await call(`${w.api.url}/v2/nvcf/authorizations/functions/${w.fn.id}/add`, {
      method: "PATCH",
      token: w.admin,
      body: { authorizedParty: { ncaId: w.accountB } },
    });
    assert.equal(share.status, 200, share.text);
    const seen = (await list(w.keyB)).find((f) => f.id === w.fn.id) as
      (FunctionDto & Record<string, unknown>) | undefined;
    assert.equal(seen?.ownedByDifferentAccount, true);
    for (const owners of ["containerEnvironment", "containerArgs", "activeInstances", "secrets"])
      assert.equal(seen?.[owners], undefined, `${owners} stays the owner's`);
    const granted = await invocationAuth(w, w.keyB, w.fn.id);
    assert.equal(granted.status, 200, granted.text);
    assert.equal(granted.body.clientNcaId, w.accountB, "requests belong to the caller's account");
    assert.notEqual(granted.body.ncaId, w.accountB, "the function still belongs to its owner");
    const bAdmin = await w.api.adminToken({ account: w.accountB });
    problem(
      await call(get, { method: "PUT", token: bAdmin, body: { description: "mine now" } }),
      404,
      "FUNCTION_NOT_FOUND",
    );
    // and unshared: gone again
    const unshare = await call(`${w.api.url}/v2/nvcf/authorizations/functions/${w.fn.id}/remove`, {
      method: "PATCH",
      token: w.admin,
      body: { authorizedParty: { ncaId: w.accountB } },
    });
    assert.equal(unshare.status, 200, unshare.text);
    problem(await invocationAuth(w, w.keyB, w.fn.id), 404, "FUNCTION_NOT_FOUND");
  });

  test("an account's admin token acts only in its account; a plane-wide one in any", async (t) => {
    const w = await world(t);
    const bAdmin = await w.api.adminToken({ account: w.accountB });
    problem(
      await call(`${w.api.url}/v1/accounts`, { token: bAdmin, body: { name: "c" } }),
      403,
      "ACCOUNT_FORBIDDEN",
    );
    problem(
      await call(`${w.api.url}/v1/keys`, {
        token: bAdmin,
        body: {},
        headers: { "callplane-account": "callplane" },
      }),
      403,
      "ACCOUNT_FORBIDDEN",
    );
    const keysOfB = await call<{ keys: KeyDto[] }>(`${w.api.url}/v1/keys`, { token: bAdmin });
    assert.equal(keysOfB.body.keys.length, 1);
    assert.equal(keysOfB.body.keys[0].ncaId, w.accountB);
    const keysOfA = await call<{ keys: KeyDto[] }>(`${w.api.url}/v1/keys`, { token: w.admin });
    assert.ok(keysOfA.body.keys.every((k) => k.ncaId !== w.accountB));
    // the other account's key id is not found from here
    problem(
      await call(`${w.api.url}/v1/keys/${keysOfB.body.keys[0].id}`, { method: "DELETE", token: w.admin }),
      404,
      "KEY_NOT_FOUND",
    );
    // a key cannot act for another account either
    problem(
      await call(`${w.api.url}/v2/nvcf/functions`, {
        token: w.keyB,
        headers: { "callplane-account": "callplane" },
      }),
      403,
      "ACCOUNT_FORBIDDEN",
    );
    problem(
      await call(`${w.api.url}/v1/accounts`, { token: w.admin, body: { name: "team-b" } }),
      409,
      "ACCOUNT_NAME_TAKEN",
    );
  });

  test("one admin token is revoked by its id; others keep working", async (t) => {
    const w = await world(t);
    const victim = await w.api.adminToken();
    const jti = JSON.parse(Buffer.from(victim.split(".")[1], "base64url").toString()) as { jti: string };
    assert.equal((await call(`${w.api.url}/v1/keys`, { token: victim })).status, 200);
    const r = await call(`${w.api.url}/v1/admin/tokens/${jti.jti}`, { method: "DELETE", token: w.admin });
    assert.equal(r.status, 200, r.text);
    problem(await call(`${w.api.url}/v1/keys`, { token: victim }), 401, "TOKEN_REVOKED");
    assert.equal((await call(`${w.api.url}/v1/keys`, { token: w.admin })).status, 200);
    // an account's token may revoke only itself
    const bAdmin = await w.api.adminToken({ account: w.accountB });
    const other = JSON.parse(Buffer.from(w.admin.split(".")[1], "base64url").toString()) as { jti: string };
    problem(
      await call(`${w.api.url}/v1/admin/tokens/${other.jti}`, { method: "DELETE", token: bAdmin }),
      403,
      "ACCOUNT_FORBIDDEN",
    );
  });
});
