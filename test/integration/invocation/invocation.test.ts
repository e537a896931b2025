// What a client of the invocation service sees (contract §2.4-2.9): answers, NVCF headers, the
// 202-and-poll flow across replicas, streaming, errors as problem+json, cancellation, queue limits
// and a graceful stop. Each test starts its own plane (nats-server, API, replicas, workers, example
// inference server) and waits for conditions with deadlines rather than fixed sleeps.
import { jetstreamManager } from "@nats-io/jetstream";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { connect as netConnect } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { test, type TestContext } from "node:test";
import { promisify } from "node:util";
import { REQUEST_ID, bearer, problemOf, waitFor } from "../../testkit/client.js";
import { call, tmpDir } from "../../testkit/index.js";
import { startPlane, type Plane } from "../../testkit/plane.js";

/** No test waits forever: a hang fails its test with a clear timeout instead of stalling the file. */
const LIMIT = { timeout: 60_000 };

const run = promisify(execFile);

interface Stats {
  requests: number;
  abandoned: number;
  hanging: number;
}

/** The example server's counters are per process, shared by every plane of this file: compare deltas. */
async function inferenceStats(plane: Plane): Promise<Stats> {
  return (await (await fetch(`${plane.inference.url}/stats`)).json()) as Stats;
}

/** Requests the plane's first worker is working on (its callplane_worker_busy_slots gauge). */
async function busySlots(plane: Plane): Promise<number> {
  const m = await plane.workers[0].registry.getSingleMetric("callplane_worker_busy_slots")?.get();
  return m?.values[0]?.value ?? 0;
}

async function streamMessages(plane: Plane, t: TestContext): Promise<() => Promise<number>> {
  const nc = await plane.nats.observe();
  t.after(() => nc.close().catch(() => undefined));
  const jsm = await jetstreamManager(nc);
  return async () => (await jsm.streams.info(`rq_test_${plane.fn.versionId}`)).state.messages;
}

async function createKey(
  plane: Plane,
  body: Record<string, unknown>,
): Promise<{ id: string; value: string }> {
  const admin = await plane.api.adminToken();
  const key = await call<{ id: string; value: string }>(`${plane.api.url}/v1/keys`, { token: admin, body });
  assert.equal(key.status, 200, key.text);
  return key.body;
}

test(
  "a client invokes a function and gets the inference server's answer with NVCF headers",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t);
    const res = await fetch(plane.invokeUrl(), {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "content-type": "application/json" }),
      body: JSON.stringify({ hello: "callplane" }),
    });
    const text = await res.text();
    assert.equal(res.status, 200, text);
    assert.deepEqual(JSON.parse(text), { hello: "callplane" });
    assert.match(res.headers.get("nvcf-reqid") ?? "", REQUEST_ID);
    assert.equal(res.headers.get("nvcf-status"), "fulfilled");
    assert.equal(res.headers.get("content-type"), "application/json");
    assert.equal(res.headers.get("access-control-expose-headers")?.toLowerCase(), "nvcf-reqid");
  },
);

test(
  "a binary body comes back byte for byte with its own Content-Type, and each call has its own id",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t);
    const ids = new Set<string>();
    // below, at and above the 32 KiB inline part, so the rest travels over GET request-attach
    for (const size of [1, 1000, 32 * 1024, 32 * 1024 + 1, 300 * 1024]) {
      const body = randomBytes(size);
      const res = await fetch(plane.invokeUrl(), {
        method: "POST",
        headers: bearer(plane.fn.apiKey, { "content-type": "application/x-test-bytes" }),
        body,
      });
      const got = Buffer.from(await res.arrayBuffer());
      assert.equal(res.status, 200, `size ${size}: ${got.toString("utf8", 0, 200)}`);
      assert.equal(res.headers.get("content-type"), "application/x-test-bytes");
      assert.equal(got.length, size);
      assert.ok(got.equals(body), `size ${size}: the body changed on the way`);
      assert.equal(res.headers.get("nvcf-status"), "fulfilled");
      const id = res.headers.get("nvcf-reqid") ?? "";
      assert.match(id, REQUEST_ID);
      ids.add(id);
    }
    assert.equal(ids.size, 5, "every invocation gets a fresh NVCF-REQID");
  },
);

