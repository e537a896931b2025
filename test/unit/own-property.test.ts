// Lookups keyed by what a caller sends (a token's claim, a header's name, a code in an answer) find
// own properties only: "toString", "constructor" or "__proto__" must never find Object.prototype's
// members (issue 19: a JWT whose `iss` was toString was answered with the function's source).
import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import type { AuthorizationRequest } from "@nats-io/jwt";
import { createAccount } from "@nats-io/nkeys";
import { SignJWT, importPKCS8 } from "jose";
import { foldPairs } from "../../src/lib/http/index.js";
import {
  ADMIN_ALG,
  ADMIN_AUDIENCE,
  ADMIN_ISSUER,
  createAdminTokenVerifier,
} from "../../src/lib/identity/index.js";
import { silentLogger } from "../../src/lib/log.js";
import { createRegistry } from "../../src/lib/metrics.js";
import { AuthCache } from "../../src/plane/auth-cache.js";
import { authorize } from "../../src/services/nats-auth-callout/authorize.js";
import { Refusal } from "../../src/services/nats-auth-callout/refusal.js";

const PROTOTYPE_NAMES = ["toString", "__proto__", "constructor", "hasOwnProperty", "valueOf"];

function keyPair() {
  return generateKeyPairSync("ec", {
    namedCurve: "P-256",
    publicKeyEncoding: { type: "spki", format: "pem" },
    privateKeyEncoding: { type: "pkcs8", format: "pem" },
  });
}

void test("admin tokens: an `iss` naming an Object.prototype member is TOKEN_INVALID, never a function's text", async () => {
  const trusted = keyPair();
  // a refused issuer, so that the refused-issuers table is a non-empty plain object
  const verifier = await createAdminTokenVerifier(
    [{ issuer: ADMIN_ISSUER, publicKeyPem: trusted.publicKey }],
    {
      "callplane-old-issuer": "that issuer was turned off",
    },
  );
  for (const signer of [trusted, keyPair()]) {
    const key = await importPKCS8(signer.privateKey, ADMIN_ALG);
    for (const iss of PROTOTYPE_NAMES) {
      const token = await new SignJWT({ scopes: ["list_functions"] })
        .setProtectedHeader({ alg: ADMIN_ALG, typ: "JWT" })
        .setIssuer(iss)
        .setAudience(ADMIN_AUDIENCE)
        .setSubject("attacker")
        .setJti("j")
        .setIssuedAt()
        .setExpirationTime("1h")
        .sign(key);
      await assert.rejects(verifier.verify(token), (err: Error & { code?: string }) => {
        assert.equal(err.code, "TOKEN_INVALID", `iss ${iss}: ${err.message}`);
        assert.doesNotMatch(err.message, /native code|function/, `iss ${iss}`);
        return true;
      });
    }
  }
});

void test("the NATS auth callout: an account or plugin named like an Object.prototype member is not found (denied at once)", async () => {
  const issuer = createAccount();
  const plugin = { url: "http://127.0.0.1:9/never", serviceToken: "cps-x", retries: 0 };
  const ctx = {
    plugins: { APP: { "callplane-worker": plugin } },
    nkeyWorker: undefined,
    issuer,
    log: () => {},
  };
  const cases: Array<[string, string]> = [
    ...PROTOTYPE_NAMES.map((n): [string, string] => [n, "callplane-worker"]),
    ...PROTOTYPE_NAMES.map((n): [string, string] => ["APP", n]),
    ["__proto__", "toString"],
    ["constructor", "prototype"],
  ];
  for (const [account, pluginName] of cases) {
    const token = Buffer.from(JSON.stringify({ account, pluginName, payload: "x" })).toString("base64url");
    const req = {
      connect_opts: { auth_token: token },
      client_info: { host: "127.0.0.1", name: "w", id: 1 },
      user_nkey: "UXXX",
    } as unknown as AuthorizationRequest;
    await assert.rejects(authorize(ctx, req), (err: unknown) => {
      assert.ok(err instanceof Refusal, `${account}/${pluginName}: ${String(err)}`);
      assert.equal(err.kind, "denied", `${account}/${pluginName}: ${err.message}`);
      assert.match(err.message, /not found/);
      return true;
    });
  }
});

void test("header names like Object.prototype members are folded as headers, not looked up on the prototype", () => {
  const out = foldPairs([
    ["Constructor", "a"],
    ["__proto__", "b"],
    ["__proto__", "c"],
    ["valueof", "d"],
    ["x-ok", "e"],
  ]);
  assert.deepEqual(Object.keys(out), ["constructor", "__proto__", "valueof", "x-ok"]);
  assert.equal(out.constructor, "a");
  assert.deepEqual(Object.getOwnPropertyDescriptor(out, "__proto__")?.value, ["b", "c"]);
  assert.equal(Object.getPrototypeOf(out), Object.prototype);
  assert.equal(out["x-ok"], "e");
});

void test("the invocation auth cache: an error code like an Object.prototype member from the API is no code", async (t) => {
  const server = createServer((_req, res) => {
    res.writeHead(401, { "content-type": "application/problem+json" });
    res.end(JSON.stringify({ status: 401, code: "toString", detail: "hostile" }));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const cache = new AuthCache({
    apiUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    serviceToken: "cps-x",
    ttlMs: 1000,
    negativeTtlMs: 1000,
    maxEntries: 10,
    logger: silentLogger(),
    registry: createRegistry("t", { defaultMetrics: false }),
  });
  t.after(() => cache.destroy());
  await assert.rejects(cache.authorize("nvapi-x", "f"), (err: Error & { code?: string; status?: number }) => {
    assert.equal(err.code, "UNAVAILABLE", err.message);
    assert.equal(err.status, 503);
    return true;
  });
});
