// gRPC invocation end to end (issue 9) with @grpc/grpc-js as the client: every call shape through
// grpc-proxy, the worker's tunnel and the example inference server; metadata both ways, trailers,
// errors passing through, deadlines, a client cancel reaching the inference server, messages of
// tens of MiB; grpc-proxy's own refusals; the CONNECT token's rules; a tunnel relayed from the
// replica it reached to the one holding the session; session resumption; idle sessions; graceful
// stop with calls in flight.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { connect as h2connect } from "node:http2";
import { writeFileSync } from "node:fs";
import { connect as netConnect, type Socket } from "node:net";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { jetstreamManager } from "@nats-io/jetstream";
import {
  Metadata,
  credentials,
  status,
  type ClientDuplexStream,
  type ClientReadableStream,
  type ClientWritableStream,
} from "@grpc/grpc-js";
import type { EchoMessage } from "../../../src/gen/callplane/examples/echo_pb.js";
import { WorkerInvokeFunctionRequestSchema } from "../../../src/gen/nvcf/worker_pb.js";
import { fromBinary } from "@bufbuild/protobuf";
import { subjects } from "../../../src/lib/nats/index.js";
import { REQUEST_ID, waitFor } from "../../testkit/client.js";
import { runCli, tmpDir, type Nats } from "../../testkit/index.js";
import { testPki } from "../../testkit/tls.js";
import { freePort } from "../../testkit/plane.js";
import { echoMessage, grpcClient, meta, startGrpcPlane, unary, type EchoClient } from "../../testkit/grpc.js";

const text = (m: EchoMessage | undefined) => Buffer.from(m?.payload ?? []).toString();
const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

function serverStream(c: EchoClient, msg: EchoMessage, md: Metadata, options: Record<string, unknown> = {}) {
  return c.ServerStream(msg, md, options) as ClientReadableStream<EchoMessage>;
}

/** Collects a readable call's messages and its end (status or error). */
function collect(call: ClientReadableStream<EchoMessage> | ClientDuplexStream<EchoMessage, EchoMessage>) {
  return new Promise<{
    messages: EchoMessage[];
    err: (Error & { code?: number; details?: string; metadata?: Metadata }) | null;
    trailers: Metadata | undefined;
  }>((resolve) => {
    const messages: EchoMessage[] = [];
    let err: Error | null = null;
    let trailers: Metadata | undefined;
    call.on("data", (m: EchoMessage) => messages.push(m));
    call.on("error", (e: Error) => (err = e));
    call.on("status", (s: { metadata: Metadata }) => {
      trailers = s.metadata;
      setImmediate(() => resolve({ messages, err, trailers }));
    });
  });
}

function clientStream(c: EchoClient, md: Metadata, messages: EchoMessage[]) {
  return new Promise<{ err: (Error & { code?: number }) | null; value: EchoMessage | undefined }>(
    (resolve) => {
      const call = c.ClientStream(md, (err: Error | null, value: EchoMessage) =>
        resolve({ err, value }),
      ) as ClientWritableStream<EchoMessage>;
      void (async () => {
        for (const m of messages) if (!call.write(m)) await new Promise((r) => call.once("drain", r));
        call.end();
      })();
    },
  );
}

