// The console's logs page over a running plane (real nats-server, API, two invocation replicas and
// a worker, all logging as the services do): the lines a request left on its replica are found by
// its id, a function's lines on every replica by the function id, merged newest first; the live
// stream carries the same rows; a filter that is not an id is refused with its code.
import assert from "node:assert/strict";
import { test } from "node:test";
import { holderHex } from "../../../src/lib/ids.js";
import { startPlane } from "../../testkit/plane.js";

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

async function get(url: string, headers: Record<string, string> = {}) {
  const r = await fetch(url, { headers, redirect: "manual" });
  return { status: r.status, text: await r.text() };
}

/** The rows of the logs table: each cell's text, plus the row's data- attributes. */
function logRows(page: string): Array<{ level: string; service: string; cells: string[] }> {
  const body = /<table id="logs"[\s\S]*?<tbody>([\s\S]*?)<\/tbody>/.exec(page)?.[1] ?? page;
  return [...body.matchAll(/<tr data-level="([^"]*)" data-service="([^"]*)">([\s\S]*?)<\/tr>/g)].map((m) => ({
    level: m[1],
    service: m[2],
    cells: [...m[3].matchAll(/<td[^>]*>([\s\S]*?)<\/td>/g)].map((c) =>
      c[1]
        .replace(/<[^>]+>/g, "")
        .replace(/\s+/g, " ")
        .trim(),
    ),
  }));
}

function errorCode(page: string): string | undefined {
  return /id="error"[^>]*data-code="([A-Z_]+)"/.exec(page)?.[1];
}

/** Reads an event stream until `done(text)` or its end. */
async function readEvents(url: string, headers: Record<string, string>, done: (t: string) => boolean) {
  const ac = new AbortController();
  const r = await fetch(url, { headers, signal: ac.signal });
  const reader = r.body!.getReader();
  let text = "";
  while (!done(text)) {
    const { value, done: end } = (await reader.read()) as { value?: Uint8Array; done: boolean };
    if (end || !value) break;
    text += Buffer.from(value).toString("utf8");
  }
  ac.abort();
  return { status: r.status, type: r.headers.get("content-type") ?? "", text };
}

