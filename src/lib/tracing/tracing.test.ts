import assert from "node:assert/strict";
import { test } from "node:test";
import { InMemorySpanExporter } from "@opentelemetry/sdk-trace";
import { SpanKind } from "@opentelemetry/api";
import { Tracing } from "./tracing.js";

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN = "00f067aa0ba902b7";

function tracing(sampleRatio: number): { t: Tracing; exported: InMemorySpanExporter } {
  const exported = new InMemorySpanExporter();
  const t = new Tracing({
    service: "test",
    settings: { endpoint: "", sampleRatio, file: "" },
    exporters: [exported],
    exportDelayMs: 10,
  });
  return { t, exported };
}

test("under an unsampled parent no hop records, and each passes the parent's traceparent on", async () => {
  const { t, exported } = tracing(1);
  const server = t.continueFrom({ traceparent: `00-${TRACE}-${SPAN}-00` }, "POST /x", SpanKind.SERVER);
  const publish = server.child("send rq", SpanKind.PRODUCER, { "messaging.system": "nats" });
  const worker = t.consume(publish.inject({}), "process rq");
  const call = worker.child("POST /echo", SpanKind.CLIENT);
  for (const s of [server, publish, worker, call]) {
    assert.equal(s.recording, false);
    assert.equal(s.traceId, TRACE);
  }
  assert.deepEqual(call.inject({}), { traceparent: `00-${TRACE}-${SPAN}-00` });
  // settle and until hand the call back untouched, and nothing is exported
  const done = Promise.resolve({ statusCode: 200 });
  assert.equal(call.settle(done), done);
  for (const s of [call, worker, publish, server]) s.end();
  await t.flush();
  assert.deepEqual(exported.getFinishedSpans(), []);
  await t.shutdown();
});

test("under a sampled parent every hop records a span of its own, in one trace", async () => {
  const { t, exported } = tracing(0);
  const server = t.continueFrom({ traceparent: `00-${TRACE}-${SPAN}-01` }, "POST /x", SpanKind.SERVER);
  const publish = server.child("send rq", SpanKind.PRODUCER);
  const worker = t.consume(publish.inject({}), "process rq");
  const call = worker.child("POST /echo", SpanKind.CLIENT);
  assert.equal(call.recording, true);
  const headers: Record<string, string> = {};
  assert.match(call.inject(headers).traceparent ?? "", new RegExp(`^00-${TRACE}-[0-9a-f]{16}-01$`));
  await call.settle(Promise.resolve({ statusCode: 200 }));
  for (const s of [worker, publish, server]) s.end();
  await new Promise((r) => setImmediate(r));
  await t.flush();
  const spans = exported.getFinishedSpans();
  assert.deepEqual(spans.map((s) => s.name).sort(), ["POST /echo", "POST /x", "process rq", "send rq"]);
  assert.ok(spans.every((s) => s.spanContext().traceId === TRACE));
  assert.equal(new Set(spans.map((s) => s.spanContext().spanId)).size, 4);
  await t.shutdown();
});

test("a new trace is recorded by the sampling ratio: 0 records none, 1 records it", async () => {
  for (const [ratio, recorded] of [
    [0, false],
    [1, true],
  ] as const) {
    const { t } = tracing(ratio);
    const s = t.continueFrom({}, "POST /x", SpanKind.SERVER);
    assert.equal(s.recording, recorded);
    assert.equal(s.child("send rq", SpanKind.PRODUCER).recording, recorded);
    s.end();
    await t.shutdown();
  }
});
