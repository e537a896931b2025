// End-to-end tracing (issue 23), against a small OTLP/HTTP JSON receiver on loopback: each kind of
// invocation is one trace whose spans chain client → replica → publish → worker → inference server
// (whose received traceparent names the worker's span) → callback → replica, with the request id on
// every span; a callback that lands on the wrong replica (through the callback proxy) shows the
// relay between; a client's own traceparent is continued; a gRPC call chains the same way through
// grpc-proxy, the worker's tunnel and the inference server; sampling ratio 0 records nothing.
import assert from "node:assert/strict";
import type { IncomingMessage, ServerResponse } from "node:http";
import { randomBytes } from "node:crypto";
import { test } from "node:test";
import type { Metadata } from "@grpc/grpc-js";
import { handle as exampleHandler } from "../../../examples/inference-server.js";
import { dashIp } from "../../../src/lib/net/index.js";
import { ATTR, startTracing, type SpanRecord, type TracingSettings } from "../../../src/lib/tracing/index.js";
import { bearer, waitFor } from "../../testkit/client.js";
import { echoMessage, grpcClient, meta, startGrpcPlane, unary } from "../../testkit/grpc.js";
import { startOtlpReceiver, type OtlpReceiver } from "../../testkit/otlp.js";
import { freePort, POSTED_ANSWERS, startPlane } from "../../testkit/plane.js";

const LIMIT = { timeout: 120_000 };
const HOSTS = ["127.0.53.1", "127.0.53.2"];
const INVOKE = "POST /v2/nvcf/pexec/functions/:fid";
const ATTACH = "POST /v2/nvcf/worker/request-attach";
const POLL = "GET /v2/nvcf/pexec/status/:requestId";

/** What the inference server got: each request's traceparent, by its NVCF-REQID. */
const received = new Map<string, string>();
function recordingHandler(req: IncomingMessage, res: ServerResponse): void {
  const id = req.headers["nvcf-reqid"];
  const tp = req.headers.traceparent;
  if (typeof id === "string" && typeof tp === "string") received.set(id, tp);
  exampleHandler(req, res);
}

const hex = (bytes: number) => randomBytes(bytes).toString("hex");

async function invoke(
  url: string,
  key: string,
  headers: Record<string, string> = {},
  body = '{"hello":"trace"}',
): Promise<{ status: number; requestId: string; text: string }> {
  const res = await fetch(url, {
    method: "POST",
    headers: bearer(key, { "content-type": "application/json", ...headers }),
    body,
    signal: AbortSignal.timeout(30_000),
  });
  const text = await res.text();
  return { status: res.status, requestId: res.headers.get("nvcf-reqid") ?? "", text };
}

/** Every span of the traces that hold a span of `requestId`, once `ready` says they are complete. */
function traceOf(
  receiver: OtlpReceiver,
  requestId: string,
  ready: (spans: SpanRecord[]) => boolean,
): Promise<SpanRecord[]> {
  return waitFor(
    `the spans of ${requestId}`,
    () => {
      const all = receiver.spans();
      const ids = new Set(
        all.filter((s) => s.attributes[ATTR.requestId] === requestId).map((s) => s.traceId),
      );
      const spans = all.filter((s) => ids.has(s.traceId));
      return ready(spans) ? spans : undefined;
    },
    {
      timeoutMs: 30_000,
      onTimeout: () =>
        receiver
          .spans()
          .filter((s) => s.attributes[ATTR.requestId] === requestId)
          .map((s) => `${s.service} ${s.name}`)
          .join("; "),
    },
  );
}

/** The one span under `parent` that `is`, or a failure naming what is there. */
function childOf(
  spans: SpanRecord[],
  parent: SpanRecord,
  what: string,
  is: (s: SpanRecord) => boolean,
): SpanRecord {
  const found = spans.filter(
    (s) => s.parentSpanId === parent.spanId && s.traceId === parent.traceId && is(s),
  );
  assert.equal(
    found.length,
    1,
    `${what} under ${parent.service} "${parent.name}": found ${found.length}; its children are ${spans
      .filter((s) => s.parentSpanId === parent.spanId)
      .map((s) => `${s.service} "${s.name}"`)
      .join(", ")}`,
  );
  return found[0];
}

/**
 * The chain of one HTTP invocation: the replica's span, its publish, the worker's span (under the
 * publish, linked to it), the inference call (its traceparent is what the server got), and under
 * the worker's span each callback with the replica's span for it (and, relayed, the relay and the
 * holder's span). Every span carries the request id. Returns the replica's span.
 */