void test(
  "the console's logs page: a request's lines by its id, a function's across replicas, live, and bad filters",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startPlane(t, { replicas: 2, logs: true });
    const admin = await plane.api.adminToken();
    const c = `${plane.api.url}/console`;
    const [h0, h1] = plane.replicas.map((r) => holderHex(r.service.holderId));
    // a function nobody serves: each request ends in a 504, which its replica logs with its ids
    const idle = await plane.addFunction({ inferenceUrl: "/echo", workers: 0 });
    const timedOut = async (replica: number) => {
      const r = await fetch(idle.invokeUrl(replica), {
        method: "POST",
        headers: {
          authorization: `Bearer ${idle.fn.apiKey}`,
          "content-type": "application/json",
          "nvcf-poll-seconds": "1",
        },
        body: "{}",
      });
      await r.arrayBuffer();
      assert.equal(r.status, 504);
      return r.headers.get("nvcf-reqid")!;
    };
    const [a, b] = await Promise.all([timedOut(0), timedOut(1)]);
    // and one answered request on the plane's own function (no line of its own at level info)
    const ok = await fetch(plane.invokeUrl(0), {
      method: "POST",
      headers: { authorization: `Bearer ${plane.fn.apiKey}`, "content-type": "application/json" },
      body: "{}",
    });
    assert.equal(ok.status, 200);
    await ok.arrayBuffer();

    await t.test("the page is in the nav, with a filter form and every service's lines", async () => {
      const p = await get(`${c}/logs`, bearer(admin));
      assert.equal(p.status, 200, p.text);
      assert.match(p.text, /<a href="\/console\/logs"\s+aria-current="page">Logs<\/a>/);
      assert.match(p.text, /<form id="log-filter" method="get" action="\/console\/logs"/);
      assert.match(p.text, /<input\s+id="log-request-id"\s+name="requestId"/);
      assert.match(p.text, /<input\s+id="log-function-id"\s+name="functionId"/);
      assert.match(p.text, /<script src="\/console\/assets\/logs.js" defer><\/script>/);
      const rows = logRows(p.text);
      const replicasSeen = new Set(rows.filter((r) => r.service === "invocation").map((r) => r.cells[2]));
      assert.deepEqual([...replicasSeen].sort(), [h0, h1].sort(), "both replicas' lines");
      assert.ok(
        rows.some((r) => r.cells[4] === "invocation listening"),
        rows.map((r) => r.cells[4]).join("\n"),
      );
      const times = rows.map((r) => r.cells[0]);
      assert.deepEqual(times, [...times].sort().reverse(), "newest first");
    });

    await t.test("a request id finds that request's lines on its replica, and only them", async () => {
      const p = await get(`${c}/logs?requestId=${a.toUpperCase()}`, bearer(admin));
      assert.equal(p.status, 200, p.text);
      assert.match(
        p.text,
        new RegExp(`<input\\s+id="log-request-id"\\s+name="requestId"\\s+type="search"\\s+value="${a}"`),
      );
      const rows = logRows(p.text);
      assert.ok(rows.length >= 1, p.text);
      for (const r of rows) {
        assert.equal(r.cells[5], a, "every row names the request");
        assert.equal(r.cells[1], "invocation");
        assert.equal(r.cells[2], h0, "on the replica that held it");
      }
      const window = rows.find((r) => r.cells[4] === "no worker answered within the window");
      assert.ok(window, rows.map((r) => r.cells.join(" | ")).join("\n"));
      assert.equal(window.level, "info");
      assert.match(window.cells[6], new RegExp(`functionId=${idle.fn.functionId}`));
      assert.match(window.cells[6], /windowSeconds=1/);
      assert.ok(!p.text.includes(b), "not the other request's lines");
    });

    await t.test("a function id finds its lines on every replica, merged by time", async () => {
      const p = await get(`${c}/logs?functionId=${idle.fn.functionId}`, bearer(admin));
      assert.equal(p.status, 200, p.text);
      const rows = logRows(p.text).filter((r) => r.cells[4] === "no worker answered within the window");
      assert.deepEqual(rows.map((r) => r.cells[5]).sort(), [a, b].sort(), p.text);
      assert.deepEqual(rows.map((r) => r.cells[2]).sort(), [h0, h1].sort());
      const both = await get(`${c}/logs?requestId=${b}&functionId=${idle.fn.functionId}`, bearer(admin));
      assert.deepEqual(
        [...new Set(logRows(both.text).map((r) => r.cells[5]))],
        [b],
        "both filters: the request's lines that name the function",
      );
      const none = await get(`${c}/logs?functionId=${plane.fn.functionId}&requestId=${a}`, bearer(admin));
      assert.equal(logRows(none.text).length, 0);
      assert.match(none.text, /id="logs-empty"/);
    });

    await t.test("the live stream carries the filtered rows", async () => {
      const ev = await readEvents(`${c}/logs/events?requestId=${a}`, bearer(admin), (text) =>
        text.includes("no worker answered within the window"),
      );
      assert.equal(ev.status, 200);
      assert.match(ev.type, /^text\/event-stream/);
      assert.match(ev.text, /^event: logs$/m);
      assert.ok(ev.text.includes(`href="/console/requests/${a}"`), ev.text);
      assert.ok(!ev.text.includes(b));
    });

    await t.test("a filter that is not an id: 400 VALIDATION_FAILED naming the field", async () => {
      const bad = await get(`${c}/logs?requestId=not-an-id`, bearer(admin));
      assert.equal(bad.status, 400);
      assert.equal(errorCode(bad.text), "VALIDATION_FAILED");
      assert.match(bad.text, /requestId: &quot;not-an-id&quot; is not a UUID/);
      const badFn = await get(`${c}/logs?functionId=${"x".repeat(500)}`, bearer(admin));
      assert.equal(badFn.status, 400);
      assert.match(badFn.text, /functionId: /);
      assert.ok(badFn.text.length < 10_000 && !badFn.text.includes("x".repeat(65)), "the value is cut short");
      const events = await get(`${c}/logs/events?functionId=nope`, bearer(admin));
      assert.equal(events.status, 400);
      assert.equal(errorCode(events.text), "VALIDATION_FAILED");
      const anon = await get(`${c}/logs?requestId=${a}`);
      assert.equal(anon.status, 303, "no token: to the login page");
    });
  },
);