test(
  "every call shape passes through with metadata, trailers and nvcf-reqid; one session per connection",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t);
    const c = grpcClient(t, plane.proxies[0].target);
    const r = await unary(c, echoMessage("hello"), meta(plane.fn, { "x-echo-meta": "m1" }));
    assert.equal(r.err, null, String(r.err?.details));
    assert.equal(text(r.value), "hello");
    assert.equal(
      r.headers?.get("x-echo-meta-received")[0],
      "m1",
      "metadata reaches the inference server and comes back",
    );
    const id = String(r.headers?.get("nvcf-reqid")[0]);
    assert.match(id, REQUEST_ID);
    assert.match(String(r.headers?.get("set-cookie")[0]), new RegExp(`nvcf-request-id=${id}`));
    assert.equal(r.trailers?.get("x-echo-trailer")[0], "done", "trailing metadata passes");

    const ss = await collect(serverStream(c, echoMessage("s", 5), meta(plane.fn)));
    assert.equal(ss.err, null);
    assert.deepEqual(ss.messages.map(text), ["s", "s", "s", "s", "s"]);
    assert.equal(ss.trailers?.get("x-echo-trailer")[0], "done");

    const cs = await clientStream(
      c,
      meta(plane.fn),
      ["a", "b", "c", "d"].map((p) => echoMessage(p)),
    );
    assert.equal(cs.err, null);
    assert.equal(text(cs.value), "abcd");

    const bidi = c.Bidi(meta(plane.fn)) as ClientDuplexStream<EchoMessage, EchoMessage>;
    const got = collect(bidi);
    const seen: string[] = [];
    bidi.on("data", (m: EchoMessage) => seen.push(text(m)));
    for (const p of ["1", "2", "3"]) {
      bidi.write(echoMessage(p));
      await waitFor(`bidi echo of ${p}`, () => seen.includes(p), { timeoutMs: 10_000 });
    }
    bidi.end();
    const b = await got;
    assert.equal(b.err, null);
    assert.deepEqual(
      b.messages.map(text),
      ["1", "2", "3"],
      "each message is answered before the next is sent",
    );

    const again = await unary(c, echoMessage("again"), meta(plane.fn));
    assert.equal(again.headers?.get("nvcf-reqid")[0], id, "every call of the connection reuses the session");
    const other = grpcClient(t, plane.proxies[0].target);
    const o = await unary(other, echoMessage("other"), meta(plane.fn));
    assert.notEqual(o.headers?.get("nvcf-reqid")[0], id, "another connection gets its own session");
  },
);

test("messages of tens of MiB pass both ways intact", { timeout: 90_000 }, async (t) => {
  const plane = await startGrpcPlane(t);
  const c = grpcClient(t, plane.proxies[0].target);
  const big = randomBytes(24 * 1024 * 1024);
  const r = await unary(c, echoMessage(big), meta(plane.fn));
  assert.equal(r.err, null, String(r.err?.details));
  assert.equal(sha(r.value!.payload), sha(big), "a 24 MiB unary message comes back intact");
  const parts = [randomBytes(8 << 20), randomBytes(8 << 20), randomBytes(8 << 20)];
  const cs = await clientStream(
    c,
    meta(plane.fn),
    parts.map((p) => echoMessage(p)),
  );
  assert.equal(
    sha(cs.value!.payload),
    sha(Buffer.concat(parts)),
    "three 8 MiB client-stream messages arrive whole",
  );
  const ss = await collect(serverStream(c, echoMessage(parts[0], 4), meta(plane.fn)));
  assert.equal(ss.messages.length, 4);
  for (const m of ss.messages) assert.equal(sha(m.payload), sha(parts[0]));
});

test(
  "errors of the inference server pass with code, message and trailing metadata; deadlines; a cancel reaches it",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t);
    const c = grpcClient(t, plane.proxies[0].target);
    const e = await unary(c, echoMessage("x"), meta(plane.fn, { "x-echo-status": "7" }));
    assert.equal(e.err?.code, status.PERMISSION_DENIED);
    assert.equal(e.err?.details, "x-echo-status asked for 7");
    assert.equal(e.err?.metadata?.get("x-echo-error")[0], "yes");
    assert.match(String(e.headers?.get("nvcf-reqid")[0]), REQUEST_ID);
    const se = await collect(serverStream(c, echoMessage("x", 3), meta(plane.fn, { "x-echo-status": "9" })));
    assert.equal(
      se.err && (se.err as { code?: number }).code,
      status.FAILED_PRECONDITION,
      "a trailers-only error of a stream",
    );
    assert.equal(se.messages.length, 0);
    assert.equal(se.trailers?.get("x-echo-error")[0], "yes", "the trailers-only answer keeps its metadata");
    assert.match(String(se.trailers?.get("nvcf-reqid")[0]), REQUEST_ID, "and gains nvcf-reqid");

    const d = await unary(c, echoMessage("slow", 0, 3000), meta(plane.fn), { deadline: Date.now() + 300 });
    assert.equal(
      d.err?.code,
      status.DEADLINE_EXCEEDED,
      "grpc-timeout reaches the inference server (or the client gives up)",
    );

    const before = plane.example.stats.cancelled;
    const call = serverStream(c, echoMessage("tick", 1000, 20), meta(plane.fn));
    const done = collect(call);
    await new Promise((r) => call.once("data", r));
    call.cancel();
    const end = await done;
    assert.equal((end.err as { code?: number } | null)?.code, status.CANCELLED);
    await waitFor("the inference server to see the cancel", () => plane.example.stats.cancelled > before, {
      timeoutMs: 10_000,
    });
  },
);

