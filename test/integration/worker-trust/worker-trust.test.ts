// Worker trust against a real nats-server (TLS, accounts, auth callout), the real API and the real
// auth callout: who NATS lets in, what a worker may touch once in, and what happens to an identity
// when its instance goes. Permission violations are asserted on the errors NATS itself sends.
import assert from "node:assert/strict";
import { generateKeyPairSync, randomUUID, X509Certificate } from "node:crypto";
import { connect as netConnect } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { test } from "node:test";
import { connect } from "@nats-io/transport-node";
import { createUser } from "@nats-io/nkeys";
import { Kvm } from "@nats-io/kv";
import { jetstreamManager } from "@nats-io/jetstream";
import { holderHex } from "../../../src/lib/ids.js";
import {
  connectNats,
  INBOX,
  readWorkerSeed,
  REGISTRY_BUCKET,
  rotateWorkerKeyAndClose,
  subjects,
} from "../../../src/lib/nats/index.js";
import { silentLogger } from "../../../src/lib/log.js";
import { writeFileAtomic } from "../../../src/lib/fs.js";
import { join } from "node:path";
import { IdentitySigner } from "../../../src/lib/identity/index.js";
import { waitFor } from "../../testkit/client.js";
import { call, startApi, startNats, tmpDir } from "../../testkit/index.js";
import { deployFunction, freePort, POSTED_ANSWERS, startPlane } from "../../testkit/plane.js";
import { lifo } from "../../testkit/proc.js";
import {
  connectWithNkey,
  connectWithToken,
  issueIdentity,
  plainClient,
  revokeIdentity,
  startCallout,
  type Watched,
} from "../../testkit/trust.js";

const REGION = "test";

async function violation(w: Watched, kind: "Publish" | "Subscription", subject: string): Promise<void> {
  const want = `Permissions Violation for ${kind} to "${subject}"`;
  await waitFor(`NATS to refuse: ${want}`, () => w.errors.some((e) => e.includes(want)) || undefined, {
    timeoutMs: 10_000,
  });
}

function lines(log: Array<Record<string, unknown>>, msg: string | RegExp) {
  return log.filter((l) => (typeof msg === "string" ? l.msg === msg : msg.test(String(l.msg))));
}