test("curl, as an independent client, gets the echoed body and the NVCF headers", LIMIT, async (t) => {
  const plane = await startPlane(t);
  const dir = tmpDir(t);
  const file = join(dir, "body.bin");
  const body = randomBytes(4096);
  writeFileSync(file, body);
  const { stdout } = await run(
    "curl",
    [
      "-s",
      "-D",
      "-",
      "-o",
      join(dir, "out.bin"),
      "-H",
      `Authorization: Bearer ${plane.fn.apiKey}`,
      "-H",
      "Content-Type: application/octet-stream",
      "--data-binary",
      `@${file}`,
      plane.invokeUrl(),
    ],
    { encoding: "utf8" },
  );
  const lines = stdout.split("\r\n");
  assert.match(lines[0], /^HTTP\/1\.1 200 /, stdout);
  const headers = new Map<string, string>();
  for (const line of lines.slice(1)) {
    const i = line.indexOf(":");
    if (i > 0) headers.set(line.slice(0, i).toLowerCase(), line.slice(i + 1).trim());
  }
  assert.match(headers.get("nvcf-reqid") ?? "", REQUEST_ID, stdout);
  assert.equal(headers.get("nvcf-status"), "fulfilled", stdout);
  assert.equal(headers.get("content-type"), "application/octet-stream", stdout);
  assert.equal(headers.get("access-control-expose-headers")?.toLowerCase(), "nvcf-reqid", stdout);
  assert.ok(readFileSync(join(dir, "out.bin")).equals(body), "curl got a different body");
});

test(
  "polls of one request at the same time each get an answer, and two pollers do not spin",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { replicas: 2, inferenceUrl: "/slow" });
    // no progress files while it runs: only the windows and the polls drive the answers
    const first = await fetch(`${plane.invokeUrl(0)}?seconds=4&progressMs=100000`, {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "1", "content-type": "application/json" }),
      body: "{}",
    });
    assert.equal(first.status, 202, await first.text());
    const id = first.headers.get("nvcf-reqid") ?? "";
    // Two clients poll the same request, one on each replica, each polling again as soon as it gets
    // a 202, with a window longer than the request runs.
    const poller = async (r: number) => {
      const seen: Array<{ status: number; text: string }> = [];
      for (;;) {
        const res = await fetch(`${plane.replicas[r].url}/v2/nvcf/pexec/status/${id}`, {
          headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "30" }),
        });
        seen.push({ status: res.status, text: await res.text() });
        if (res.status !== 202 || seen.length > 50) return seen;
      }
    };
    const [a, b] = await Promise.all([poller(0), sleep(300).then(() => poller(1))]);
    const finals = [...a, ...b].filter((x) => x.status === 200);
    assert.equal(finals.length, 1, "the final answer is delivered once");
    assert.deepEqual(JSON.parse(finals[0].text), { done: true, seconds: 4 });
    // every poll was answered (none waited out its 30 s window for a 504), and the superseded
    // poll was not answered at once: two pollers answering each other's polls made hundreds of
    // round trips in these 4 s
    const statuses = [...a, ...b].map((x) => x.status);
    assert.ok(!statuses.includes(504), JSON.stringify(statuses));
    assert.ok(statuses.length <= 6, `${statuses.length} polls: ${JSON.stringify(statuses)}`);
  },
);