test(
  "refusals: no key, a bad key, no function-id, an unknown function, no worker in time, a full queue, non-gRPC requests",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t, { workers: 0, proxy: { connectTokenTtlMs: 1500 } });
    const target = plane.proxies[0].target;
    const c = grpcClient(t, target);
    const noKey = new Metadata();
    noKey.set("function-id", plane.fn.functionId);
    let r = await unary(c, echoMessage("x"), noKey);
    assert.equal(r.err?.code, status.UNAUTHENTICATED);
    assert.match(String(r.err?.details), /authorization: Bearer <API key>/);
    assert.match(
      String(r.err?.metadata?.get("nvcf-reqid")[0]),
      REQUEST_ID,
      "a refusal carries nvcf-reqid too",
    );
    const badKey = meta(plane.fn);
    badKey.set("authorization", "Bearer nvapi-not-a-key");
    r = await unary(c, echoMessage("x"), badKey);
    assert.equal(r.err?.code, status.UNAUTHENTICATED);
    const noFn = new Metadata();
    noFn.set("authorization", `Bearer ${plane.fn.apiKey}`);
    r = await unary(c, echoMessage("x"), noFn);
    assert.equal(r.err?.code, status.INVALID_ARGUMENT);
    assert.match(String(r.err?.details), /function-id/);
    r = await unary(
      c,
      echoMessage("x"),
      meta({ ...plane.fn, functionId: "7b7d7a8e-0c3e-4c55-9a40-3a4c1c4a1111" }),
    );
    assert.equal(r.err?.code, status.NOT_FOUND);
    r = await unary(c, echoMessage("x"), meta({ ...plane.fn, functionId: "not-a-uuid" }));
    assert.equal(r.err?.code, status.NOT_FOUND);
    // a function of this account with no deployed version
    const admin = await plane.api.adminToken();
    const bare = await fetch(`${plane.api.url}/v2/nvcf/functions`, {
      method: "POST",
      headers: { authorization: `Bearer ${admin}`, "content-type": "application/json" },
      body: JSON.stringify({
        name: `bare-${Date.now()}`,
        inferenceUrl: "/grpc",
        containerImage: "local/grpc-echo",
      }),
    }).then((res) => res.json() as Promise<{ function: { id: string } }>);
    r = await unary(c, echoMessage("x"), meta({ ...plane.fn, functionId: bare.function.id }));
    assert.equal(r.err?.code, status.NOT_FOUND);
    assert.match(String(r.err?.details), /deploy/i);
    r = await unary(c, echoMessage("x"), meta(plane.fn));
    assert.equal(r.err?.code, status.DEADLINE_EXCEEDED, "no worker connected within the token's life");
    assert.match(String(r.err?.details), /failed to establish link to worker/);

    // the same without gRPC: the mapped HTTP status and a plain-text message
    const s = h2connect(`http://${target}`);
    t.after(() => s.destroy());
    const req = s.request({
      ":method": "POST",
      ":path": "/callplane.examples.Echo/Unary",
      "content-type": "application/json",
    });
    req.end("{}");
    const [code, body] = await new Promise<[number, string]>((resolve) => {
      let b = "";
      let st = 0;
      req.on("response", (h) => (st = Number(h[":status"])));
      req.on("data", (d: Buffer) => (b += d.toString()));
      req.on("end", () => resolve([st, b]));
    });
    assert.equal(code, 401);
    assert.match(body, /authorization/);
  },
);

