// Issue 19, the HTTP invocation service: requests bound to their caller's account (a status poll
// with a key of another account is answered as for an unknown id, and takes nothing from the
// owner), a bound on each key's requests in flight that nothing leaks, an over-long key refused
// before the API is asked, Host names, request-attach and /metrics on the client port only where
// configured, and a trickled body cut off long before the poll window ends. The hostile requests
// of the corpus's `invocation` section are sent as they are written, over a raw socket (two Host
// headers cannot be sent otherwise).
import { Kvm } from "@nats-io/kv";
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect as netConnect, type Socket } from "node:net";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { pollBucket, subjects } from "../../../src/lib/nats/index.js";
import { dashIp } from "../../../src/lib/net/index.js";
import { REQUEST_ID, bearer, call, problemOf, waitFor } from "../../testkit/client.js";
import { repoRoot } from "../../testkit/paths.js";
import { metricValue, startPlane, type Plane } from "../../testkit/plane.js";

const LIMIT = { timeout: 90_000 };

interface CorpusEntry {
  name: string;
  finding: string;
  request: { method: string; path: string; headers: Array<[string, string]>; body?: string };
  expect: { status: number; code: string | null };
}

const corpus = (
  JSON.parse(readFileSync(join(repoRoot, "test", "corpus", "hostile-requests.json"), "utf8")) as {
    invocation: CorpusEntry[];
  }
).invocation;

interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
  /** The server closed the connection after the answer. */
  closed: boolean;
}

/** Parses one HTTP/1.1 response from what a connection received (undefined until it is complete). */
function parseResponse(buf: Buffer, ended: boolean): RawResponse | undefined {
  const text = buf.toString("latin1");
  const headEnd = text.indexOf("\r\n\r\n");
  if (headEnd === -1) return undefined;
  const [statusLine, ...lines] = text.slice(0, headEnd).split("\r\n");
  const headers: Record<string, string> = {};
  for (const l of lines) {
    const i = l.indexOf(":");
    headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
  }
  let rest = text.slice(headEnd + 4);
  if (headers["content-length"] !== undefined) {
    const n = Number(headers["content-length"]);
    if (Buffer.byteLength(rest, "latin1") < n) return undefined;
    rest = rest.slice(0, n);
  } else if (headers["transfer-encoding"] === "chunked") {
    let body = "";
    let at = 0;
    for (;;) {
      const eol = rest.indexOf("\r\n", at);
      if (eol === -1) return undefined;
      const size = parseInt(rest.slice(at, eol), 16);
      if (size === 0) break;
      if (rest.length < eol + 2 + size) return undefined;
      body += rest.slice(eol + 2, eol + 2 + size);
      at = eol + 2 + size + 2;
    }
    rest = body;
  } else if (!ended) return undefined;
  return { status: Number(statusLine.split(" ")[1]), headers, body: rest, closed: ended };
}

/**
 * A raw connection to a replica: `send` writes bytes as given, `response()` resolves with the first
 * response once it is complete, and `closed` once the server closed the connection.
 */
function rawConnection(
  t: TestContext,
  url: string,
): { socket: Socket; response(): Promise<RawResponse>; closed: Promise<void> } {
  const u = new URL(url);
  const socket = netConnect(Number(u.port), u.hostname);
  t.after(() => socket.destroy());
  let buf = Buffer.alloc(0);
  let ended = false;
  const waiters: Array<() => void> = [];
  const wake = () => waiters.splice(0).forEach((w) => w());
  socket.on("data", (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    wake();
  });
  const closed = new Promise<void>((resolve) =>
    socket.once("close", () => {
      ended = true;
      wake();
      resolve();
    }),
  );
  socket.on("error", () => undefined);
  return {
    socket,
    closed,
    async response() {
      for (;;) {
        const r = parseResponse(buf, ended);
        if (r) return r;
        if (ended)
          throw new Error(`the connection closed without a whole response: ${buf.toString("latin1")}`);
        await new Promise<void>((w) => waiters.push(w));
      }
    },
  };
}