test("NATS lets in only what callplane vouches for: no anonymous, plain, wrong-nkey, forged, expired or revoked login", async (t) => {
  const ctx = lifo(t);
  const nats = await startNats(ctx);
  const api = await startApi(ctx, { nats, workerAuth: "token" });
  const callout = await startCallout(ctx, nats, api, "token");
  const fn = await deployFunction(api, `trust-${randomUUID().slice(0, 8)}`);
  const ca = nats.pki.ca.certPem;

  await assert.rejects(
    connect({ servers: nats.url, tls: { ca }, reconnect: false }),
    /Authorization Violation/,
    "a TLS client with no credentials",
  );
  // a client that does not speak TLS: INFO says TLS is required, and a plain CONNECT gets no PONG
  const plain = await plainClient("127.0.0.1", nats.port);
  assert.equal(plain.tlsRequired, true);
  assert.ok(!plain.afterInfo.includes("PONG"), `the server answered a plain client: ${plain.afterInfo}`);
  const stranger = new TextDecoder().decode(createUser().getSeed());
  await assert.rejects(
    connectWithNkey(ctx, nats, stranger, "_INBOX_x"),
    /Authorization Violation/,
    "an unknown nkey",
  );

  const good = await issueIdentity(api, fn, randomUUID());
  const claims = {
    instanceId: good.instanceId,
    functionId: fn.functionId,
    functionVersionId: fn.versionId,
    deploymentId: (await api.store.getDeployment(fn.functionId, fn.versionId))!.deploymentId,
  };
  // the same claims, signed by a key that is not the API's
  const otherKey = generateKeyPairSync("ec", { namedCurve: "P-256" })
    .privateKey.export({ type: "pkcs8", format: "pem" })
    .toString();
  const forged = (await new IdentitySigner(otherKey, "test", 900).sign(claims)).token;
  await assert.rejects(
    connectWithToken(ctx, nats, forged, { instanceId: good.instanceId }),
    /Authorization Violation/,
    "a forged token",
  );
  const expired = (await api.identitySigner.sign(claims, Date.now() - 3600_000)).token;
  await assert.rejects(
    connectWithToken(ctx, nats, expired, { instanceId: good.instanceId }),
    /Authorization Violation/,
    "an expired token",
  );
  await assert.rejects(
    connectWithToken(ctx, nats, good.token, { account: "Worker", instanceId: good.instanceId }),
    /Authorization Violation/,
    "a worker that asks for the account Worker",
  );

  const w = await connectWithToken(ctx, nats, good.token, { instanceId: good.instanceId });
  assert.equal(w.closed, false);
  await w.nc.close();

  const revoked = await issueIdentity(api, fn, randomUUID());
  assert.equal(await revokeIdentity(api, revoked.instanceId), 200);
  await assert.rejects(
    connectWithToken(ctx, nats, revoked.token, { instanceId: revoked.instanceId }),
    /Authorization Violation/,
    "a revoked token",
  );

  // what the callout logged, as the seed's verification steps read it
  const log = callout.log();
  const ok = lines(log, "Authentication successful");
  assert.equal(ok.length, 1, JSON.stringify(ok));
  assert.equal(ok[0].account, "APP");
  assert.equal(ok[0].user, `worker-${fn.versionId}.${good.instanceId}`);
  assert.ok(lines(log, "Authentication denied: plugin webhook not found for account Worker").length === 1);
  const denied = lines(log, "Authentication denied");
  const causes = denied.map(
    (l) => `${typeof l.status_code === "number" ? l.status_code : ""} ${String(l.cause)}`,
  );
  assert.ok(
    causes.some((c) => /^ the client sent no credentials/.test(c)),
    causes.join("\n"),
  );
  assert.ok(
    causes.some((c) => /^ the client sent an nkey/.test(c)),
    causes.join("\n"),
  );
  assert.ok(
    causes.some((c) => /^401 .*not a worker identity token/.test(c)),
    causes.join("\n"),
  );
  assert.ok(
    causes.some((c) => /^401 .*expired/.test(c)),
    causes.join("\n"),
  );
  assert.ok(
    causes.some((c) => /^401 .*revoked/.test(c)),
    causes.join("\n"),
  );

  // the introspection endpoint (RFC 7662) says the same
  const intro = async (token: string) =>
    (
      await call<Record<string, unknown>>(`${api.url}/v1/workers/tokens/introspect`, {
        token: api.serviceToken("nats-auth-callout"),
        rawBody: new URLSearchParams({ token }).toString(),
        headers: { "content-type": "application/x-www-form-urlencoded" },
      })
    ).body;
  const active = await intro(good.token);
  assert.equal(active.active, true);
  assert.equal(active.aud, "nvcf-icms:test");
  assert.equal(active.instance_id, good.instanceId);
  assert.equal(active.sub, `nvcf-worker-${good.instanceId}`);
  assert.equal(typeof active.exp, "number");
  for (const t of [forged, expired, revoked.token]) assert.deepEqual(await intro(t), { active: false });
});