test("a full queue is RESOURCE_EXHAUSTED", { timeout: 90_000 }, async (t) => {
  // the API creates the queue, with its limits: one waiting message
  const plane = await startGrpcPlane(t, { workers: 0, queue: { maxMessages: 1, maxMessageBytes: 1 << 20 } });
  const target = plane.proxies[0].target;
  const first = unary(grpcClient(t, target), echoMessage("x"), meta(plane.fn), {
    deadline: Date.now() + 60_000,
  });
  // the first session's work waits in the queue (no workers); a second connection's does not fit
  await waitFor(
    "the first work message in the queue",
    async () => {
      const nc = await plane.nats.observe();
      try {
        const jsm = await jetstreamManager(nc);
        return (
          (await jsm.streams.info(subjects.stream("test", plane.fn.versionId)).catch(() => undefined))?.state
            .messages === 1
        );
      } finally {
        await nc.close();
      }
    },
    { timeoutMs: 10_000 },
  );
  const r = await unary(grpcClient(t, target), echoMessage("y"), meta(plane.fn));
  assert.equal(r.err?.code, status.RESOURCE_EXHAUSTED);
  assert.match(String(r.err?.details), /queue .* is full/);
  plane.proxies[0].proxy.destroy();
  await first;
});

/** The work message of the session a call started: pulled from the version's queue (no worker runs). */
async function takeWork(nats: Nats, fvid: string) {
  const nc = await nats.observe();
  try {
    const { jetstream } = await import("@nats-io/jetstream");
    // the API made the stream when the function was deployed
    const consumer = await waitFor(
      "the version's work queue",
      () =>
        jetstream(nc)
          .consumers.get(subjects.stream("test", fvid), subjects.consumer("test", fvid))
          .catch(() => undefined),
      { timeoutMs: 10_000 },
    );
    const m = await consumer.next({ expires: 10_000 });
    assert.ok(m, "a work message was queued");
    m.ack();
    const w = fromBinary(WorkerInvokeFunctionRequestSchema, m.data);
    const cfg = w.statefulConfig?.connectionConfigs[0]?.config;
    assert.equal(cfg?.case, "http1Config");
    return {
      requestId: w.requestId,
      token: cfg.value.proxyAuthorizationToken,
      proxyUri: cfg.value.proxyURI!,
    };
  } finally {
    await nc.close();
  }
}

/** Sends a CONNECT to host:port and returns the status line's code (and the socket, still open). */
function connectRaw(host: string, port: number, headers: Record<string, string>) {
  return new Promise<{ status: number; body: string; socket: Socket }>((resolve, reject) => {
    const socket = netConnect({ host, port });
    let buf = "";
    socket.once("error", reject);
    socket.on("data", (d: Buffer) => {
      buf += d.toString("latin1");
      const end = buf.indexOf("\r\n\r\n");
      if (end === -1) return;
      const status = Number(buf.slice(9, 12));
      if (status === 200 || socket.readableEnded) resolve({ status, body: buf.slice(end + 4), socket });
    });
    socket.on("end", () =>
      resolve({ status: Number(buf.slice(9, 12)), body: buf.slice(buf.indexOf("\r\n\r\n") + 4), socket }),
    );
    const lines = Object.entries(headers)
      .map(([k, v]) => `${k}: ${v}\r\n`)
      .join("");
    socket.write(`CONNECT http://${host}:${port}/v1/proxy HTTP/1.1\r\nHost: ${host}:${port}\r\n${lines}\r\n`);
  });
}

