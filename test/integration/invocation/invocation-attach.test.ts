// The worker side of the invocation service, driven by hand: no worker runs (workers: 0); the test
// subscribes to the work subject with a plain NATS client, decodes the WorkerInvokeFunctionRequest
// and plays the worker on /v2/nvcf/worker/request-attach (contract §3.6). It checks what the
// worker is told and what the waiting client then sees.
import { fromBinary, type MessageShape } from "@bufbuild/protobuf";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { test, type TestContext } from "node:test";
import { WorkerInvokeFunctionRequestSchema } from "../../../src/gen/nvcf/worker_pb.js";
import { holderHex } from "../../../src/lib/ids.js";
import { subjects } from "../../../src/lib/nats/index.js";
import { REQUEST_ID, bearer, problemOf, waitFor } from "../../testkit/client.js";
import { startPlane, type Plane } from "../../testkit/plane.js";

/** No test waits forever: a hang fails its test with a clear timeout instead of stalling the file. */
const LIMIT = { timeout: 60_000 };

type WorkRequest = MessageShape<typeof WorkerInvokeFunctionRequestSchema>;
const H1 = "application/octet-stream+h1";

interface Work {
  msg: WorkRequest;
  targetUri: string;
  responseToken: string;
  requestToken: string | undefined;
}

/** Subscribes to the plane's work subject and hands over each decoded message. */
async function fakeWorker(plane: Plane, t: TestContext): Promise<{ next(): Promise<Work> }> {
  const nc = await plane.nats.observe();
  t.after(() => nc.close().catch(() => undefined));
  const got: Work[] = [];
  nc.subscribe(`rq.test.${plane.fn.versionId}.>`, {
    callback: (err, m) => {
      if (err) return;
      const msg = fromBinary(WorkerInvokeFunctionRequestSchema, m.data);
      const cfg = msg.statelessConfig?.connectionConfigs[0]?.config;
      assert.equal(cfg?.case, "http1Config");
      got.push({
        msg,
        targetUri: cfg.value.targetURI,
        responseToken: cfg.value.responseAuthorizationToken,
        requestToken: cfg.value.requestAuthorizationToken,
      });
    },
  });
  await nc.flush();
  return { next: () => waitFor("a work message", () => got.shift()) };
}

function attachUrl(plane: Plane): string {
  return `${plane.replicas[0].url}/v2/nvcf/worker/request-attach`;
}

/** POST request-attach as a worker does: the framed HTTP/1.1 response as the body. */
function postAnswer(plane: Plane, token: string, framed: string | Buffer, type = H1): Promise<Response> {
  return fetch(attachUrl(plane), {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": type },
    body: framed,
  });
}

/** A client invocation whose answer is read in full (or whose failure is kept). */
function invoke(plane: Plane, body: string | Buffer = "{}", headers: Record<string, string> = {}) {
  return fetch(plane.invokeUrl(), {
    method: "POST",
    headers: bearer(plane.fn.apiKey, { "content-type": "application/json", ...headers }),
    body,
    signal: AbortSignal.timeout(20_000),
  }).then(async (res) => ({ res, text: await res.text() }));
}

test(
  "the work message names this replica and carries the request; a framed answer reaches the client once",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { workers: 0 });
    const worker = await fakeWorker(plane, t);
    const client = invoke(plane, '{"q":1}', { "x-custom": "kept", "nvcf-poll-seconds": "30" });
    const work = await worker.next();
    assert.match(work.msg.requestId, REQUEST_ID);
    assert.equal(work.msg.requestMethod, "POST");
    assert.equal(work.msg.requestPath, "/echo");
    assert.equal(Buffer.from(work.msg.requestBody ?? []).toString(), '{"q":1}');
    assert.equal(work.requestToken, undefined, "a body that fits inline needs no request token");
    const port = new URL(plane.replicas[0].url).port;
    assert.equal(work.targetUri, `http://127-0-0-1.invocation.nvcf.svc.cluster.local:${port}`);
    const headers = new Map(work.msg.requestHeaders.map((h) => [h.key.toLowerCase(), h.value]));
    assert.equal(headers.get("authorization"), undefined, "the API key is not passed to the worker");
    assert.equal(headers.get("x-custom"), "kept");
    assert.equal(headers.get("nvcf-poll-seconds"), "30");
    assert.equal(headers.get("nvcf-invocation-region"), "test");

    const framed =
      "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nX-From: worker\r\nContent-Length: 5\r\n\r\nhello";
    const first = await postAnswer(plane, work.responseToken, framed);
    assert.equal(first.status, 200, await first.text());
    const { res, text } = await client;
    assert.equal(res.status, 201);
    assert.equal(text, "hello");
    assert.equal(res.headers.get("x-from"), "worker");
    assert.equal(res.headers.get("nvcf-reqid"), work.msg.requestId);
    assert.equal(res.headers.get("nvcf-status"), "fulfilled");

    // the response token is single-use
    const again = await postAnswer(plane, work.responseToken, framed);
    assert.equal((await problemOf(again, 401)).code, "ATTACH_TOKEN_INVALID");
  },
);