test(
  "a long request answers 202 with progress, and any replica answers the polls until the final 200",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { replicas: 2, inferenceUrl: "/slow" });
    const first = await fetch(`${plane.invokeUrl(0)}?seconds=3&progressMs=300`, {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "1", "content-type": "application/json" }),
      body: "{}",
    });
    const firstText = await first.text();
    assert.equal(first.status, 202, firstText);
    assert.equal(first.headers.get("nvcf-status"), "in-progress");
    const id = first.headers.get("nvcf-reqid") ?? "";
    assert.match(id, REQUEST_ID);
    const checkProgress = (res: Response, text: string) => {
      const pct = res.headers.get("nvcf-percent-complete");
      if (pct === null) return; // the window ended before a progress file was written
      assert.match(pct, /^\d+$/);
      assert.deepEqual(JSON.parse(text), { progress: Number(pct) }, "the body is the partial response");
    };
    checkProgress(first, firstText);

    // A poll with a key the API does not know is refused before it reaches the worker.
    const intruder = await fetch(`${plane.replicas[1].url}/v2/nvcf/pexec/status/${id}`, {
      headers: bearer("nvapi-not-a-real-key"),
    });
    assert.equal((await problemOf(intruder, 401)).code, "TOKEN_INVALID");
    // So is a key without invoke_function.
    const lister = await createKey(plane, {
      description: "lists only",
      authorizations: { policies: [{ scopes: ["list_functions"] }] },
    });
    const listerPoll = await fetch(`${plane.replicas[1].url}/v2/nvcf/pexec/status/${id}`, {
      headers: bearer(lister.value),
    });
    assert.equal((await problemOf(listerPoll, 403)).code, "FORBIDDEN_SCOPE");

    const replicasSeen = new Set<number>();
    let final: { res: Response; text: string } | undefined;
    let percent = -1;
    const deadline = Date.now() + 20_000;
    for (let n = 1; !final; n++) {
      assert.ok(Date.now() < deadline, "the final answer did not come within 20 s of polling");
      const r = n % 2; // 1, 0, 1, 0...: the first invocation went to replica 0
      const res = await fetch(`${plane.replicas[r].url}/v2/nvcf/pexec/status/${id}`, {
        headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "1" }),
      });
      const text = await res.text();
      replicasSeen.add(r);
      assert.equal(res.headers.get("nvcf-reqid"), id, text);
      if (res.status === 202) {
        assert.equal(res.headers.get("nvcf-status"), "in-progress");
        checkProgress(res, text);
        const pct = Number(res.headers.get("nvcf-percent-complete") ?? percent);
        assert.ok(pct >= percent, `progress went back from ${percent} to ${pct}`);
        percent = pct;
        continue;
      }
      final = { res, text };
    }
    assert.equal(final.res.status, 200, final.text);
    assert.equal(final.res.headers.get("nvcf-status"), "fulfilled");
    assert.deepEqual(JSON.parse(final.text), { done: true, seconds: 3 });
    assert.deepEqual([...replicasSeen].sort(), [0, 1], "polls were answered by both replicas");

    // The final answer is delivered once.
    const again = await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${id}`, {
      headers: bearer(plane.fn.apiKey),
    });
    const gone = await problemOf(again, 404);
    assert.equal(gone.code, "REQUEST_NOT_FOUND");
    assert.match(gone.detail, new RegExp(id));
    // and without a valid key, nothing is told about the request: the key is refused first
    const stranger = await fetch(`${plane.replicas[1].url}/v2/nvcf/pexec/status/${id}`, {
      headers: bearer("nvapi-not-a-real-key"),
    });
    assert.equal((await problemOf(stranger, 401)).code, "TOKEN_INVALID");
  },
);

test(
  "server-sent events reach the client one by one as the inference server writes them",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { inferenceUrl: "/sse" });
    const res = await fetch(`${plane.invokeUrl()}?events=5&intervalMs=300`, {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { accept: "text/event-stream" }),
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "text/event-stream");
    assert.equal(res.headers.get("nvcf-status"), "fulfilled");
    assert.match(res.headers.get("nvcf-reqid") ?? "", REQUEST_ID);
    const arrivals: Array<{ at: number; event: string }> = [];
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const chunk of res.body! as AsyncIterable<Uint8Array>) {
      buffered += decoder.decode(chunk, { stream: true });
      let end: number;
      while ((end = buffered.indexOf("\n\n")) !== -1) {
        arrivals.push({ at: performance.now(), event: buffered.slice(0, end) });
        buffered = buffered.slice(end + 2);
      }
    }
    assert.equal(buffered, "");
    assert.deepEqual(
      arrivals.map((a) => /^id: (\d+)/.exec(a.event)?.[1] ?? a.event.split("\n")[0]),
      ["0", "1", "2", "3", "4", "event: done"],
    );
    // 4 intervals of 300 ms separate the first event from the last: a client that got them all at
    // the end would see no spread at all. Only a lower bound; a slow machine only widens it.
    const spread = arrivals[4].at - arrivals[0].at;
    assert.ok(spread >= 800, `events 0..4 arrived within ${spread.toFixed(0)} ms: they were buffered`);
  },
);

test(
  "an inference server's error status reaches the client as an inference-service problem",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { inferenceUrl: "/status/500" });
    const notFound = await plane.addFunction({ inferenceUrl: "/status/404" });
    for (const [url, key, status, kebab] of [
      [plane.invokeUrl(), plane.fn.apiKey, 500, "internal-server-error"],
      [notFound.invokeUrl(), notFound.fn.apiKey, 404, "not-found"],
    ] as const) {
      const res = await fetch(url, { method: "POST", headers: bearer(key), body: "{}" });
      const p = await problemOf(res, status);
      assert.equal(res.headers.get("nvcf-status"), "errored");
      assert.match(res.headers.get("nvcf-reqid") ?? "", REQUEST_ID);
      assert.ok(p.type.startsWith("urn:inference-service:problem-details"), p.type);
      assert.equal(p.type, `urn:inference-service:problem-details:${kebab}`);
      assert.equal(p.detail, `the example server was asked to fail with ${status}`);
    }
  },
);

test("an inference server that went away gives 502 inference-connection", LIMIT, async (t) => {
  const plane = await startPlane(t);
  // the worker waits for the server's health before it pulls work, so stop the server only now
  await new Promise<void>((resolve) => {
    plane.inference.server.close(() => resolve());
    plane.inference.server.closeAllConnections();
  });
  const res = await fetch(plane.invokeUrl(), {
    method: "POST",
    headers: bearer(plane.fn.apiKey, { "content-type": "application/json" }),
    body: "{}",
  });
  const p = await problemOf(res, 502);
  assert.equal(res.headers.get("nvcf-status"), "errored");
  assert.match(res.headers.get("nvcf-reqid") ?? "", REQUEST_ID);
  assert.ok(p.type.startsWith("urn:inference-connection:problem-details"), p.type);
  assert.match(p.detail, new RegExp(`127\\.0\\.0\\.1:${plane.inference.port}`));
});

test(
  "with no worker the client gets 504 after the window and the queued message is purged",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { workers: 0 });
    const messages = await streamMessages(plane, t);
    const invoke = async (poll: string) => {
      const started = performance.now();
      const res = await fetch(plane.invokeUrl(), {
        method: "POST",
        headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": poll, "content-type": "application/json" }),
        body: "{}",
      });
      return { res, elapsed: performance.now() - started };
    };
    // side by side: a window of 0 s is clamped to 1 s, so both say so
    for (const { res, elapsed } of await Promise.all([invoke("1"), invoke("0")])) {
      const p = await problemOf(res, 504);
      assert.equal(p.code, "INVOCATION_TIMEOUT");
      assert.match(p.detail, new RegExp(`function ${plane.fn.functionId} .*within 1 s`));
      assert.match(res.headers.get("nvcf-reqid") ?? "", REQUEST_ID);
      assert.equal(p.requestId, res.headers.get("nvcf-reqid"));
      // 1 s window + 2 s grace; generous bounds, the machine is shared
      assert.ok(elapsed >= 2500 && elapsed < 15_000, `answered after ${elapsed.toFixed(0)} ms`);
    }
    await waitFor("the stream to be empty", async () => ((await messages()) === 0 ? true : undefined));
  },
);

test("a client that leaves cancels the inference call", LIMIT, async (t) => {
  const plane = await startPlane(t, { inferenceUrl: "/hang" });
  const before = await inferenceStats(plane);
  const ac = new AbortController();
  const pending = fetch(plane.invokeUrl(), {
    method: "POST",
    headers: bearer(plane.fn.apiKey, { "content-type": "application/json" }),
    body: "{}",
    signal: ac.signal,
  });
  pending.catch(() => undefined);
  await waitFor("the worker to call /hang", async () =>
    (await inferenceStats(plane)).hanging === before.hanging + 1 ? true : undefined,
  );
  ac.abort();
  await assert.rejects(pending, { name: "AbortError" });
  const after = await waitFor("the inference call to be abandoned", async () => {
    const s = await inferenceStats(plane);
    return s.abandoned > before.abandoned ? s : undefined;
  });
  assert.equal(after.abandoned, before.abandoned + 1);
  assert.equal(after.hanging, before.hanging);
});

test("NVCF-POLL-SECONDS must be a whole number of seconds up to 3600; 0 means 1", LIMIT, async (t) => {
  const plane = await startPlane(t);
  const invoke = (poll: string) =>
    fetch(plane.invokeUrl(), {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": poll, "content-type": "application/json" }),
      body: '{"ok":1}',
    });
  for (const bad of ["abc", "-1", "1.5", "3601"]) {
    const p = await problemOf(await invoke(bad), 400);
    assert.equal(p.code, "BAD_POLL_SECONDS", bad);
  }
  assert.match((await problemOf(await invoke("3601"), 400)).detail, /<= 3600/);
  for (const ok of ["0", "1", "3600"]) {
    const res = await invoke(ok);
    assert.equal(res.status, 200, `${ok}: ${await res.text()}`);
  }
  // the status route checks the header the same way
  const poll = await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${randomUUID()}`, {
    headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "abc" }),
  });
  assert.equal((await problemOf(poll, 400)).code, "BAD_POLL_SECONDS");
});