test(
  "the CONNECT token: 401 without it, 400 without a request id, 200 once, 403 when reused or expired",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t, {
      workers: 0,
      hosts: ["127.0.70.1", "127.0.70.2"],
      proxy: (i) => ({ connectTokenTtlMs: i === 0 ? 30_000 : 500 }),
    });
    const call = unary(grpcClient(t, plane.proxies[0].target), echoMessage("x"), meta(plane.fn));
    const w = await takeWork(plane.nats, plane.fn.versionId);
    const u = new URL(w.proxyUri);
    assert.equal(
      u.hostname,
      "127-0-70-1.grpc-headless.nvcf.svc.cluster.local",
      "the pod address of the holding replica",
    );
    assert.equal(u.pathname, "/v1/proxy");
    const port = Number(u.port);
    const noAuth = await connectRaw("127.0.70.1", port, { "X-Request-ID": w.requestId });
    assert.equal(noAuth.status, 401);
    assert.match(noAuth.body, /CONNECT_UNAUTHENTICATED/);
    const noId = await connectRaw("127.0.70.1", port, { Authorization: `Bearer ${w.token}` });
    assert.equal(noId.status, 400);
    const wrongId = await connectRaw("127.0.70.1", port, {
      Authorization: `Bearer ${w.token}`,
      "X-Request-ID": "7b7d7a8e-0c3e-4c55-9a40-3a4c1c4a1111",
    });
    assert.equal(wrongId.status, 403, "a token is bound to its request id");
    const ok = await connectRaw("127.0.70.1", port, {
      Authorization: `Bearer ${w.token}`,
      "X-Request-ID": w.requestId,
    });
    assert.equal(ok.status, 200);
    const reused = await connectRaw("127.0.70.1", port, {
      Authorization: `Bearer ${w.token}`,
      "X-Request-ID": w.requestId,
    });
    assert.equal(reused.status, 403, "a token is single-use");
    assert.match(reused.body, /already used, expired/);
    // the tunnel that took the token goes away without serving: the waiting call fails fast
    ok.socket.destroy();
    const r = await call;
    assert.equal(r.err?.code, status.UNAVAILABLE);

    const late = unary(grpcClient(t, plane.proxies[1].target), echoMessage("y"), meta(plane.fn));
    const w2 = await takeWork(plane.nats, plane.fn.versionId);
    await sleep(800); // past the 500 ms life of replica 2's tokens
    const expired = await connectRaw("127.0.70.2", Number(new URL(w2.proxyUri).port), {
      Authorization: `Bearer ${w2.token}`,
      "X-Request-ID": w2.requestId,
    });
    assert.equal(expired.status, 403, "an expired token is refused");
    assert.equal((await late).err?.code, status.DEADLINE_EXCEEDED);
  },
);

test(
  "a tunnel that reaches a replica not holding its session is relayed to the holder",
  { timeout: 90_000 },
  async (t) => {
    const port = await freePort("127.0.70.1");
    const shared = `http://127.0.70.1:${port}/v1/proxy`;
    const plane = await startGrpcPlane(t, {
      hosts: ["127.0.70.1", "127.0.70.2"],
      logs: true,
      proxy: (i) => ({ sharedConnectUrl: shared, ...(i === 0 ? { connectPort: port } : {}) }),
    });
    const c = grpcClient(t, plane.proxies[1].target);
    const r = await unary(c, echoMessage("relayed"), meta(plane.fn));
    assert.equal(r.err, null, String(r.err?.details));
    assert.equal(text(r.value), "relayed");
    const ss = await collect(serverStream(c, echoMessage("more", 3), meta(plane.fn)));
    assert.deepEqual(ss.messages.map(text), ["more", "more", "more"]);
    const relayed = plane
      .logs("proxy-0")
      .filter((l) => l.msg === "relayed a tunnel to the replica that holds it");
    await waitFor(
      "the relay's log line",
      () => plane.logs("proxy-0").some((l) => String(l.msg).startsWith("relayed a tunnel")),
      { timeoutMs: 1 },
    ).catch(() => undefined);
    assert.ok(
      plane.logs("proxy-1").some((l) => l.msg === "tunnel open"),
      "the holder took the tunnel",
    );
    void relayed;
    assert.ok(
      (
        await plane.proxies[0].proxy.registry.getSingleMetric("callplane_grpc_tunnels_total")!.get()
      ).values.some((v) => v.labels.result === "relayed" && v.value === 1),
      "replica 1 relayed exactly one tunnel",
    );
  },
);