function fill(s: string, vars: Record<string, string | undefined>): string {
  return s.replaceAll(/\{([A-Za-z]+)\}/g, (m, name: string) => {
    if (!(name in vars)) return m;
    const v = vars[name];
    if (v === undefined) throw new Error(`{${name}} is not available here (see the test's setup)`);
    return v;
  });
}

/** Sends a corpus entry as written (a Host header is added only when the entry has none). */
async function sendEntry(
  t: TestContext,
  url: string,
  e: CorpusEntry,
  vars: Record<string, string | undefined>,
): Promise<RawResponse> {
  const u = new URL(url);
  const headers = e.request.headers.map(([k, v]) => [k, fill(v, vars)] as const);
  const body = e.request.body === undefined ? undefined : Buffer.from(fill(e.request.body, vars));
  const lines = [`${e.request.method} ${fill(e.request.path, vars)} HTTP/1.1`];
  if (!headers.some(([k]) => k.toLowerCase() === "host")) lines.push(`host: ${u.host}`);
  for (const [k, v] of headers) lines.push(`${k}: ${v}`);
  if (body) lines.push(`content-length: ${body.length}`);
  lines.push("connection: close", "", "");
  const c = rawConnection(t, url);
  c.socket.write(lines.join("\r\n"));
  if (body) c.socket.write(body);
  return c.response();
}

/** An invocation of /slow that answers 202 (in progress) within a one-second window: its request id. */
async function inProgress(plane: Plane, key = plane.fn.apiKey, seconds = 60): Promise<string> {
  const res = await fetch(`${plane.invokeUrl(0)}?seconds=${seconds}&progressMs=200`, {
    method: "POST",
    headers: bearer(key, { "nvcf-poll-seconds": "1", "content-type": "application/json" }),
    body: "{}",
  });
  assert.equal(res.status, 202, await res.text());
  const id = res.headers.get("nvcf-reqid") ?? "";
  assert.match(id, REQUEST_ID);
  return id;
}

/** A key in the plane's (default) account. */
async function sameAccountKey(plane: Plane): Promise<string> {
  const key = await call<{ value: string }>(`${plane.api.url}/v1/keys`, {
    token: await plane.api.adminToken(),
    body: { description: "a second key of the same account" },
  });
  assert.equal(key.status, 200, key.text);
  return key.body.value;
}

/**
 * A key in a second account, made as the CLI does (`callplane account create`, then `callplane
 * --account <id> key create`): undefined where the API has no accounts yet.
 */
async function otherAccountKey(plane: Plane): Promise<string | undefined> {
  const admin = await plane.api.adminToken();
  const account = await call<{ account: { id: string } }>(`${plane.api.url}/v1/accounts`, {
    token: admin,
    body: { name: `other-${Math.random().toString(36).slice(2, 8)}` },
  });
  if (account.status !== 200 && account.status !== 201) return undefined;
  const key = await call<{ value: string }>(`${plane.api.url}/v1/keys`, {
    token: admin,
    headers: { "callplane-account": account.body.account.id },
    body: { description: "a key of another account" },
  });
  assert.equal(key.status, 200, key.text);
  return key.body.value;
}

