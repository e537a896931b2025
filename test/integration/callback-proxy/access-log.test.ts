// The callback proxy's access log on the operator console: a real HAProxy (its ring of the last
// access-log lines), its keeper answering callplane.console.logs over a real nats-server with the
// `callback-proxy` nkey, and the API's side of the question (ReplicaReports.logs) asking as the
// console does. A callback's line is found by its request id (the pod's answer names it, as a
// replica's does), a tunnel's by the id grpc-proxy accepted; the answer is bounded; without NATS
// the proxy carries callbacks the same.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { NVCF_HEADERS } from "../../../src/lib/contract.js";
import { silentLogger } from "../../../src/lib/log.js";
import { connectNats, drainOrClose } from "../../../src/lib/nats/index.js";
import { LOG_ROWS } from "../../../src/plane/console-logs.js";
import { ReplicaReports } from "../../../src/services/api/replica-reports.js";
import {
  accessLogLines,
  answerAccessLogQuestions,
} from "../../../src/services/callback-proxy/access-log-answers.js";
import { startNats, type Nats } from "../../testkit/nats.js";
import { DOMAIN, POD, startProxyFixture, type ProxyFixtureOptions } from "../../testkit/callback-proxy.js";
import { rawTls, testPki, type TestPki } from "../../testkit/tls.js";

const GRPC_POD = `127-0-0-1.grpc-headless.${DOMAIN}`;
const PATH = "/v2/nvcf/worker/request-attach";