test(
  "unknown functions, missing credentials and unknown request ids are refused with problems",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t);
    const base = `${plane.replicas[0].url}/v2/nvcf/pexec/functions`;
    const post = (url: string, headers: Record<string, string>) =>
      fetch(url, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: "{}" });

    const unknown = randomUUID();
    const p1 = await problemOf(await post(`${base}/${unknown}`, bearer(plane.fn.apiKey)), 404);
    assert.equal(p1.code, "FUNCTION_NOT_FOUND");
    assert.match(p1.detail, new RegExp(unknown));

    const p2 = await problemOf(await post(`${base}/not-a-uuid`, bearer(plane.fn.apiKey)), 404);
    assert.equal(p2.code, "FUNCTION_NOT_FOUND");
    assert.match(p2.detail, /not-a-uuid/);

    const p3 = await problemOf(
      await post(`${base}/${plane.fn.functionId}/versions/${randomUUID()}`, bearer(plane.fn.apiKey)),
      404,
    );
    assert.equal(p3.code, "VERSION_NOT_FOUND");

    const p4 = await problemOf(await post(plane.invokeUrl(), {}), 401);
    assert.equal(p4.code, "UNAUTHENTICATED");
    const p5 = await problemOf(
      await post(plane.invokeUrl(), { authorization: `Basic ${plane.fn.apiKey}` }),
      401,
    );
    assert.equal(p5.code, "UNAUTHENTICATED");
    const p6 = await problemOf(await post(plane.invokeUrl(), bearer("nvapi-unknown")), 401);
    assert.equal(p6.code, "TOKEN_INVALID");

    const p7 = await problemOf(
      await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${randomUUID()}`, {
        headers: bearer(plane.fn.apiKey),
      }),
      404,
    );
    assert.equal(p7.code, "REQUEST_NOT_FOUND");
    const p8 = await problemOf(
      await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/xyz`, { headers: bearer(plane.fn.apiKey) }),
      404,
    );
    assert.equal(p8.code, "REQUEST_NOT_FOUND");

    const p9 = await problemOf(await fetch(`${plane.replicas[0].url}/v2/nvcf/nothing-here`), 404);
    assert.equal(p9.code, "NOT_FOUND");
  },
);