test("a worker of version A reaches only A: not B's work, polls, cancels, consumer, other inboxes, the registry; no stream admin", async (t) => {
  const ctx = lifo(t);
  const nats = await startNats(ctx);
  const api = await startApi(ctx, { nats, workerAuth: "token" });
  await startCallout(ctx, nats, api, "token");
  const a = await deployFunction(api, `a-${randomUUID().slice(0, 8)}`);
  const b = await deployFunction(api, `b-${randomUUID().slice(0, 8)}`);
  const idA = await issueIdentity(api, a, randomUUID());
  const w = await connectWithToken(ctx, nats, idA.token, { instanceId: idA.instanceId });
  const [streamA, consA] = [subjects.stream(REGION, a.versionId), subjects.consumer(REGION, a.versionId)];
  const [streamB, consB] = [subjects.stream(REGION, b.versionId), subjects.consumer(REGION, b.versionId)];

  // what it may do: its own cancel and polls, its own consumer
  w.nc.subscribe(subjects.cancel(a.versionId));
  w.nc.subscribe(subjects.pollingFilter(a.versionId));
  const info = await w.nc.request(`$JS.API.CONSUMER.INFO.${streamA}.${consA}`, "", { timeout: 5000 });
  assert.equal(info.json<{ name: string }>().name, consA);
  await w.nc.flush();

  const denySub = [
    `rq.${REGION}.${b.versionId}.>`,
    `rq.${REGION}.${a.versionId}.>`, // the work subjects are JetStream's to deliver, never subscribed
    subjects.pollingFilter(b.versionId),
    "rq_polling.>",
    subjects.cancel(b.versionId),
    "nvcf.cancel.*",
    "_INBOX.>",
    `${INBOX.service("invocation")}.>`,
    `${INBOX.service("api")}.>`,
    `${INBOX.tokenWorker(randomUUID())}.>`,
    "_INBOX_WK.>",
    `$KV.${REGISTRY_BUCKET}.>`,
    ">",
  ];
  const denyPub = [
    `rq.${REGION}.${b.versionId}.${randomUUID()}`,
    `rq.${REGION}.${a.versionId}.${randomUUID()}`,
    subjects.cancel(b.versionId),
    subjects.cancel(a.versionId),
    subjects.polling(b.versionId, randomUUID()),
    `$JS.API.CONSUMER.MSG.NEXT.${streamB}.${consB}`,
    `$JS.API.CONSUMER.INFO.${streamB}.${consB}`,
    `$JS.ACK.${streamB}.${consB}.1.1.1.1.0`,
    `$KV.${REGISTRY_BUCKET}.00000001`,
    `$JS.API.STREAM.PURGE.${streamA}`,
    `$JS.API.STREAM.PURGE.${streamB}`,
    `$JS.API.STREAM.MSG.DELETE.${streamA}`,
    `$JS.API.STREAM.DELETE.${streamA}`,
    `$JS.API.STREAM.CREATE.${streamB}`,
    `$JS.API.CONSUMER.DELETE.${streamA}.${consA}`,
    `$JS.API.STREAM.PURGE.KV_${REGISTRY_BUCKET}`,
    `${INBOX.service("invocation")}.reply`,
  ];
  for (const s of denySub) w.nc.subscribe(s);
  for (const s of denyPub) w.nc.publish(s, "x");
  for (const s of denySub) await violation(w, "Subscription", s);
  for (const s of denyPub) await violation(w, "Publish", s);
  // the allowed ones drew no complaint
  assert.ok(
    !w.errors.some((e) => e.includes(`"${subjects.cancel(a.versionId)}"`) && e.includes("Subscription")),
  );
  assert.ok(!w.errors.some((e) => e.includes(`"${subjects.pollingFilter(a.versionId)}"`)));
  t.diagnostic(`NATS refused ${w.errors.length} attempts, for example: ${w.errors[0]}`);
  // the streams are untouched
  const jsm = await jetstreamManager(await nats.observe());
  const names: string[] = [];
  for await (const n of jsm.streams.names()) names.push(n);
  assert.ok(names.includes(streamA) && names.includes(streamB), names.join(", "));
});

test("a worker holding the shared worker nkey (nkey mode) cannot touch streams, the registry or service inboxes", async (t) => {
  const ctx = lifo(t);
  const nats = await startNats(ctx);
  const api = await startApi(ctx, { nats });
  const a = await deployFunction(api, `a-${randomUUID().slice(0, 8)}`);
  const w = await connectWithNkey(ctx, nats, readWorkerSeed(nats.credentialsDir), INBOX.nkeyWorker("x"));
  const stream = subjects.stream(REGION, a.versionId);
  const denySub = [
    "_INBOX.>",
    `${INBOX.service("invocation")}.>`,
    `$KV.${REGISTRY_BUCKET}.>`,
    "_INBOX_WT.>",
    ">",
  ];
  const denyPub = [
    `$JS.API.STREAM.PURGE.${stream}`,
    `$JS.API.STREAM.MSG.DELETE.${stream}`,
    `$JS.API.STREAM.DELETE.${stream}`,
    `$JS.API.STREAM.CREATE.${stream}`,
    `$KV.${REGISTRY_BUCKET}.00000001`,
    `$JS.API.CONSUMER.MSG.NEXT.KV_${REGISTRY_BUCKET}.x`,
    `rq.${REGION}.${a.versionId}.${randomUUID()}`,
  ];
  for (const s of denySub) w.nc.subscribe(s);
  for (const s of denyPub) w.nc.publish(s, "x");
  for (const s of denySub) await violation(w, "Subscription", s);
  for (const s of denyPub) await violation(w, "Publish", s);
});