test("request-attach refuses unknown, missing and wrong-kind tokens with 401", LIMIT, async (t) => {
  const plane = await startPlane(t, { workers: 0 });
  const worker = await fakeWorker(plane, t);
  const url = attachUrl(plane);
  const framed = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
  const p1 = await problemOf(await postAnswer(plane, "not-a-token", framed), 401);
  assert.equal(p1.code, "ATTACH_TOKEN_INVALID");
  assert.match(p1.detail, /invalid or has expired/);
  const p2 = await problemOf(await fetch(url, { headers: bearer("not-a-token") }), 401);
  assert.equal(p2.code, "ATTACH_TOKEN_INVALID");
  const p3 = await problemOf(await fetch(url, { method: "POST", headers: { "content-type": H1 } }), 401);
  assert.equal(p3.code, "ATTACH_TOKEN_INVALID");

  // a response token does not fetch the request body, and a request token does not answer
  const client = invoke(plane, randomBytes(40 * 1024));
  const work = await worker.next();
  assert.ok(work.requestToken);
  const p4 = await problemOf(await fetch(url, { headers: bearer(work.responseToken) }), 401);
  assert.equal(p4.code, "ATTACH_TOKEN_INVALID");
  const p5 = await problemOf(await postAnswer(plane, work.requestToken, framed), 401);
  assert.equal(p5.code, "ATTACH_TOKEN_INVALID");
  // a wrong-kind attempt does not burn the token: the right use still works
  const answered = await postAnswer(
    plane,
    work.responseToken,
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
  );
  assert.equal(answered.status, 200, await answered.text());
  const { res, text } = await client;
  assert.equal(res.status, 200);
  assert.equal(text, "ok");
});

for (const [name, framed, type, detail] of [
  ["a garbage head", "GARBAGE\r\n\r\nbody", H1, /status line/],
  [
    "an inner Transfer-Encoding",
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    H1,
    /Transfer-Encoding/,
  ],
  ["a head that never ends", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", H1, /ended before|broke off/],
  ["a head with bare LF line ends", "HTTP/1.1 200 OK\nContent-Length: 2\n\nhi", H1, /bare LF.*CRLF/],
  [
    "the wrong content type",
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
    "application/octet-stream",
    /application\/octet-stream\+h1/,
  ],
  [
    "a body longer than its Content-Length",
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhello",
    H1,
    /Content-Length/,
  ],
] as const) {
  test(`a framed answer with ${name} is refused: 400 to the worker, 502 to the client`, LIMIT, async (t) => {
    const plane = await startPlane(t, { workers: 0 });
    const worker = await fakeWorker(plane, t);
    const client = invoke(plane);
    const work = await worker.next();
    const toWorker = await problemOf(await postAnswer(plane, work.responseToken, framed, type), 400);
    assert.equal(toWorker.code, "ATTACH_FRAMING_INVALID");
    assert.match(toWorker.detail, detail);
    const { res, text } = await client;
    assert.equal(res.status, 502, text);
    assert.match(res.headers.get("content-type") ?? "", /^application\/problem\+json/);
    const p = JSON.parse(text) as { code: string; detail: string; requestId: string };
    assert.equal(p.code, "WORKER_RESPONSE_INVALID");
    assert.equal(p.requestId, work.msg.requestId);
    assert.equal(res.headers.get("nvcf-reqid"), work.msg.requestId);
  });
}

test(
  "a framed body shorter than its Content-Length cuts the client's connection instead of leaving it waiting",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { workers: 0 });
    const worker = await fakeWorker(plane, t);
    const client = invoke(plane);
    const work = await worker.next();
    const toWorker = await problemOf(
      await postAnswer(plane, work.responseToken, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello"),
      400,
    );
    assert.equal(toWorker.code, "ATTACH_FRAMING_INVALID");
    const started = performance.now();
    await assert.rejects(client, (err: Error) => {
      assert.notEqual(err.name, "TimeoutError", "the client was left waiting for the missing bytes");
      return true;
    });
    assert.ok(performance.now() - started < 10_000);
  },
);