test("a key without invoke_function is refused with 403 naming the scope", LIMIT, async (t) => {
  const plane = await startPlane(t);
  const lister = await createKey(plane, {
    description: "lists only",
    authorizations: { policies: [{ scopes: ["list_functions"] }] },
  });
  const res = await fetch(plane.invokeUrl(), {
    method: "POST",
    headers: bearer(lister.value, { "content-type": "application/json" }),
    body: "{}",
  });
  const p = await problemOf(res, 403);
  assert.equal(p.code, "FORBIDDEN_SCOPE");
  assert.match(p.detail, /invoke_function/);
  assert.equal(p.requiredScope, "invoke_function");
});

test("a revoked key is refused within the auth cache's TTL", LIMIT, async (t) => {
  const plane = await startPlane(t, {
    invocation: { authCache: { ttlSeconds: 1, negativeTtlSeconds: 1, maxEntries: 100 } },
  });
  const key = await createKey(plane, { description: "to revoke" });
  const invoke = () =>
    fetch(plane.invokeUrl(), {
      method: "POST",
      headers: bearer(key.value, { "content-type": "application/json" }),
      body: "{}",
    });
  const ok = await invoke();
  assert.equal(ok.status, 200, await ok.text());
  const admin = await plane.api.adminToken();
  const revoked = await call(`${plane.api.url}/v1/keys/${key.id}`, { method: "DELETE", token: admin });
  assert.equal(revoked.status, 200, revoked.text);
  const refusedAt = performance.now();
  const refused = await waitFor(
    "the revoked key to be refused",
    async () => {
      const res = await invoke();
      if (res.status === 200) {
        await res.text();
        return undefined;
      }
      return res;
    },
    { timeoutMs: 5000, intervalMs: 100 },
  );
  const p = await problemOf(refused, 401);
  assert.equal(p.code, "TOKEN_INVALID");
  assert.match(p.detail, /revoked/);
  assert.ok(performance.now() - refusedAt < 5000);
});