test("a stranger cannot rewrite the replica registry; relays go only to the addresses replicas wrote", async (t) => {
  // every replica hands workers replica 1's address (a shared, load-balanced callback URL), so the
  // callbacks of replica 2's requests land on replica 1 and are relayed to the address in the registry
  const hosts = ["127.0.71.1", "127.0.71.2"];
  const port = await freePort(hosts[0]);
  const plane = await startPlane(t, {
    replicaHosts: hosts,
    replicas: 2,
    replica: (i) => (i === 0 ? { listen: { host: hosts[0], port } } : {}),
    selfAddress: `http://${hosts[0]}:${port}`,
    relay: { enabled: true },
    logs: true,
    workers: 1,
    // answers posted, so they land on replica 1 and are relayed (over NATS they reach their holder)
    workerEnv: POSTED_ANSWERS,
  });
  const obs = await plane.nats.observe();
  const kv = await new Kvm(obs).open(REGISTRY_BUCKET);
  // the entry a stranger would like to redirect: replica 2's, whose callbacks are relayed
  const holder = holderHex(plane.replicas[1].service.holderId);
  const entry = async () => (await kv.get(holder))?.json<{ relayUrl: string }>();
  assert.equal((await entry())?.relayUrl, plane.replicas[1].url);
  // the most privileged strangers there are: a worker with the shared key, a worker with its own token
  const forged = JSON.stringify({
    holder,
    relayUrl: "http://127.0.70.99:9",
    startedAt: new Date().toISOString(),
  });
  const nkeyWorker = await connectWithNkey(
    t,
    plane.nats,
    readWorkerSeed(plane.nats.credentialsDir),
    "_INBOX_WK.s",
  );
  nkeyWorker.nc.publish(`$KV.${REGISTRY_BUCKET}.${holder}`, forged);
  await violation(nkeyWorker, "Publish", `$KV.${REGISTRY_BUCKET}.${holder}`);
  // nor can another of callplane's own services: only invocation replicas hold the grant
  for (const role of ["api", "grpc-proxy"] as const) {
    const nc = await connectNats(plane.nats.access(role), `stranger-${role}`, silentLogger());
    t.after(() => nc.close());
    const errors: string[] = [];
    void (async () => {
      for await (const s of nc.status())
        if (s.type === "error") errors.push((s as { error: Error }).error.message);
    })();
    nc.publish(`$KV.${REGISTRY_BUCKET}.${holder}`, forged);
    nc.publish(`$JS.API.STREAM.PURGE.KV_${REGISTRY_BUCKET}`, "");
    for (const subject of [`$KV.${REGISTRY_BUCKET}.${holder}`, `$JS.API.STREAM.PURGE.KV_${REGISTRY_BUCKET}`])
      await waitFor(
        `NATS to refuse ${role} publishing on ${subject}`,
        () =>
          errors.some((e) => e.includes(`Permissions Violation for Publish to "${subject}"`)) || undefined,
      );
  }
  assert.equal((await entry())?.relayUrl, plane.replicas[1].url, "the entry is still the replica's own");
  for (const n of [1, 2, 3, 4]) {
    const r = await fetch(plane.invokeUrl(1), {
      method: "POST",
      headers: { authorization: `Bearer ${plane.fn.apiKey}`, "content-type": "text/plain" },
      body: `relayed ${n}`,
    });
    assert.equal(r.status, 200);
    assert.equal(await r.text(), `relayed ${n}`);
  }
  // (a relay is logged once the relayed callback has ended, which may be just after the client's answer)
  const relays = await waitFor("a relay logged for each invocation", () => {
    const r = plane
      .logs("replica-0")
      .filter((l) => l.msg === "relayed a callback to the replica that holds it");
    return r.length >= 4 ? r : undefined;
  });
  assert.deepEqual(
    [...new Set(relays.map((l) => l.to))],
    [plane.replicas[1].url],
    "only to the address replica 2 wrote",
  );
});