/** Polls until a non-202 answer; the answers' statuses in order. */
async function pollToEnd(
  plane: Plane,
  id: string,
  key: string,
): Promise<Array<{ status: number; text: string }>> {
  const seen: Array<{ status: number; text: string }> = [];
  for (;;) {
    const res = await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${id}`, {
      headers: bearer(key, { "nvcf-poll-seconds": "1" }),
    });
    seen.push({ status: res.status, text: await res.text() });
    if (res.status !== 202) return seen;
  }
}

/** Counts the status requests this plane's replicas send to workers for request `id`. */
async function workerPolls(t: TestContext, plane: Plane, id: string): Promise<() => number> {
  const nc = await plane.nats.observe();
  t.after(() => nc.close().catch(() => undefined));
  let n = 0;
  const sub = nc.subscribe(subjects.polling(plane.fn.versionId, id), {
    callback: () => {
      n++;
    },
  });
  await nc.flush();
  t.after(() => sub.unsubscribe());
  return () => n;
}

test("the corpus's invocation section: each hostile request gets its refusal", LIMIT, async (t) => {
  // workers call back through the callback proxy to the worker TLS listener, so the client port
  // takes no callbacks; no relay (it would forward callbacks to client ports)
  const plane = await startPlane(t, {
    proxy: true,
    inferenceUrl: "/slow",
    invocation: { attachOnClientPort: false, metricsOnClientPort: false },
  });
  const requestId = await inProgress(plane);
  const vars: Record<string, string | undefined> = {
    functionId: plane.fn.functionId,
    apiKey: plane.fn.apiKey,
    longKey: `nvapi-${"x".repeat(10_000)}`,
    requestId,
    unknownRequestId: randomUUID(),
    otherAccountKey: await otherAccountKey(plane),
    sameAccountKey: await sameAccountKey(plane),
    podHost: `${dashIp(plane.replicas[0].host)}.invocation.nvcf.svc.cluster.local`,
  };
  const details: Record<string, string> = {};
  for (const e of corpus) {
    await t.test(e.name, async (st) => {
      const r = await sendEntry(st, plane.replicas[0].url, e, vars);
      assert.equal(r.status, e.expect.status, `${e.finding}: ${r.body}`);
      if (e.expect.code !== null) {
        const problem = JSON.parse(r.body) as { code: string; detail: string };
        assert.equal(problem.code, e.expect.code, r.body);
        details[e.name] = problem.detail
          .replaceAll(vars.requestId!, "<id>")
          .replaceAll(vars.unknownRequestId!, "<id>");
      }
    });
  }
  // the cross-account poll reads, word for word, as the poll of an id that never existed
  const [unknown, foreign] = corpus
    .filter((e) => e.expect.code === "REQUEST_NOT_FOUND")
    .map((e) => details[e.name]);
  assert.ok(unknown !== undefined && foreign !== undefined, "both polls were answered 404");
  assert.equal(foreign, unknown);
});

test(
  "a poll with a key of another account is answered as an unknown id, reaches no worker, and the owner gets every answer",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { inferenceUrl: "/slow" });
    const other = await otherAccountKey(plane);
    assert.ok(other, "POST /v1/accounts: this test needs the API's accounts (issue 19)");
    const id = await inProgress(plane, plane.fn.apiKey, 3);
    const asked = await workerPolls(t, plane, id);
    const unknownId = randomUUID();
    const unknown = await problemOf(
      await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${unknownId}`, { headers: bearer(other) }),
      404,
    );
    // polled again and again, across the request's whole life: never an answer, never a worker asked
    for (let i = 0; i < 3; i++) {
      const foreign = await problemOf(
        await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${id}`, {
          headers: bearer(other, { "nvcf-poll-seconds": "1" }),
        }),
        404,
      );
      assert.equal(foreign.code, "REQUEST_NOT_FOUND");
      assert.equal(foreign.detail.replace(id, "<id>"), unknown.detail.replace(unknownId, "<id>"));
    }
    assert.equal(asked(), 0, "no status request reached a worker for the foreign key");
    const seen = await pollToEnd(plane, id, plane.fn.apiKey);
    const last = seen.at(-1)!;
    assert.equal(last.status, 200, last.text);
    assert.deepEqual(JSON.parse(last.text), { done: true, seconds: 3 });
  },
);

test(
  "a poll record names the account that made the request: a poll by any other account is told the id does not exist, before any worker is asked",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { inferenceUrl: "/slow" });
    const id = await inProgress(plane);
    const asked = await workerPolls(t, plane, id);
    const nc = await plane.nats.observe();
    t.after(() => nc.close().catch(() => undefined));
    const kv = await new Kvm(nc).open(pollBucket("test"));
    const entry = await kv.get(id);
    assert.ok(entry, "the 202 left a poll record");
    const rec = entry.json<Record<string, unknown>>();
    assert.equal(typeof rec.clientNcaId, "string", "the record names the account");
    // the same request, recorded as another account's: this key (of the plane's account) is now the stranger
    await kv.put(id, JSON.stringify({ ...rec, clientNcaId: "another-account" }));
    const unknownId = randomUUID();
    const unknown = await problemOf(
      await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${unknownId}`, {
        headers: bearer(plane.fn.apiKey),
      }),
      404,
    );
    const foreign = await problemOf(
      await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${id}`, {
        headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "1" }),
      }),
      404,
    );
    assert.equal(foreign.code, "REQUEST_NOT_FOUND");
    assert.equal(foreign.detail.replace(id, "<id>"), unknown.detail.replace(unknownId, "<id>"));
    assert.equal(asked(), 0, "the worker was not asked");
    // back as the plane's account's: the same key polls it again
    await kv.put(id, JSON.stringify(rec));
    const res = await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${id}`, {
      headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "1" }),
    });
    assert.equal(res.status, 202, await res.text());
    assert.equal(asked(), 1);
  },
);