test(
  "the inference server sees NVCF headers and the client's end-to-end headers, never Authorization or hop-by-hop ones",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { inferenceUrl: "/headers" });
    const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    // node:http rather than fetch: fetch refuses to send Connection and Keep-Alive headers
    const { status, headers, body } = await new Promise<{
      status: number;
      headers: Record<string, string | string[] | undefined>;
      body: string;
    }>((resolve, reject) => {
      const req = httpRequest(
        `${plane.invokeUrl()}?q=1`,
        {
          method: "POST",
          agent: false,
          headers: {
            authorization: `Bearer ${plane.fn.apiKey}`,
            "content-type": "application/json",
            connection: "x-secret, keep-alive",
            "keep-alive": "timeout=5",
            "x-secret": "1",
            "proxy-authorization": "Basic c2VjcmV0",
            te: "trailers",
            traceparent,
            "x-custom": "kept",
            "nvcf-function-id": "00000000-0000-0000-0000-000000000000",
          },
        },
        (res) => {
          let text = "";
          res.setEncoding("utf8");
          res.on("data", (c: string) => (text += c));
          res.on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body: text }));
          res.on("error", reject);
        },
      );
      req.on("error", reject);
      req.end("{}");
    });
    assert.equal(status, 200, body);
    const seen = JSON.parse(body) as { method: string; url: string; headers: Record<string, string> };
    const h = seen.headers;
    assert.equal(seen.method, "POST");
    assert.equal(seen.url, "/headers?q=1");
    assert.equal(h.authorization, undefined, "the API key reached the inference server");
    assert.equal(h["proxy-authorization"], undefined);
    assert.equal(h["x-secret"], undefined, "a header named in Connection is hop-by-hop");
    assert.equal(h["keep-alive"], undefined);
    assert.equal(h.te, undefined);
    assert.doesNotMatch(h.connection ?? "", /x-secret/);
    assert.equal(h.traceparent, traceparent);
    assert.equal(h["x-custom"], "kept");
    assert.equal(h["nvcf-reqid"], headers["nvcf-reqid"]);
    assert.equal(h["nvcf-function-id"], plane.fn.functionId, "the client cannot set worker-owned headers");
    assert.equal(h["nvcf-function-version-id"], plane.fn.versionId);
    assert.match(h["nvcf-poll-seconds"] ?? "", /^\d+$/);
    assert.equal(h["nvcf-invocation-region"], "test");
  },
);

test("a full queue refuses the next invocation with 429 QUEUE_FULL", LIMIT, async (t) => {
  const plane = await startPlane(t, { workers: 0, queue: { maxMessages: 2 } });
  const messages = await streamMessages(plane, t);
  const ac = new AbortController();
  const queued = [0, 1].map(() =>
    fetch(plane.invokeUrl(), {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "content-type": "application/json" }),
      body: "{}",
      signal: ac.signal,
    }).catch(() => undefined),
  );
  await waitFor("two queued messages", async () => ((await messages()) === 2 ? true : undefined));
  const res = await fetch(plane.invokeUrl(), {
    method: "POST",
    headers: bearer(plane.fn.apiKey, { "content-type": "application/json" }),
    body: "{}",
  });
  const p = await problemOf(res, 429);
  assert.equal(p.code, "QUEUE_FULL");
  assert.match(p.detail, /2 waiting requests/);
  ac.abort();
  await Promise.all(queued);
  // the clients left: their messages are purged
  await waitFor("the stream to be empty", async () => ((await messages()) === 0 ? true : undefined));
});