/** A grpc-proxy pod's worker listener: takes a CONNECT with 200 when its X-Request-ID is `accept`. */
async function startGrpcPod(t: TestContext, pki: TestPki, accept: () => string | undefined) {
  const cert = await pki.issue([GRPC_POD]);
  const server = createHttpsServer({ cert: cert.certPem, key: cert.keyPem });
  server.on("connect", (req, socket) => {
    const ok = req.headers["x-request-id"] === accept();
    socket.end(ok ? "HTTP/1.1 200 Connection Established\r\n\r\n" : "HTTP/1.1 403 Forbidden\r\n\r\n");
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return (server.address() as AddressInfo).port;
}

async function fixture(t: TestContext, nats: Nats | undefined) {
  const pki = await testPki();
  // the pod answers as a replica does: its answer to request-attach names the request
  const podHandler: ProxyFixtureOptions["podHandler"] = (req, res) => {
    const id = req.headers["x-test-request-id"];
    res.writeHead(200, {
      "content-type": "application/json",
      ...(typeof id === "string" ? { [NVCF_HEADERS.reqId]: id } : {}),
    });
    res.end("{}");
  };
  let accepted: string | undefined;
  const grpcPort = await startGrpcPod(t, pki, () => accepted);
  const {
    proxy,
    pod,
    proxyPort: port,
    lines: stdout,
  } = await startProxyFixture(t, { pki, podHandler, grpcPodPort: grpcPort });
  const answers = answerAccessLogQuestions({
    nats: () => {
      if (!nats) throw new Error("no NATS key for callback-proxy");
      return nats.access("callback-proxy");
    },
    adminSocket: proxy.adminSocket,
    replica: "proxy-a",
    logger: silentLogger(),
    retryMs: 200,
  });
  t.after(() => answers.close());
  return {
    stdout,
    adminSocket: proxy.adminSocket,
    pod,
    /** A callback whose answer names `requestId` (none: an answer that names no request). */
    callback: (requestId?: string) =>
      rawTls(
        port,
        [
          `POST http://${POD}:${pod.port}${PATH} HTTP/1.1`,
          `Host: ${POD}:${pod.port}`,
          "Authorization: Bearer t0k3n",
          ...(requestId ? [`X-Test-Request-Id: ${requestId}`] : []),
          "Content-Length: 5",
          "Connection: close",
          "",
          "hello",
        ].join("\r\n"),
        { ca: pki.ca.certPem },
      ),
    tunnel: (requestId: string, accept: boolean) => {
      accepted = accept ? requestId : undefined;
      return rawTls(
        port,
        [
          `CONNECT ${GRPC_POD}:${grpcPort} HTTP/1.1`,
          `Host: ${GRPC_POD}:${grpcPort}`,
          `X-Request-ID: ${requestId}`,
          "",
          "",
        ].join("\r\n"),
        { ca: pki.ca.certPem, servername: "127-0-0-1.worker.callplane.test", timeoutMs: 1000 },
      );
    },
  };
}

/** The API's side, as the console asks: one callback proxy besides no registered replica. */
async function asker(t: TestContext, nats: Nats) {
  const nc = await connectNats(nats.access("api"), "api", silentLogger());
  t.after(() => drainOrClose(nc));
  const reports = new ReplicaReports(nc, silentLogger(), 1);
  return async (query: Parameters<ReplicaReports["logs"]>[0]) => {
    const replies = await reports.logs(query, 500);
    return replies.filter((r) => r.service === "callback-proxy");
  };
}

async function until<T>(what: string, get: () => Promise<T | undefined>, ms = 5000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await get();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

test("a callback's access-log line is found by its request id through the console's logs question", async (t) => {
  const nats = await startNats(t);
  const f = await fixture(t, nats);
  const ask = await asker(t, nats);
  const id = randomUUID();
  const other = randomUUID();
  assert.equal((await f.callback(id)).status, 200);
  assert.equal((await f.callback(other)).status, 200);
  assert.equal((await f.callback()).status, 200);
  const replies = await until("the keeper's answer", async () => {
    const r = await ask({ requestId: id });
    return r.length > 0 && r[0].lines.length > 0 ? r : undefined;
  });
  assert.equal(replies.length, 1, "one callback proxy answered");
  const [reply] = replies;
  assert.equal(reply.replica, "proxy-a");
  assert.equal(reply.problem, undefined);
  assert.equal(reply.lines.length, 1, reply.lines.join("\n"));
  const line = JSON.parse(reply.lines[0]) as Record<string, unknown>;
  assert.equal(line.requestId, id);
  assert.equal(line.msg, "callback");
  assert.equal(line.service, "callback-proxy");
  assert.equal(line.method, "POST");
  assert.equal(line.path, PATH);
  assert.equal(line.target, POD);
  assert.equal(line.status, 200);
  assert.equal(line.outcome, "forwarded");
  assert.ok(typeof line.time === "number" && Math.abs(line.time - Date.now()) < 60_000, String(line.time));
  assert.ok(typeof line.bytesIn === "number" && line.bytesIn > 5);
  assert.ok(typeof line.bytesOut === "number" && line.bytesOut > 0);
  assert.ok(typeof line.durationMs === "number");
  assert.ok(!reply.lines[0].includes("t0k3n"), "the access log never holds the token");
  // standard output still gets every line, the same text
  assert.ok(f.stdout.some((l) => l === reply.lines[0]));
  // unfiltered: every callback, newest first; the one that named no request has HAProxy's "-"
  const all = (await ask({}))[0].lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.deepEqual(
    all.map((l) => l.requestId),
    ["-", other, id],
  );
  // a function filter finds none: the proxy's lines do not name the function
  assert.deepEqual((await ask({ functionId: randomUUID() }))[0].lines, []);
});

test("a tunnel's line names the request grpc-proxy accepted it for, and a refused one names none", async (t) => {
  const nats = await startNats(t);
  const f = await fixture(t, nats);
  const ask = await asker(t, nats);
  const accepted = randomUUID();
  const refused = randomUUID();
  assert.equal((await f.tunnel(accepted, true)).status, 200);
  assert.equal((await f.tunnel(refused, false)).status, 403);
  await sleep(100);
  const lines = (await accessLogLines(f.adminSocket)).map((l) => JSON.parse(l) as Record<string, unknown>);
  const tunnels = lines.filter((l) => l.method === "CONNECT");
  assert.equal(tunnels.length, 2, JSON.stringify(lines));
  assert.deepEqual(
    tunnels.map((l) => [l.status, l.requestId]),
    [
      [403, "-"],
      [200, accepted],
    ],
  );
  const found = await ask({ requestId: accepted });
  assert.equal(found[0].lines.length, 1);
  assert.deepEqual((await ask({ requestId: refused }))[0].lines, []);
});

test("the keeper's answer is bounded: the lines asked for, newest first, and never more than LOG_ROWS.max", async (t) => {
  const nats = await startNats(t);
  const f = await fixture(t, nats);
  const ask = await asker(t, nats);
  const ids: string[] = [];
  const total = LOG_ROWS.max + 50;
  for (let i = 0; i < total; i += 25) {
    const batch = Array.from({ length: Math.min(25, total - i) }, () => randomUUID());
    ids.push(...batch);
    // in order, batch by batch: the last batch's lines are the newest
    const answers = await Promise.all(batch.map((id) => f.callback(id)));
    assert.ok(answers.every((a) => a.status === 200));
  }
  await sleep(100);
  const five = await until("five lines", async () => {
    const r = await ask({ limit: 5 });
    return r[0]?.lines.length === 5 ? r[0].lines : undefined;
  });
  const lastBatch = new Set(ids.slice(-25));
  assert.ok(five.every((l) => lastBatch.has((JSON.parse(l) as { requestId: string }).requestId)));
  const times = five.map((l) => (JSON.parse(l) as { time: number }).time);
  assert.deepEqual(
    times,
    [...times].sort((a, b) => b - a),
    "newest first",
  );
  // asking for more than a reply carries gets LOG_ROWS.max, though the ring holds more
  const ring = await accessLogLines(f.adminSocket);
  assert.ok(ring.length >= total, String(ring.length));
  const many = await ask({ limit: 100_000 });
  assert.equal(many[0].lines.length, LOG_ROWS.max);
});

test("without NATS (no key, or no server) the proxy carries callbacks as before", async (t) => {
  // no key: the keeper answers nothing, HAProxy is untouched
  const f = await fixture(t, undefined);
  const id = randomUUID();
  assert.equal((await f.callback(id)).status, 200);
  assert.equal(f.pod.requests.length, 1);
  // the ring still holds the line, for when NATS comes
  await sleep(50);
  assert.ok((await accessLogLines(f.adminSocket)).some((l) => l.includes(id)));
  // a server that is down: the keeper keeps trying in the background, callbacks pass meanwhile
  const nats = await startNats(t);
  await nats.stopServer();
  const g = await fixture(t, nats);
  assert.equal((await g.callback(randomUUID())).status, 200);
  await sleep(300);
  assert.equal((await g.callback(randomUUID())).status, 200);
  // once the server is back, the keeper answers (it retried)
  await nats.startServer();
  const ask = await asker(t, nats);
  const lines = await until(
    "the keeper's answer once NATS is back",
    async () => {
      const r = await ask({});
      return r[0]?.lines.length === 2 ? r[0].lines : undefined;
    },
    10_000,
  );
  assert.equal(lines.length, 2);
});

test("the callback-proxy NATS user may answer the logs question and nothing else", async (t) => {
  const nats = await startNats(t);
  const errors: string[] = [];
  // connectNats reports a permission violation as a warning (NATS does not close the connection)
  const logger = Object.assign(Object.create(silentLogger()) as ReturnType<typeof silentLogger>, {
    warn: (o: { err?: string }) => errors.push(String(o.err)),
  });
  const nc = await connectNats(nats.access("callback-proxy"), "callback-proxy", logger);
  t.after(() => drainOrClose(nc));
  nc.publish("rq.test.x.y", "work");
  nc.subscribe("callplane.console.inflight");
  nc.subscribe("rq.>");
  await nc.flush();
  await sleep(200);
  const text = errors.join("\n");
  assert.match(text, /Permissions Violation for Publish to "rq\.test\.x\.y"/i);
  assert.match(text, /Permissions Violation for Subscription to "callplane\.console\.inflight"/i);
  assert.match(text, /Permissions Violation for Subscription to "rq\.>"/i);
});