test("switching nkey → token on a running plane: old workers keep serving, new ones use tokens, then the shared key is rotated", async (t) => {
  const ctx = lifo(t);
  const plane = await startPlane(ctx, { workers: 1, api: { workerAuth: "nkey" } });
  const invoke = async (payload: string) => {
    const r = await fetch(plane.invokeUrl(), {
      method: "POST",
      headers: { authorization: `Bearer ${plane.fn.apiKey}`, "content-type": "text/plain" },
      body: payload,
    });
    return { status: r.status, body: await r.text() };
  };
  assert.deepEqual(await invoke("before"), { status: 200, body: "before" });
  const oldWorker = plane.workers[0];

  // 1. the switch: the API and the auth callout restart in token mode (same folder, same address)
  const port = Number(new URL(plane.api.url).port);
  await plane.api.stop();
  const api = await startApi(ctx, { dir: plane.api.dir, nats: plane.nats, workerAuth: "token", port });
  const callout = await startCallout(ctx, plane.nats, api, "token");
  const env = (
    await call<{ workerAuth: string; workerNatsEnv: Record<string, string> }>(
      `${api.url}/v1/internal/deployments`,
      { token: api.serviceToken("compute") },
    )
  ).body;
  assert.equal(env.workerAuth, "token");
  assert.deepEqual(env.workerNatsEnv, { NVCF_NATS_ACCOUNT: "APP" }, "no NKEY_SEED in token mode");

  // 2. the worker started before the switch still serves
  assert.deepEqual(await invoke("during"), { status: 200, body: "during" });

  // a new worker authenticates with its own identity
  const id = await issueIdentity(api, plane.fn, randomUUID());
  const tokenFile = join(tmpDir(ctx, "callplane-token-"), "token");
  writeFileAtomic(tokenFile, id.token);
  await plane.addWorker({
    NKEY_SEED: "",
    NVCF_TOKEN_FILE_PATH: tokenFile,
    NVCF_NATS_ACCOUNT: "APP",
    INSTANCE_ID: id.instanceId,
  });
  assert.ok(
    lines(callout.log(), "Authentication successful").some(
      (l) => l.user === `worker-${plane.fn.versionId}.${id.instanceId}`,
    ),
  );
  // 3. the old worker is replaced; then the shared key is rotated
  const oldSeed = readWorkerSeed(plane.nats.credentialsDir);
  const holdout = await connectWithNkey(ctx, plane.nats, oldSeed, INBOX.nkeyWorker("holdout"));
  oldWorker.destroy();
  const rotated = await rotateWorkerKeyAndClose(plane.nats.credentialsDir, plane.nats.access("api-revoker"));
  assert.ok(rotated.closed >= 1, `closed ${rotated.closed} connections using the old key`);
  await waitFor(
    "the rotation to close the connection that used the old key",
    () => holdout.closed || undefined,
    {
      timeoutMs: 10_000,
    },
  );
  await assert.rejects(
    connectWithNkey(ctx, plane.nats, oldSeed, INBOX.nkeyWorker("late")),
    /Authorization Violation/,
  );
  for (const p of ["after-1", "after-2", "after-3"])
    assert.deepEqual(await invoke(p), { status: 200, body: p });
});

/** The serial number of the certificate nats-server presents now (TLS after its plain INFO line). */
async function peerSerial(host: string, port: number, ca: string): Promise<string> {
  const socket = netConnect(port, host);
  await new Promise<void>((resolve, reject) => {
    let seen = "";
    socket.on("data", function onData(d: Buffer) {
      seen += d.toString("latin1");
      if (seen.includes("\r\n")) {
        socket.off("data", onData);
        resolve();
      }
    });
    socket.once("error", reject);
  });
  const s = tlsConnect({ socket, ca, checkServerIdentity: () => undefined });
  await new Promise<void>((resolve, reject) => {
    s.once("secureConnect", () => resolve());
    s.once("error", reject);
  });
  const serial = s.getPeerCertificate().serialNumber;
  s.destroy();
  return serial;
}

test("nats-server takes a renewed certificate without a restart (SIGHUP, as the stack sends when the file changes)", async (t) => {
  const ctx = lifo(t);
  const nats = await startNats(ctx);
  const ca = nats.pki.ca.certPem;
  const before = await peerSerial(nats.host, nats.port, ca);
  const observer = await nats.observe();
  const next = await nats.pki.issue([nats.host, "localhost"]);
  writeFileAtomic(nats.keyFile, next.keyPem);
  writeFileAtomic(nats.certFile, next.certPem, 0o644);
  nats.process.kill("SIGHUP");
  const after = await waitFor("the new certificate", async () => {
    const s = await peerSerial(nats.host, nats.port, ca);
    return s !== before ? s : undefined;
  });
  assert.equal(after.toLowerCase(), new X509Certificate(next.certPem).serialNumber.toLowerCase());
  assert.equal(observer.isClosed(), false, "connections made before the reload stay up");
  const fresh = await nats.observe("after-reload");
  await fresh.flush();
});