test(
  "a replica that stops refuses new invocations with 503 and finishes the one in flight",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { inferenceUrl: "/slow" });
    // no progress file within the 2 s, so the answer is the final 200
    const inFlight = fetch(`${plane.invokeUrl()}?seconds=2&progressMs=60000`, {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "content-type": "application/json" }),
      body: "{}",
    }).then(async (res) => ({ res, text: await res.text() }));
    inFlight.catch(() => undefined);
    await waitFor("the worker to take the request", async () =>
      (await busySlots(plane)) === 1 ? true : undefined,
    );
    const closing = plane.replicas[0].service.close(10_000);
    const late = await fetch(plane.invokeUrl(), {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "content-type": "application/json" }),
      body: "{}",
    });
    assert.equal((await problemOf(late, 503)).code, "SHUTTING_DOWN");
    assert.equal(late.headers.get("connection"), "close");
    // a load balancer stops routing to a draining replica
    const health = await fetch(`${plane.replicas[0].url}/health`);
    assert.equal(health.status, 503);
    assert.equal(((await health.json()) as { status: string }).status, "draining");
    const { res, text } = await inFlight;
    assert.equal(res.status, 200, text);
    assert.equal(res.headers.get("nvcf-status"), "fulfilled");
    assert.deepEqual(JSON.parse(text), { done: true, seconds: 2 });
    await closing;
  },
);

test(
  "a body that stops arriving before its inline part is in gets 408 at the end of the window",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t);
    const u = new URL(plane.invokeUrl());
    const socket = netConnect({ port: Number(u.port), host: u.hostname, allowHalfOpen: true });
    t.after(() => socket.destroy());
    let answer = "";
    socket.on("data", (c: Buffer) => (answer += c.toString("latin1")));
    const closed = new Promise<void>((r) => socket.once("end", () => r()));
    socket.write(
      `POST ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nAuthorization: Bearer ${plane.fn.apiKey}\r\nNVCF-POLL-SECONDS: 1\r\nContent-Length: 100\r\n\r\nhello`,
    );
    await closed;
    assert.match(answer, /^HTTP\/1\.1 408 /, answer);
    assert.match(answer, /REQUEST_TIMEOUT/);
    // invocation.inlineBodySeconds (30 s) or the window, whichever is shorter
    assert.match(
      answer,
      /did not arrive within 1 s \(invocation\.inlineBodySeconds, or the poll window if shorter\)/,
    );
  },
);

test(
  "a request whose client stops polling is cancelled by its worker, and a late poll gets a final 404",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { replicas: 2, inferenceUrl: "/slow" });
    const stats = () => inferenceStats(plane);
    const before = await stats();
    const first = await fetch(`${plane.invokeUrl(0)}?seconds=60&progressMs=100000`, {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "1", "content-type": "application/json" }),
      body: "{}",
    });
    assert.equal(first.status, 202, await first.text());
    const id = first.headers.get("nvcf-reqid") ?? "";
    // no poll within max(2 x 1 s, 10 s): the worker stops the inference call
    await waitFor(
      "the inference call to be abandoned",
      async () => (await stats()).abandoned > before.abandoned,
      { timeoutMs: 20_000 },
    );
    // a poll now can never be answered: it gets a final 404, not "poll again" (504) forever
    const late = await fetch(`${plane.replicas[1].url}/v2/nvcf/pexec/status/${id}`, {
      headers: bearer(plane.fn.apiKey),
    });
    const p = await problemOf(late, 404);
    assert.equal(p.code, "REQUEST_NOT_FOUND");
    assert.match(p.detail, /no worker holds request/);
    const again = await fetch(`${plane.replicas[0].url}/v2/nvcf/pexec/status/${id}`, {
      headers: bearer(plane.fn.apiKey),
    });
    assert.equal((await problemOf(again, 404)).code, "REQUEST_NOT_FOUND");
  },
);
