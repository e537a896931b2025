// `callplane trace <request id>` (issue 23) against a real span file: two services' tracers (as two
// processes of a stack would) append their spans to one file through the span file exporter, and
// the built CLI shows the request's trace as a timeline: the trace id, then one line per span with
// its offset, duration, service and name, children under their parent. Also: JSON output, the
// stack.json that `npm start` writes naming the file, and the refusals.
import assert from "node:assert/strict";
import { appendFileSync, mkdirSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { randomUUID } from "node:crypto";
import { ATTR, decodeTraces, readSpanFile, requestSpansInFile } from "../../../src/lib/tracing/index.js";
import { runCli, tmpDir } from "../../testkit/index.js";
import { TRACE_FVID as FVID, writeTrace } from "../../testkit/traces.js";

test("callplane trace shows a request's spans from a span file as a timeline", async (t) => {
  const dir = tmpDir(t);
  const file = join(dir, "traces", "spans.jsonl");
  const requestId = randomUUID();
  const traceId = await writeTrace(file, requestId);
  // another request's trace in the same file is not shown
  await writeTrace(file, randomUUID());
  assert.equal(readSpanFile(file).length, 12, "each line of the file is an OTLP/JSON export");

  const r = await runCli(["trace", requestId, "--file", file, "--wait", "0"]);
  assert.equal(r.code, 0, r.stderr);
  const lines = r.stdout.trimEnd().split("\n");
  assert.match(lines[0], new RegExp(`^trace ${traceId}  .*, 6 spans, invocation, worker$`));
  assert.match(lines[1], /offset\s+duration\s+service\s+timeline\s+span/);
  const rows = lines.slice(2);
  assert.equal(rows.length, 6);
  // tree order, each child indented under its parent
  const names = rows.map((l) => /\|[ #]+\| {2}(.*)$/.exec(l)?.[1]);
  assert.deepEqual(names, [
    "POST /v2/nvcf/pexec/functions/:fid",
    `  send rq.local.${FVID}.*`,
    `    process rq.local.${FVID}.*`,
    "      POST /echo",
    "      POST request-attach",
    "        POST /v2/nvcf/worker/request-attach",
  ]);
  assert.match(rows[0], /^\s+0\.00 ms\s+\d+\.\d+ ms\s+invocation\s+\|#+\s*\|/);
  assert.match(rows[3], /\bworker\b/);

  const j = await runCli(["trace", requestId, "--file", file, "--json"]);
  assert.equal(j.code, 0, j.stderr);
  const doc = JSON.parse(j.stdout) as {
    requestId: string;
    traces: Array<{
      traceId: string;
      spans: Array<{ name: string; service: string; attributes: Record<string, unknown> }>;
    }>;
  };
  assert.equal(doc.requestId, requestId);
  assert.equal(doc.traces.length, 1);
  assert.equal(doc.traces[0].traceId, traceId);
  for (const s of doc.traces[0].spans) assert.equal(s.attributes["nvcf.request.id"], requestId, s.name);
});

test("callplane trace finds the span file the local stack names in stack.json, and a client's trace id", async (t) => {
  const dir = tmpDir(t);
  const file = join(dir, ".callplane", "traces", "spans.jsonl");
  const requestId = randomUUID();
  const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736";
  const traceId = await writeTrace(file, requestId, `00-${clientTrace}-00f067aa0ba902b7-01`);
  assert.equal(traceId, clientTrace);
  mkdirSync(join(dir, ".callplane"), { recursive: true });
  writeFileSync(
    join(dir, ".callplane", "stack.json"),
    JSON.stringify({ api: "http://127.0.0.1:1", dataDir: join(dir, ".callplane"), tracing: { file } }),
  );
  const r = await runCli(["trace", requestId, "--wait", "0"], {
    cwd: dir,
    env: { CALLPLANE__GLOBAL__DATA_DIR: "" },
  });
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, new RegExp(`^trace ${clientTrace} `));
  // the client's own span is not in the file: the replica's span is the root shown
  assert.match(r.stdout.split("\n")[2], /\| {2}POST \/v2\/nvcf\/pexec\/functions\/:fid$/);
});

test("a request's spans are found by a search of the span file and the one it rotated to", async (t) => {
  const dir = tmpDir(t);
  const file = join(dir, "spans.jsonl");
  const older = randomUUID();
  const olderTrace = await writeTrace(file, older);
  renameSync(file, `${file}.1`);
  const requestId = randomUUID();
  const traceId = await writeTrace(file, requestId);
  await writeTrace(file, randomUUID());
  // a span of the same trace from a service that does not name the request (an inference server)
  const inference = {
    v: 1,
    resource: { "service.name": "inference" },
    spans: [{ traceId, spanId: "1111222233334444", name: "infer", kind: 1, start: "1", end: "2" }],
  };
  appendFileSync(file, `${JSON.stringify(inference)}\n`);
  const all = readSpanFile(file);
  assert.equal(all.length, 19, "three traces of six spans and one more, in the file and its .1");
  // what the search finds is what parsing everything finds, for each request
  for (const [id, trace] of [
    [requestId, traceId],
    [older, olderTrace],
  ]) {
    const found = requestSpansInFile(file, id);
    const expected = all.filter((s) => s.traceId === trace);
    assert.deepEqual(
      found.map((s) => s.spanId).sort(),
      expected.map((s) => s.spanId).sort(),
      "every span of the request's trace, the ones that do not name the request too",
    );
  }
  assert.ok(
    requestSpansInFile(file, requestId).some((s) => s.attributes[ATTR.requestId] === undefined),
    "a span of the trace that does not name the request is found through its trace id",
  );
  assert.deepEqual(requestSpansInFile(file, randomUUID()), []);
  assert.deepEqual(requestSpansInFile(join(dir, "absent.jsonl"), requestId), []);
});

test("callplane trace refuses what it cannot show, saying why", async (t) => {
  const dir = tmpDir(t);
  const file = join(dir, "spans.jsonl");
  await writeTrace(file, randomUUID());
  const missing = randomUUID();
  const none = await runCli(["trace", missing, "--file", file, "--wait", "0"]);
  assert.equal(none.code, 1);
  assert.match(
    none.stderr,
    new RegExp(`no span of request ${missing} in .*spans\\.jsonl \\(TRACE_NOT_FOUND\\)`),
  );
  assert.match(none.stderr, /observability\.tracing/);

  const bad = await runCli(["trace", "not-a-request", "--file", file]);
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /is not a request id .*\(USAGE\)/);

  const nowhere = await runCli(["trace", missing], { cwd: dir, env: { CALLPLANE__GLOBAL__DATA_DIR: "" } });
  assert.equal(nowhere.code, 1);
  assert.match(nowhere.stderr, /TRACE_SOURCE_MISSING/);
  assert.match(nowhere.stderr, /npm start/);
});

test("span records read back from OTLP/JSON whether ids are hex or base64 (Tempo)", () => {
  const spans = decodeTraces({
    batches: [
      {
        resource: { attributes: [{ key: "service.name", value: { stringValue: "worker" } }] },
        scopeSpans: [
          {
            spans: [
              {
                traceId: Buffer.from("4bf92f3577b34da6a3ce929d0e0e4736", "hex").toString("base64"),
                spanId: Buffer.from("00f067aa0ba902b7", "hex").toString("base64"),
                name: "x",
                kind: "SPAN_KIND_CONSUMER",
                startTimeUnixNano: "1000",
                endTimeUnixNano: "3000",
                attributes: [{ key: "n", value: { intValue: "7" } }],
                status: { code: "STATUS_CODE_ERROR", message: "boom" },
              },
            ],
          },
        ],
      },
    ],
  });
  assert.equal(spans.length, 1);
  assert.equal(spans[0].traceId, "4bf92f3577b34da6a3ce929d0e0e4736");
  assert.equal(spans[0].spanId, "00f067aa0ba902b7");
  assert.equal(spans[0].kind, "consumer");
  assert.equal(spans[0].service, "worker");
  assert.equal(spans[0].end - spans[0].start, 2000n);
  assert.equal(spans[0].attributes.n, 7);
  assert.equal(spans[0].status, "error");
});
