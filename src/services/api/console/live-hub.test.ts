// The live hub's promises, against real HTTP connections on 127.0.0.1: it polls only while someone
// listens, once per tick however many listen, stops when the last one leaves, and never queues more
// than one update for a client that does not read (the update is dropped for it instead).
import assert from "node:assert/strict";
import { createServer, type ServerResponse } from "node:http";
import { connect } from "node:net";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { silentLogger } from "../../../lib/log.js";
import { LiveHub } from "./live-hub.js";

async function serve(
  t: TestContext,
  hub: LiveHub,
  onClient: (res: ServerResponse) => void = () => undefined,
) {
  const server = createServer((_req, res) => {
    onClient(res);
    hub.add(res);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => {
    hub.close();
    server.closeAllConnections();
    server.close();
  });
  const addr = server.address();
  return `http://127.0.0.1:${typeof addr === "object" && addr ? addr.port : 0}/`;
}

async function until(what: string, check: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

/** Reads events from a stream until `n` have arrived. */
async function events(body: ReadableStream<Uint8Array>, n: number): Promise<string[]> {
  const reader = body.getReader();
  let text = "";
  const got = () => text.split("\n\n").filter((e) => e.startsWith("event: ")).length;
  while (got() < n) {
    const { value, done } = await reader.read();
    if (done) break;
    text += Buffer.from(value).toString("utf8");
  }
  reader.releaseLock();
  return text.split("\n\n").filter((e) => e.startsWith("event: "));
}

void test("the hub polls only while someone listens, once per tick for all of them", async (t) => {
  let n = 0;
  const hub = new LiveHub({
    render: () => Promise.resolve(`<tr><td>${++n}</td></tr>\n<tr></tr>`),
    event: "inflight",
    intervalMs: 20,
    logger: silentLogger(),
  });
  const url = await serve(t, hub);
  await sleep(100);
  assert.equal(hub.polls, 0, "nobody listens: no poll");

  const a = new AbortController();
  const b = new AbortController();
  const [ra, rb] = await Promise.all([fetch(url, { signal: a.signal }), fetch(url, { signal: b.signal })]);
  assert.equal(ra.headers.get("content-type"), "text/event-stream; charset=utf-8");
  const [ea, eb] = await Promise.all([events(ra.body!, 5), events(rb.body!, 5)]);
  // a multi-line update is one event, each line its own data: field
  assert.match(ea[0], /^event: inflight\ndata: <tr><td>\d+<\/td><\/tr>\ndata: <tr><\/tr>$/);
  // both saw the same updates: one render served both
  const seq = (es: string[]) => es.map((e) => Number(/<td>(\d+)</.exec(e)![1]));
  assert.ok(
    seq(eb).some((x) => seq(ea).includes(x)),
    `shared updates: ${seq(ea).join()} / ${seq(eb).join()}`,
  );
  assert.ok(hub.polls <= Math.max(...seq(ea), ...seq(eb)) + 1);
  assert.equal(hub.listeners, 2);

  a.abort();
  b.abort();
  await until("both listeners gone", () => hub.listeners === 0);
  await sleep(60);
  const after = hub.polls;
  await sleep(150);
  assert.equal(hub.polls, after, "nobody listens any more: no poll");

  // a new listener starts it again
  const c = new AbortController();
  const rc = await fetch(url, { signal: c.signal });
  assert.equal((await events(rc.body!, 1)).length, 1);
  c.abort();
});

void test("a client that does not read gets updates dropped, never queued", async (t) => {
  const frame = "x".repeat(512 * 1024);
  let slow: ServerResponse | undefined;
  let maxQueued = 0;
  const hub = new LiveHub({
    render: () => {
      if (slow) maxQueued = Math.max(maxQueued, slow.writableLength);
      return Promise.resolve(frame);
    },
    event: "inflight",
    intervalMs: 5,
    logger: silentLogger(),
  });
  const url = new URL(await serve(t, hub, (res) => (slow = res)));
  const socket = connect(Number(url.port), "127.0.0.1");
  t.after(() => socket.destroy());
  socket.write(`GET / HTTP/1.1\r\nhost: ${url.host}\r\n\r\n`);
  socket.pause(); // reads nothing: the kernel's buffers fill, then the server's
  await until("an update dropped for the slow client", () => hub.dropped > 0, 20_000);
  // at most the one update it had not taken, on top of what Node buffers before it says "wait"
  assert.ok(maxQueued <= frame.length + 64 * 1024, `queued ${maxQueued} bytes`);
  assert.equal(hub.listeners, 1, "a slow client stays connected");
  socket.destroy();
  await until("the slow client removed", () => hub.listeners === 0);
});
