import assert from "node:assert/strict";
import { test } from "node:test";
import { call, startApi, startIssuer, startNats } from "../testkit/index.js";

test("testkit starts a real nats-server, API and issuer on loopback", async (t) => {
  const nats = await startNats(t);
  assert.match(nats.url, /^tls:\/\/127\.0\.0\.1:\d+$/);
  const api = await startApi(t);
  const issuer = await startIssuer(t, api.issuerKeyFile);
  const tok = await call<{ value: string }>(`${issuer.url}/v1/admin/keys`, {
    body: {},
    token: issuer.credential,
  });
  assert.equal(tok.status, 200);
  const list = await call(`${api.url}/v2/nvcf/functions`, { token: tok.body.value });
  assert.equal(list.status, 200);
  assert.deepEqual(list.body, { functions: [] });
});