function assertChain(
  spans: SpanRecord[],
  requestId: string,
  opts: { relayed?: boolean; callbacks?: (n: number) => boolean } = {},
): { server: SpanRecord; work: SpanRecord; attaches: SpanRecord[] } {
  const servers = spans.filter((s) => s.name === INVOKE && s.attributes[ATTR.requestId] === requestId);
  assert.equal(servers.length, 1, "one replica span for the invocation");
  const server = servers[0];
  assert.equal(server.kind, "server");
  assert.equal(server.service, "invocation");
  const trace = spans.filter((s) => s.traceId === server.traceId);
  for (const s of trace)
    assert.equal(s.attributes[ATTR.requestId], requestId, `${s.service} "${s.name}" carries the request id`);
  const publish = childOf(trace, server, "the publish", (s) => s.kind === "producer");
  assert.equal(publish.attributes["messaging.system"], "nats");
  const work = childOf(
    trace,
    publish,
    "the worker's span",
    (s) => s.kind === "consumer" && s.service === "worker",
  );
  assert.ok(
    work.links.some((l) => l.spanId === publish.spanId),
    "the worker's span links to the creation context",
  );
  assert.equal(work.attributes[ATTR.functionId], server.attributes[ATTR.functionId]);
  const inference = childOf(
    trace,
    work,
    "the inference call",
    (s) => s.kind === "client" && s.name.startsWith("POST /"),
  );
  assert.equal(
    received.get(requestId),
    `00-${server.traceId}-${inference.spanId}-01`,
    "the inference server's traceparent names the worker's span for the call",
  );
  const callbacks = trace.filter((s) => s.parentSpanId === work.spanId && s.name === "POST request-attach");
  assert.ok((opts.callbacks ?? ((n) => n === 1))(callbacks.length), `${callbacks.length} callbacks`);
  const attaches: SpanRecord[] = [];
  for (const cb of callbacks) {
    assert.equal(cb.kind, "client");
    const first = childOf(trace, cb, "the replica's span for the callback", (s) => s.name === ATTACH);
    if (opts.relayed) {
      const relay = childOf(trace, first, "the relay", (s) => s.name === "relay POST request-attach");
      attaches.push(childOf(trace, relay, "the holder's span for the callback", (s) => s.name === ATTACH));
    } else attaches.push(first);
  }
  return { server, work, attaches };
}