test(
  "session resumption: nvcf-reqid (metadata or cookie) reaches the same worker session through any replica",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t, { hosts: ["127.0.70.1", "127.0.70.2"] });
    const a = await unary(grpcClient(t, plane.proxies[0].target), echoMessage("a"), meta(plane.fn));
    const id = String(a.headers?.get("nvcf-reqid")[0]);
    const local = await unary(
      grpcClient(t, plane.proxies[0].target),
      echoMessage("b"),
      meta(plane.fn, { "nvcf-reqid": id }),
    );
    assert.equal(local.err, null);
    assert.equal(
      local.headers?.get("nvcf-reqid")[0],
      id,
      "another connection to the holder joins the session",
    );
    const remote = await unary(
      grpcClient(t, plane.proxies[1].target),
      echoMessage("c"),
      meta(plane.fn, { "nvcf-reqid": id }),
    );
    assert.equal(remote.err, null, String(remote.err?.details));
    assert.equal(text(remote.value), "c");
    assert.equal(remote.headers?.get("nvcf-reqid")[0], id, "another replica reaches the same session");
    const cookie = await unary(
      grpcClient(t, plane.proxies[1].target),
      echoMessage("d"),
      meta(plane.fn, { cookie: `nvcf-request-id=${id}` }),
    );
    assert.equal(cookie.headers?.get("nvcf-reqid")[0], id, "the cookie works like the header");
    const nc = await plane.nats.observe();
    t.after(() => nc.close());
    const info = await (await jetstreamManager(nc)).streams.info(subjects.stream("test", plane.fn.versionId));
    assert.equal(info.state.last_seq, 1, "one work message for the whole session");
    const unknown = await unary(
      grpcClient(t, plane.proxies[1].target),
      echoMessage("e"),
      meta(plane.fn, { "nvcf-reqid": "00000000-0000-8000-8000-000000000000" }),
    );
    assert.equal(unknown.err?.code, status.NOT_FOUND);
    assert.match(String(unknown.err?.details), /no existing session found/);
  },
);

test(
  "an idle session closes and the next call starts a new one; graceful stop lets calls in flight finish",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t, { proxy: { sessionIdleMs: 300 } });
    const { proxy, target } = plane.proxies[0];
    const c = grpcClient(t, target);
    const first = await unary(c, echoMessage("1"), meta(plane.fn));
    const open = () => proxy.registry.getSingleMetric("callplane_grpc_sessions_open")!.get();
    await waitFor("the idle session to close", async () => (await open()).values[0]?.value === 0, {
      timeoutMs: 10_000,
    });
    const second = await unary(c, echoMessage("2"), meta(plane.fn));
    assert.equal(second.err, null, String(second.err?.details));
    assert.notEqual(second.headers?.get("nvcf-reqid")[0], first.headers?.get("nvcf-reqid")[0]);

    const call = serverStream(c, echoMessage("s", 8, 100), meta(plane.fn));
    const done = collect(call);
    await new Promise((r) => call.once("data", r));
    const closing = proxy.close(20_000);
    const end = await done;
    assert.equal(end.err, null, "the call in flight finished");
    assert.equal(end.messages.length, 8);
    await closing;
    const after = await unary(grpcClient(t, target), echoMessage("late"), meta(plane.fn), {
      deadline: Date.now() + 5000,
    });
    assert.equal(after.err?.code, status.UNAVAILABLE, "a stopped replica takes no new calls");
  },
);

test(
  "a call still running when the stop's grace is over ends with UNAVAILABLE, never with a reset",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t);
    const { proxy, target } = plane.proxies[0];
    const c = grpcClient(t, target);
    // 40 messages 100 ms apart: four seconds, far past a 300 ms grace
    const call = serverStream(c, echoMessage("s", 40, 100), meta(plane.fn));
    const done = collect(call);
    await new Promise((r) => call.once("data", r));
    const started = Date.now();
    await proxy.close(300);
    const end = await done;
    // grpc-proxy's own status, as trailers: not a dropped connection ("Connection dropped"), and
    // not a reset, which reaches the client as INTERNAL ("Received RST_STREAM with code 2")
    assert.equal(end.err?.code, status.UNAVAILABLE, `${end.err?.code} ${end.err?.details}`);
    assert.match(end.err?.details ?? "", /tunnel for session [0-9a-f-]{36} closed during the call; retry/);
    assert.ok(end.messages.length >= 1 && end.messages.length < 40, `${end.messages.length} messages`);
    assert.ok(Date.now() - started < 10_000, "the stop did not wait for the call");
  },
);

