// Draining as load balancers and Kubernetes expect it (src/lib/http/server.ts close()): readiness fails at
// once, requests keep being served through the drain delay but ask for Connection: close, idle
// keep-alive connections close at once, requests after the delay get 503 SHUTTING_DOWN, work in
// flight finishes, and close() returns when it has, not at the end of the grace period.
import assert from "node:assert/strict";
import { connect, type Socket } from "node:net";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Router, createHttpService, sendJson } from "../../src/lib/http/index.js";
import { silentLogger } from "../../src/lib/log.js";
import { createRegistry } from "../../src/lib/metrics.js";

/** One raw HTTP/1.1 request on a socket; resolves with the status line and headers. */
function ask(socket: Socket, path: string): Promise<{ status: number; head: string }> {
  return new Promise((resolve, reject) => {
    let buf = "";
    const onData = (d: Buffer) => {
      buf += d.toString("latin1");
      const end = buf.indexOf("\r\n\r\n");
      if (end === -1) return;
      socket.off("data", onData);
      const head = buf.slice(0, end);
      resolve({ status: Number(head.slice(9, 12)), head: head.toLowerCase() });
    };
    socket.on("data", onData);
    socket.once("error", reject);
    socket.write(`GET ${path} HTTP/1.1\r\nHost: test\r\n\r\n`);
  });
}

function open(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(port, "127.0.0.1", () => resolve(s));
    s.once("error", reject);
  });
}

test("close() drains: readiness first, Connection: close during the delay, 503 after it, in-flight work finishes", async (t) => {
  let release: (() => void) | undefined;
  const router = new Router()
    .add("GET", "/fast", ({ res }) => sendJson(res, 200, { ok: true }))
    .add("GET", "/slow", ({ res }) => {
      release = () => sendJson(res, 200, { done: true });
    });
  const http = createHttpService({
    name: "drain-test",
    listen: { host: "127.0.0.1", port: 0 },
    logger: silentLogger(),
    registry: createRegistry("drain-test", { defaultMetrics: false }),
    router,
  });
  const port = Number((await http.listen()).port);
  t.after(() => http.destroy());

  const idle = await open(port);
  assert.equal((await ask(idle, "/fast")).status, 200, "a keep-alive connection, now idle");
  let idleClosed = false;
  idle.once("close", () => (idleClosed = true));
  const busy = await open(port);
  const slow = ask(busy, "/slow");
  while (!release) await sleep(5);

  const events: string[] = [];
  const closing = http.close(60_000, 400).then(() => events.push("closed"));
  // at once: readiness fails; the idle connection stays open (closing it would race a request a
  // balancer sends on it before it has noticed)
  const health = await ask(await open(port), "/health");
  assert.equal(health.status, 503);
  // during the delay: still served, but the client is told to go elsewhere next time
  const during = await ask(await open(port), "/fast");
  assert.equal(during.status, 200);
  assert.match(during.head, /\r\nconnection: close/);
  assert.ok(!idleClosed, "the idle keep-alive connection is not closed during the delay");
  events.push("served during the delay");
  // after the delay: refused with a clear answer
  for (let i = 0; i < 400; i++) {
    const r = await ask(await open(port), "/fast");
    if (r.status === 503) {
      events.push("refused after the delay");
      break;
    }
    await sleep(10);
  }
  assert.ok(events.includes("refused after the delay"), "new requests are refused once the delay is over");
  for (let i = 0; i < 200 && !idleClosed; i++) await sleep(5);
  assert.ok(idleClosed, "the idle keep-alive connection is closed once the delay is over");
  assert.ok(!events.includes("closed"), "close() waits for the work in flight");
  release();
  const answer = await slow;
  assert.equal(answer.status, 200, "the request in flight finishes");
  assert.match(answer.head, /\r\nconnection: close/, "and its connection closes after it");
  await closing;
  assert.deepEqual(events, ["served during the delay", "refused after the delay", "closed"]);
});