test(
  "each kind of invocation is one trace from the client to the inference server and back",
  LIMIT,
  async (t) => {
    const receiver = await startOtlpReceiver(t);
    const settings: TracingSettings = { endpoint: receiver.endpoint, sampleRatio: 1, file: "" };
    const tracings = await Promise.all(
      HOSTS.map((h) => startTracing({ service: "invocation", instance: h, settings, exportDelayMs: 100 })),
    );
    t.after(() => Promise.all(tracings.map((x) => x.shutdown())));
    // Replica 2 hands workers replica 1's pod address: its callbacks reach replica 1 through the
    // callback proxy and are relayed to it.
    const podPort = await freePort(HOSTS[0]);
    const plane = await startPlane(t, {
      replicas: 2,
      replicaHosts: HOSTS,
      proxy: { podPort },
      relay: { enabled: true },
      replica: (i) => ({
        tracing: tracings[i],
        ...(i === 1
          ? { selfAddress: `http://${dashIp(HOSTS[0])}.invocation.nvcf.svc.cluster.local:${podPort}` }
          : {}),
      }),
      // every answer posted through the proxy (none over NATS): these traces follow the callbacks
      workerEnv: { CALLPLANE_TRACING_ENDPOINT: receiver.endpoint, ...POSTED_ANSWERS },
      inferenceHandler: recordingHandler,
    });

    await t.test("an HTTP invocation", async () => {
      const r = await invoke(plane.invokeUrl(0), plane.fn.apiKey);
      assert.equal(r.status, 200, r.text);
      const spans = await traceOf(receiver, r.requestId, (s) => s.length >= 6);
      assert.equal(spans.length, 6, spans.map((s) => s.name).join(", "));
      const { server, attaches } = assertChain(spans, r.requestId);
      assert.equal(server.parentSpanId, undefined, "a request without traceparent starts a trace");
      assert.equal(server.attributes["http.response.status_code"], 200);
      assert.equal(attaches[0].attributes["http.response.status_code"], 200);
      // the callback went through the proxy, which logged the worker's trace id
      const line = await waitFor("the proxy's access line", () =>
        plane.proxy!.accessLog().find((l) => l.traceId === server.traceId),
      );
      assert.equal(line.outcome, "forwarded");
    });

    await t.test("a client's traceparent is continued", async () => {
      const traceId = hex(16);
      const parent = hex(8);
      const r = await invoke(plane.invokeUrl(0), plane.fn.apiKey, {
        traceparent: `00-${traceId}-${parent}-01`,
      });
      assert.equal(r.status, 200, r.text);
      const spans = await traceOf(receiver, r.requestId, (s) => s.length >= 6);
      const { server } = assertChain(spans, r.requestId);
      assert.equal(server.traceId, traceId);
      assert.equal(server.parentSpanId, parent);
    });

    await t.test("an SSE invocation", async () => {
      const sse = await plane.addFunction({ inferenceUrl: "/sse" });
      const url = `${sse.invokeUrl(0)}?events=3&intervalMs=50`;
      const r = await invoke(url, sse.fn.apiKey, { accept: "text/event-stream" });
      assert.equal(r.status, 200, r.text);
      assert.match(r.text, /data:/);
      const spans = await traceOf(receiver, r.requestId, (s) => s.length >= 6);
      const { work } = assertChain(spans, r.requestId);
      const inference = spans.find((s) => s.parentSpanId === work.spanId && s.name.startsWith("POST /sse"))!;
      // the inference call's span lasts until the stream has been read: at least the events' gaps
      assert.ok(inference.end - inference.start >= 100_000_000n, "the inference span covers the stream");
    });

    await t.test("a 202 then polls", async () => {
      const slow = await plane.addFunction({ inferenceUrl: "/slow" });
      const first = await invoke(`${slow.invokeUrl(0)}?seconds=3&progressMs=5000`, slow.fn.apiKey, {
        "nvcf-poll-seconds": "1",
      });
      assert.equal(first.status, 202, first.text);
      let last = first;
      while (last.status === 202) {
        const res = await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${first.requestId}`, {
          headers: bearer(slow.fn.apiKey, { "nvcf-poll-seconds": "5" }),
          signal: AbortSignal.timeout(30_000),
        });
        last = { status: res.status, requestId: first.requestId, text: await res.text() };
      }
      assert.equal(last.status, 200, last.text);
      // the invocation's trace holds the 202's callback and the final answer's, each with its replica span
      const spans = await traceOf(
        receiver,
        first.requestId,
        (s) => s.some((x) => x.kind === "consumer") && s.filter((x) => x.name === ATTACH).length >= 2,
      );
      const { server, attaches } = assertChain(spans, first.requestId, { callbacks: (n) => n >= 2 });
      assert.ok(attaches.length >= 2);
      // each poll is a request of its own, a trace of its own, named by the request id
      const polls = spans.filter((s) => s.name === POLL);
      assert.ok(polls.length >= 1, "the status polls have spans");
      for (const p of polls) {
        assert.notEqual(p.traceId, server.traceId);
        assert.equal(p.attributes[ATTR.requestId], first.requestId);
      }
    });

    await t.test(
      "a callback relayed to the replica that holds the request, through the callback proxy",
      async () => {
        const r = await invoke(plane.invokeUrl(1), plane.fn.apiKey);
        assert.equal(r.status, 200, r.text);
        const spans = await traceOf(receiver, r.requestId, (s) => s.length >= 8);
        assert.equal(spans.length, 8, spans.map((s) => `${s.service} ${s.name}`).join(", "));
        const { attaches } = assertChain(spans, r.requestId, { relayed: true });
        assert.equal(attaches[0].attributes["http.response.status_code"], 200);
      },
    );

    await t.test("a body past the inline part: the worker's GET request-attach is a span too", async () => {
      const big = JSON.stringify({ pad: hex(40 * 1024) });
      const r = await invoke(plane.invokeUrl(0), plane.fn.apiKey, {}, big);
      assert.equal(r.status, 200);
      const spans = await traceOf(receiver, r.requestId, (s) => s.length >= 8);
      const { work } = assertChain(spans, r.requestId);
      const get = childOf(spans, work, "the body fetch", (s) => s.name === "GET request-attach");
      childOf(
        spans,
        get,
        "the replica's span for it",
        (s) => s.name === "GET /v2/nvcf/worker/request-attach",
      );
    });

    assert.equal(receiver.refused, 0);
  },
);

test(
  "a gRPC call is one trace through grpc-proxy, the worker's tunnel and the inference server",
  LIMIT,
  async (t) => {
    const receiver = await startOtlpReceiver(t);
    const tracing = await startTracing({
      service: "grpc-proxy",
      settings: { endpoint: receiver.endpoint, sampleRatio: 1, file: "" },
      exportDelayMs: 100,
    });
    t.after(() => tracing.shutdown());
    const plane = await startGrpcPlane(t, {
      // the session ends soon after the call, and with it the worker's span for it
      proxy: { tracing, sessionIdleMs: 300 },
      workerEnv: {
        CALLPLANE_TRACING_ENDPOINT: receiver.endpoint,
        CALLPLANE_SESSION_RECONNECT_WAIT_SECONDS: "0",
      },
      logs: true,
    });
    const client = grpcClient(t, plane.proxies[0].target);
    const traceId = hex(16);
    const parent = hex(8);
    const md: Metadata = meta(plane.fn, { traceparent: `00-${traceId}-${parent}-01` });
    const r = await unary(client, echoMessage("traced"), md);
    assert.equal(r.err, null);
    const requestId = String(r.headers?.get("nvcf-reqid")[0] ?? "");
    assert.ok(requestId, "the call's answer names its session");
    const spans = await traceOf(
      receiver,
      requestId,
      (s) => s.some((x) => x.kind === "consumer") && s.some((x) => x.name === "CONNECT /v1/proxy"),
    );
    const call = spans.find((s) => s.name === "callplane.examples.Echo/Unary" && s.service === "grpc-proxy")!;
    assert.ok(call, "grpc-proxy's span for the call");
    assert.equal(call.traceId, traceId, "the client's traceparent is continued");
    assert.equal(call.parentSpanId, parent);
    assert.equal(call.kind, "server");
    assert.equal(call.attributes["rpc.grpc.status_code"], 0);
    const trace = spans.filter((s) => s.traceId === traceId);
    for (const s of trace) assert.equal(s.attributes[ATTR.requestId], requestId, `${s.service} "${s.name}"`);
    const publish = childOf(trace, call, "the session's publish", (s) => s.kind === "producer");
    const work = childOf(
      trace,
      publish,
      "the worker's span",
      (s) => s.kind === "consumer" && s.service === "worker",
    );
    const open = childOf(trace, work, "the worker's tunnel", (s) => s.name === "CONNECT tunnel");
    childOf(
      trace,
      open,
      "grpc-proxy's side of the tunnel",
      (s) => s.name === "CONNECT /v1/proxy" && s.service === "grpc-proxy",
    );
    const inference = childOf(
      trace,
      call,
      "the worker's call to the inference server",
      (s) => s.service === "worker" && s.kind === "client",
    );
    assert.ok(
      inference.links.some((l) => l.spanId === work.spanId),
      "linked to the session's span",
    );
    assert.equal(
      String(r.headers?.get("x-echo-traceparent")[0]),
      `00-${traceId}-${inference.spanId}-01`,
      "the inference server's traceparent names the worker's span for the call",
    );
    // the worker's log lines about the request carry its trace id
    const tunnelOpen = plane
      .logs("worker-0")
      .find((l) => l.msg === "tunnel open" && l.requestId === requestId);
    assert.equal(tunnelOpen?.traceId, traceId);
  },
);

test("a small answer sent over NATS is the worker's span, under its work", LIMIT, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const tracing = await startTracing({
    service: "invocation",
    settings: { endpoint: receiver.endpoint, sampleRatio: 1, file: "" },
    exportDelayMs: 100,
  });
  t.after(() => tracing.shutdown());
  const plane = await startPlane(t, {
    invocation: { tracing },
    workerEnv: { CALLPLANE_TRACING_ENDPOINT: receiver.endpoint },
    inferenceHandler: recordingHandler,
  });
  const r = await invoke(plane.invokeUrl(), plane.fn.apiKey);
  assert.equal(r.status, 200, r.text);
  const spans = await traceOf(receiver, r.requestId, (s) =>
    s.some((x) => x.name.startsWith("send callplane")),
  );
  const { work } = assertChain(spans, r.requestId, { callbacks: (n) => n === 0 });
  const answer = childOf(spans, work, "the answer over NATS", (s) => s.name === "send callplane.answer.*");
  assert.equal(answer.kind, "client");
  assert.equal(answer.attributes["http.response.status_code"], 200);
  assert.equal(answer.attributes[ATTR.requestId], r.requestId);
});

test("sampling ratio 0 records nothing, and tells the next hops so", LIMIT, async (t) => {
  const receiver = await startOtlpReceiver(t);
  const tracing = await startTracing({
    service: "invocation",
    settings: { endpoint: receiver.endpoint, sampleRatio: 0, file: "" },
    exportDelayMs: 100,
  });
  t.after(() => tracing.shutdown());
  const plane = await startPlane(t, {
    invocation: { tracing },
    workerEnv: { CALLPLANE_TRACING_ENDPOINT: receiver.endpoint, CALLPLANE_TRACING_SAMPLE_RATIO: "0" },
    inferenceHandler: recordingHandler,
  });
  for (let i = 0; i < 3; i++) {
    const r = await invoke(plane.invokeUrl(), plane.fn.apiKey);
    assert.equal(r.status, 200, r.text);
    // the worker's span is not sampled either: the flag says so to the inference server
    assert.match(received.get(r.requestId) ?? "", /^00-[0-9a-f]{32}-[0-9a-f]{16}-00$/);
  }
  await tracing.flush();
  assert.deepEqual(receiver.spans(), []);
});