test(
  "bin/callplane invoke --grpc calls a function's Echo/Unary through grpc-proxy and says what failed",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t);
    const env = {
      CALLPLANE_GRPC_URL: `http://${plane.proxies[0].target}`,
      CALLPLANE__GLOBAL__DATA_DIR: "/nonexistent",
    };
    const ok = await runCli(
      ["invoke", plane.fn.functionId, "--grpc", "--data", "from the CLI", "--api-key", plane.fn.apiKey],
      { env },
    );
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal(ok.stdout, "from the CLI");
    const bad = await runCli(
      ["invoke", plane.fn.functionId, "--grpc", "--data", "x", "--api-key", "nvapi-wrong"],
      { env },
    );
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /answered UNAUTHENTICATED: .*\(GRPC_UNAUTHENTICATED\)/);
    assert.match(bad.stderr, /hint: the API key from --api-key was refused; request id [0-9a-f-]{36}/);
  },
);

test("TLS with ALPN h2 on the client listener, when configured", { timeout: 90_000 }, async (t) => {
  const pki = await testPki();
  const cert = await pki.issue(["grpc.callplane.test"]);
  const dir = tmpDir(t, "callplane-grpc-tls-");
  writeFileSync(join(dir, "tls.crt"), cert.certPem);
  writeFileSync(join(dir, "tls.key"), cert.keyPem);
  const plane = await startGrpcPlane(t, {
    proxy: { clientTls: { certFile: join(dir, "tls.crt"), keyFile: join(dir, "tls.key") } },
  });
  const c = grpcClient(
    t,
    plane.proxies[0].target,
    { "grpc.ssl_target_name_override": "grpc.callplane.test" },
    credentials.createSsl(Buffer.from(pki.ca.certPem)),
  );
  const r = await unary(c, echoMessage("over TLS"), meta(plane.fn));
  assert.equal(r.err, null, String(r.err?.details));
  assert.equal(text(r.value), "over TLS");
  // cleartext HTTP/2 is not served there
  const plain = await unary(grpcClient(t, plane.proxies[0].target), echoMessage("x"), meta(plane.fn), {
    deadline: Date.now() + 5000,
  });
  assert.equal(plain.err?.code, status.UNAVAILABLE);
});

test(
  "flow control holds end to end: a client that stops reading stops the inference server's writes",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t);
    const c = grpcClient(t, plane.proxies[0].target);
    const total = 400;
    const payload = randomBytes(1 << 20);
    const before = plane.example.stats.streamed;
    const call = serverStream(c, echoMessage(payload, total), meta(plane.fn));
    let received = 0;
    let intact = true;
    call.on("data", (m: EchoMessage) => {
      received++;
      if (Buffer.compare(Buffer.from(m.payload), payload) !== 0) intact = false;
      if (received === 2) call.pause();
    });
    const done = new Promise<void>((resolve, reject) => {
      call.on("end", () => resolve());
      call.on("error", reject);
    });
    // the server runs ahead of the paused client only as far as the windows and buffers of the
    // hops allow (1 MiB per stream each, plus stream buffers), then waits for drain
    let last = -1;
    const ahead = await waitFor(
      "the inference server to stop writing",
      async () => {
        const now = plane.example.stats.streamed - before;
        const stable = now === last;
        last = now;
        await sleep(300);
        return stable && now > 2 ? now : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 1 },
    );
    assert.ok(
      ahead < total / 4,
      `the server wrote ${ahead} of ${total} 1 MiB messages to a client that read 2`,
    );
    t.diagnostic(`a paused client held the inference server at ${ahead} of ${total} messages (1 MiB each)`);
    call.resume();
    await done;
    assert.equal(received, total);
    assert.ok(intact, "every message arrived intact");
  },
);
