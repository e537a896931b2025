// The console's request page shows a request's trace when tracing is on (issue 24: "a lookup by
// request id ... with its trace when tracing is on"): read from the span file the services write,
// as `npm start` has them, or said plainly why there is none (tracing off, not sampled, a query API
// that does not answer).
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { createServer } from "node:net";
import { join } from "node:path";
import { test } from "node:test";
import { startApi, tmpDir } from "../../testkit/index.js";
import { writeTrace } from "../../testkit/traces.js";

async function page(url: string, token: string): Promise<{ status: number; text: string }> {
  const r = await fetch(url, { headers: { authorization: `Bearer ${token}` } });
  return { status: r.status, text: await r.text() };
}

/** A port nothing listens on (taken, then given back). */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const { port } = s.address() as { port: number };
  await new Promise((r) => s.close(r));
  return port;
}

test("the request page shows the request's trace from the span file, span by span", async (t) => {
  const file = join(tmpDir(t), "traces", "spans.jsonl");
  const requestId = randomUUID();
  const traceId = await writeTrace(file, requestId);
  await writeTrace(file, randomUUID());
  const api = await startApi(t, { consoleTraces: { file } });
  const admin = await api.adminToken();

  const r = await page(`${api.url}/console/requests/${requestId}`, admin);
  assert.equal(r.status, 200, r.text);
  assert.match(r.text, new RegExp(`<table class="trace" data-trace-id="${traceId}">`));
  const spans = [...r.text.matchAll(/<tr data-span="([^"]+)" data-service="([^"]+)"/g)].map(
    (m) => `${m[2]} ${m[1]}`,
  );
  assert.deepEqual(spans, [
    "invocation POST /v2/nvcf/pexec/functions/:fid",
    `invocation send rq.local.0b8d9a52-8e3c-4d57-a8d2-3d3f5f6b9e21.*`,
    `worker process rq.local.0b8d9a52-8e3c-4d57-a8d2-3d3f5f6b9e21.*`,
    "worker POST /echo",
    "worker POST request-attach",
    "invocation POST /v2/nvcf/worker/request-attach",
  ]);
  assert.equal([...r.text.matchAll(/data-trace-id=/g)].length, 1, "the other request's trace is not shown");

  const none = await page(`${api.url}/console/requests/${randomUUID()}`, admin);
  assert.equal(none.status, 200);
  assert.match(none.text, /id="trace-none"/);
  assert.match(none.text, /not sampled/);
});

test("without tracing, or with a query API that does not answer, the page says so", async (t) => {
  const off = await startApi(t);
  const offToken = await off.adminToken();
  const a = await page(`${off.url}/console/requests/${randomUUID()}`, offToken);
  assert.equal(a.status, 200);
  assert.match(a.text, /id="trace-off"/);

  const port = await closedPort();
  const down = await startApi(t, { consoleTraces: { queryUrl: `http://127.0.0.1:${port}` } });
  const b = await page(`${down.url}/console/requests/${randomUUID()}`, await down.adminToken());
  assert.equal(b.status, 200, "the rest of the page still answers");
  assert.match(b.text, /id="trace-error"/);
  assert.match(b.text, /The spans could not be read: .*127\.0\.0\.1/);
});