test(
  "the client port serves global.hosts and, where workers call back to it, the replica's pod DNS name",
  LIMIT,
  async (t) => {
    // no callback proxy: workers call back to the pod address on the client port
    const plane = await startPlane(t, { invocation: { hosts: ["invoke.example.com", "*.gw.example.com"] } });
    const health = async (host: string) =>
      (
        await sendEntry(
          t,
          plane.replicas[0].url,
          {
            name: "health",
            finding: "",
            request: { method: "GET", path: "/health", headers: [["host", host]] },
            expect: { status: 200, code: null },
          },
          {},
        )
      ).status;
    const pod = `${dashIp(plane.replicas[0].host)}.invocation.nvcf.svc.cluster.local`;
    assert.equal(await health(pod), 200);
    assert.equal(await health("invoke.example.com:443"), 200);
    assert.equal(await health("a.gw.example.com"), 200);
    assert.equal(await health("gw.example.com"), 421);
    assert.equal(await health("other.invocation.nvcf.svc.cluster.local"), 421);
    // and the workers' callbacks, which name the pod, are answered: an invocation comes back
    const res = await fetch(plane.invokeUrl(0), {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "content-type": "text/plain" }),
      body: "hello",
    });
    assert.equal(await res.text(), "hello");
  },
);

test(
  "another key of the same account polls the request: keys of one account share their requests",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { inferenceUrl: "/slow" });
    const id = await inProgress(plane, plane.fn.apiKey, 3);
    const second = await sameAccountKey(plane);
    const seen = await pollToEnd(plane, id, second);
    const last = seen.at(-1)!;
    assert.equal(last.status, 200, last.text);
    assert.deepEqual(JSON.parse(last.text), { done: true, seconds: 3 });
  },
);