test(
  "a body beyond 32 KiB: the first 32 KiB travel inline, GET request-attach streams the rest once",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { workers: 0 });
    const worker = await fakeWorker(plane, t);
    const body = randomBytes(100 * 1024);
    const client = invoke(plane, body, { "content-type": "application/octet-stream" });
    const work = await worker.next();
    assert.equal(work.msg.requestBody?.length, 32 * 1024);
    assert.ok(Buffer.from(work.msg.requestBody ?? []).equals(body.subarray(0, 32 * 1024)));
    assert.ok(work.requestToken, "a body that does not fit inline comes with a request token");
    const rest = await fetch(attachUrl(plane), {
      headers: bearer(work.requestToken, { accept: "application/octet-stream" }),
    });
    assert.equal(rest.status, 200);
    assert.equal(rest.headers.get("content-type"), "application/octet-stream");
    assert.equal(rest.headers.get("nvcf-reqid"), work.msg.requestId);
    const remainder = Buffer.from(await rest.arrayBuffer());
    assert.equal(remainder.length, body.length - 32 * 1024);
    assert.ok(remainder.equals(body.subarray(32 * 1024)), "the remainder differs from what the client sent");
    // the request token is single-use too
    const again = await fetch(attachUrl(plane), { headers: bearer(work.requestToken) });
    assert.equal((await problemOf(again, 401)).code, "ATTACH_TOKEN_INVALID");

    const framed = Buffer.concat([
      Buffer.from(
        `HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: ${body.length}\r\n\r\n`,
      ),
      body,
    ]);
    const answered = await postAnswer(plane, work.responseToken, framed);
    assert.equal(answered.status, 200, await answered.text());
    const { res } = await client;
    assert.equal(res.status, 200);
  },
);

test("a body of exactly 32 KiB travels inline whole and needs no request token", LIMIT, async (t) => {
  const plane = await startPlane(t, { workers: 0 });
  const worker = await fakeWorker(plane, t);
  const body = randomBytes(32 * 1024);
  const client = invoke(plane, body, { "content-type": "application/octet-stream" });
  const work = await worker.next();
  assert.ok(Buffer.from(work.msg.requestBody ?? []).equals(body));
  assert.equal(work.requestToken, undefined, "nothing is left for GET request-attach to serve");
  const answered = await postAnswer(plane, work.responseToken, "HTTP/1.1 204 No Content\r\n\r\n");
  assert.equal(answered.status, 200, await answered.text());
  assert.equal((await client).res.status, 204);
});

test(
  "an answer over NATS reaches the client once; a used token and a broken framing get the POST's problems",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { workers: 0 });
    const worker = await fakeWorker(plane, t);
    const nc = await plane.nats.observe("answers");
    const subject = subjects.answer(holderHex(plane.replicas[0].service.holderId));
    const answer = async (token: string, framed: string) => {
      const m = await nc.request(subject, `${token}\n${framed}`, { timeout: 5000 });
      return m.string();
    };

    const client = invoke(plane, '{"a":1}');
    const work = await worker.next();
    const framed =
      "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nX-Answer: nats\r\nContent-Length: 5\r\n\r\nhello";
    assert.equal(
      await answer(work.responseToken, framed),
      "{}",
      "the replica replies once the client has it",
    );
    const { res, text } = await client;
    assert.equal(res.status, 201);
    assert.equal(text, "hello");
    assert.equal(res.headers.get("x-answer"), "nats");
    assert.equal(res.headers.get("nvcf-reqid"), work.msg.requestId);
    // single-use, whichever way it came
    const again = JSON.parse(await answer(work.responseToken, framed)) as { status: number; code: string };
    assert.deepEqual([again.status, again.code], [401, "ATTACH_TOKEN_INVALID"]);
    const posted = await postAnswer(plane, work.responseToken, framed);
    assert.equal((await problemOf(posted, 401)).code, "ATTACH_TOKEN_INVALID");

    // a body shorter than its Content-Length: the client gets a 502 at once, the worker a 400
    const second = invoke(plane, '{"a":2}');
    const work2 = await worker.next();
    const short = JSON.parse(
      await answer(work2.responseToken, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"),
    ) as { status: number; code: string; detail: string };
    assert.deepEqual([short.status, short.code], [400, "ATTACH_FRAMING_INVALID"]);
    assert.match(short.detail, /ended after 3 of its 10 bytes/);
    const failed = await second;
    assert.equal(failed.res.status, 502);
    assert.equal((JSON.parse(failed.text) as { code: string }).code, "WORKER_RESPONSE_INVALID");
  },
);
