// The session table's binding to the caller's account and its per-key bound, without NATS: a fake
// publisher takes the work messages and a fake NATS connection answers reconnect requests as
// nobody (no responders) does, which is what an id that no worker holds gets.
import assert from "node:assert/strict";
import type { Http2Session } from "node:http2";
import { test, type TestContext } from "node:test";
import { RequestError, errors } from "@nats-io/transport-node";
import { CallplaneError, type ErrorCode } from "../../lib/errors.js";
import { silentLogger } from "../../lib/log.js";
import { createRegistry } from "../../lib/metrics.js";
import type { Grant } from "../../plane/auth-cache.js";
import { KeyInFlight } from "../../plane/key-limit.js";
import { grpcProxyMetrics } from "./metrics.js";
import { SessionTable } from "./sessions.js";
import { ProxyState } from "./state.js";

const FN = "7b7d7a8e-0c3e-4c55-9a40-3a4c1c4a0001";
const grant = (clientNcaId: string, keyId: string): Grant => ({
  functionId: FN,
  functionName: "g",
  ncaId: "owner",
  clientNcaId,
  subject: `sub-${keyId}`,
  keyId,
  keyExpiresAt: new Date(Date.now() + 60_000).toISOString(),
  functionVersions: [{ functionVersionId: "v1", defaultInvocationPath: "/grpc", functionType: "DEFAULT" }],
});
const conn = () => ({}) as Http2Session;

function table(t: TestContext, limit = 8) {
  const state = new ProxyState();
  const published: string[] = [];
  state.publisher = {
    publish: (_v: string, requestId: string) => {
      published.push(requestId);
      return Promise.resolve(published.length);
    },
    cancel: () => undefined,
  } as unknown as ProxyState["publisher"];
  state.nc = {
    request: (subject: string) =>
      Promise.reject(new RequestError("no responders", { cause: new errors.NoRespondersError(subject) })),
  } as unknown as ProxyState["nc"];
  state.connectUri = "http://127.0.0.1:1/v1/proxy";
  const sessions = new SessionTable({
    state,
    logger: silentLogger(),
    holderId: 7,
    region: "test",
    idleMs: 30_000,
    tokenTtlMs: 30_000,
    metrics: grpcProxyMetrics(createRegistry("t", { defaultMetrics: false })),
    budget: new KeyInFlight(limit, "grpcproxy.maxInFlightPerKey", "sessions"),
  });
  t.after(() => {
    sessions.endAll(new CallplaneError("SHUTTING_DOWN", "test over"), "test over");
    sessions.close();
  });
  return { sessions, published };
}

async function refusal(p: Promise<unknown>): Promise<{ code: ErrorCode; message: string }> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof CallplaneError, String(err));
    return { code: err.code, message: err.message };
  }
  assert.fail("the resumption was accepted");
}

test("a session is its account's: another account's key gets what an unknown id gets", async (t) => {
  const { sessions } = table(t);
  const s = sessions.sessionFor(conn(), grant("acct-a", "key-1"), FN, undefined);
  assert.equal(s.owner, "acct-a");
  const foreign = await refusal(
    sessions.resume(conn(), s.requestId, grant("acct-b", "key-9"), FN, undefined),
  );
  const unknownId = "00000000-0000-8000-8000-000000000000";
  const unknown = await refusal(sessions.resume(conn(), unknownId, grant("acct-b", "key-9"), FN, undefined));
  assert.equal(foreign.code, "SESSION_NOT_FOUND");
  assert.equal(unknown.code, "SESSION_NOT_FOUND");
  assert.equal(
    foreign.message.replace(s.requestId, "<id>"),
    unknown.message.replace(unknownId, "<id>"),
    "word for word the answer of an id nobody holds",
  );
  assert.match(foreign.message, /^no existing session found/);
});

test("keys of the same account share their sessions", async (t) => {
  const { sessions, published } = table(t);
  const s = sessions.sessionFor(conn(), grant("acct-a", "key-1"), FN, undefined);
  assert.equal(await sessions.resume(conn(), s.requestId, grant("acct-a", "key-1"), FN, undefined), s);
  assert.equal(
    await sessions.resume(conn(), s.requestId, grant("acct-a", "key-2"), FN, undefined),
    s,
    "another key of the account joins it",
  );
  assert.equal(published.length, 1, "one work message for the session");
});

test("on one connection, a call of another account never joins this account's session", (t) => {
  const { sessions, published } = table(t);
  const shared = conn();
  const a = sessions.sessionFor(shared, grant("acct-a", "key-1"), FN, undefined);
  assert.equal(
    sessions.sessionFor(shared, grant("acct-a", "key-2"), FN, undefined),
    a,
    "same account: joined",
  );
  const b = sessions.sessionFor(shared, grant("acct-b", "key-9"), FN, undefined);
  assert.notEqual(b, a, "another account's call starts its own session");
  assert.equal(b.owner, "acct-b");
  assert.equal(published.length, 2);
});

test("a key holds at most maxInFlightPerKey sessions here; an ended one gives its place back", (t) => {
  const { sessions, published } = table(t, 2);
  const a = sessions.sessionFor(conn(), grant("acct-a", "key-1"), FN, undefined);
  sessions.sessionFor(conn(), grant("acct-a", "key-1"), FN, undefined);
  assert.throws(
    () => sessions.sessionFor(conn(), grant("acct-a", "key-1"), FN, undefined),
    (e: unknown) => e instanceof CallplaneError && e.code === "TOO_MANY_IN_FLIGHT",
  );
  assert.equal(published.length, 2, "the refused session queued no work");
  sessions.sessionFor(conn(), grant("acct-a", "key-2"), FN, undefined);
  a.end(undefined, "test");
  sessions.sessionFor(conn(), grant("acct-a", "key-1"), FN, undefined);
  assert.equal(published.length, 4);
});