test(
  "each key has at most invocation.maxInFlightPerKey requests in flight on a replica; refusals and clients that leave give their slots back",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { inferenceUrl: "/slow", invocation: { maxInFlightPerKey: 2 } });
    const registry = plane.replicas[0].service.registry;
    const held = () => metricValue(registry, "callplane_invocations_in_flight");
    const hold = (key: string) => {
      const ac = new AbortController();
      const done = fetch(`${plane.invokeUrl(0)}?seconds=60`, {
        method: "POST",
        headers: bearer(key, { "nvcf-poll-seconds": "60", "content-type": "application/json" }),
        body: "{}",
        signal: ac.signal,
      }).catch(() => undefined);
      return { abort: () => ac.abort(), done };
    };
    const refused = async (key: string) =>
      problemOf(
        await fetch(plane.invokeUrl(0), {
          method: "POST",
          headers: bearer(key, { "content-type": "application/json" }),
          body: "{}",
        }),
        429,
      );
    for (let round = 0; round < 2; round++) {
      const a = hold(plane.fn.apiKey);
      const b = hold(plane.fn.apiKey);
      await waitFor("two requests held", async () => (await held()) === 2);
      for (let i = 0; i < 3; i++) {
        const p = await refused(plane.fn.apiKey);
        assert.equal(p.code, "TOO_MANY_IN_FLIGHT");
        assert.match(p.detail, /invocation\.maxInFlightPerKey/);
      }
      // a status poll is a request in flight too
      const poll = await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${randomUUID()}`, {
        headers: bearer(plane.fn.apiKey),
      });
      // (an unknown id holds nothing: it is answered before any slot is taken)
      assert.equal(poll.status, 404, await poll.text());
      a.abort();
      b.abort();
      await Promise.all([a.done, b.done]);
      await waitFor("the clients' requests released", async () => (await held()) === 0);
    }
    // every slot came back: two are held again, and the third is refused (not the first)
    const c = hold(plane.fn.apiKey);
    const d = hold(plane.fn.apiKey);
    await waitFor("two requests held again", async () => (await held()) === 2);
    // another key is counted apart
    const other = await sameAccountKey(plane);
    const e = hold(other);
    await waitFor("the other key's request held", async () => (await held()) === 3);
    assert.equal((await refused(plane.fn.apiKey)).code, "TOO_MANY_IN_FLIGHT");
    for (const h of [c, d, e]) h.abort();
  },
);

test(
  "a trickled body is cut off with 408 long before the poll window ends, and its key's slot comes back",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, {
      invocation: { bodyIdleMs: 1000, inlineBodyMs: 2000, inlineBodyBytes: 64, maxInFlightPerKey: 1 },
    });
    const head = (length: number) =>
      [
        `POST /v2/nvcf/pexec/functions/${plane.fn.functionId} HTTP/1.1`,
        `host: ${new URL(plane.replicas[0].url).host}`,
        `authorization: Bearer ${plane.fn.apiKey}`,
        "content-type: application/octet-stream",
        // a window far longer than the test: only the body's own bounds can end these
        "nvcf-poll-seconds: 3600",
        `content-length: ${length}`,
        "",
        "",
      ].join("\r\n");
    const expect408 = async (c: ReturnType<typeof rawConnection>, detail: RegExp) => {
      const r = await c.response();
      assert.equal(r.status, 408, r.body);
      const p = JSON.parse(r.body) as { code: string; detail: string };
      assert.equal(p.code, "REQUEST_TIMEOUT");
      assert.match(p.detail, detail);
      await c.closed;
    };
    const echoWorks = async () => {
      const ok = await fetch(plane.invokeUrl(0), {
        method: "POST",
        headers: bearer(plane.fn.apiKey, { "content-type": "text/plain" }),
        body: "after",
      });
      const text = await ok.text();
      assert.equal(ok.status, 200, text);
      assert.equal(text, "after");
    };

    // the inline part stops: no byte for bodyIdleSeconds
    const stopped = rawConnection(t, plane.replicas[0].url);
    stopped.socket.write(head(1000) + "ab");
    await expect408(stopped, /paused for more than 1 s/);
    await echoWorks();

    // the inline part trickles, a byte at a time, never pausing long enough to be idle
    const trickled = rawConnection(t, plane.replicas[0].url);
    trickled.socket.write(head(1000));
    const drip = setInterval(() => trickled.socket.write("x"), 200);
    t.after(() => clearInterval(drip));
    await expect408(trickled, /did not arrive within 2 s/);
    clearInterval(drip);
    await echoWorks();

    // past the inline part, the rest stops while a worker reads it (GET request-attach)
    const rest = rawConnection(t, plane.replicas[0].url);
    rest.socket.write(head(1000) + "y".repeat(100));
    await expect408(rest, /while a worker was reading it/);
    await echoWorks();
  },
);
