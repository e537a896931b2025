// The replica relay (a callback that lands on a replica that does not hold the request is forwarded
// to the one that does, found in the registry of live replicas) and callbacks through the worker
// callback proxy. Replicas listen on their own loopback addresses (127.0.50.x), as pods have their
// own IPs; a "shared callback address" is every replica handing workers replica 1's URL, as a load
// balancer in front of them would.
import { setTimeout as sleep } from "node:timers/promises";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { get as httpsGet } from "node:https";
import { test } from "node:test";
import { holderHex, newToken } from "../../../src/lib/ids.js";
import { dashIp } from "../../../src/lib/net/index.js";
import { bearer, problemOf, waitFor } from "../../testkit/client.js";
import { freePort, metricValue, POSTED_ANSWERS, startPlane, type Plane } from "../../testkit/plane.js";

/** No test waits forever: a hang fails its test with a clear timeout instead of stalling the file. */
const LIMIT = { timeout: 60_000 };
const ATTACH = "/v2/nvcf/worker/request-attach";
const HOSTS = ["127.0.50.1", "127.0.50.2", "127.0.50.3"];
const H1 = "application/octet-stream+h1";
const FRAMED = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi";

/** A plane whose replicas all hand workers replica 1's URL (a shared callback address). */
async function sharedAddressPlane(
  t: Parameters<typeof startPlane>[0],
  opts: Parameters<typeof startPlane>[1] & { replicas: number },
): Promise<{ plane: Plane; shared: string }> {
  const port = await freePort(HOSTS[0]);
  const shared = `http://${HOSTS[0]}:${port}`;
  const plane = await startPlane(t, {
    replicaHosts: HOSTS,
    replica: (i) => (i === 0 ? { listen: { host: HOSTS[0], port } } : {}),
    selfAddress: shared,
    relay: { enabled: true },
    workerEnv: POSTED_ANSWERS,
    ...opts,
  });
  return { plane, shared };
}

function attachCount(plane: Plane, replica: number, labels: Record<string, string>): Promise<number> {
  return metricValue(plane.replicas[replica].service.registry, "callplane_attach_requests_total", labels);
}

/** A worker's POST request-attach, sent by hand to one replica. */
function postAttach(url: string, token: string, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${url}${ATTACH}`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": H1, ...headers },
    body: FRAMED,
    signal: AbortSignal.timeout(10_000),
  });
}

async function invoke(
  url: string,
  apiKey: string,
  body: string | Buffer,
  headers: Record<string, string> = {},
): Promise<{ res: Response; body: Buffer }> {
  const res = await fetch(url, {
    method: "POST",
    headers: bearer(apiKey, { "content-type": "application/octet-stream", ...headers }),
    body,
    signal: AbortSignal.timeout(30_000),
  });
  return { res, body: Buffer.from(await res.arrayBuffer()) };
}

test(
  "callbacks sent to the wrong replica are relayed to the one that holds each request",
  LIMIT,
  async (t) => {
    const { plane, shared } = await sharedAddressPlane(t, { replicas: 3, logs: true });
    for (const r of plane.replicas)
      assert.equal(r.service.targetUri, shared, "every replica hands out one URL");
    const calls = [0, 1, 2].flatMap((r) =>
      [0, 1, 2, 3].map(async (n) => {
        const payload = JSON.stringify({ replica: r, n, pad: randomBytes(64).toString("hex") });
        const { res, body } = await invoke(plane.invokeUrl(r), plane.fn.apiKey, payload);
        return { r, payload, res, text: body.toString() };
      }),
    );
    for (const { r, payload, res, text } of await Promise.all(calls)) {
      assert.equal(res.status, 200, text);
      assert.equal(text, payload, `replica ${r + 1} answered another request's payload`);
      assert.equal(res.headers.get("nvcf-status"), "fulfilled");
      const id = res.headers.get("nvcf-reqid") ?? "";
      assert.equal(id.slice(0, 8), holderHex(plane.replicas[r].service.holderId), "the id names its holder");
    }
    // Replica 1 received every callback; those for replicas 2 and 3 it relayed, its own it took.
    assert.equal(await attachCount(plane, 0, { kind: "response", result: "relayed" }), 8);
    assert.equal(await attachCount(plane, 0, { kind: "response", result: "ok" }), 4);
    for (const r of [1, 2]) {
      assert.equal(await attachCount(plane, r, { kind: "response", result: "ok" }), 4, `replica ${r + 1}`);
      assert.equal(await attachCount(plane, r, { result: "relayed" }), 0, `replica ${r + 1} relayed nothing`);
    }
    // a relay logs its line once the exchange is over, just after the client has its answer
    const relayLines = await waitFor("a log line for each relayed callback", () => {
      const lines = plane
        .logs("replica-0")
        .filter((l) => l.msg === "relayed a callback to the replica that holds it");
      return lines.length >= 8 ? lines : undefined;
    });
    assert.equal(relayLines.length, 8);
    assert.deepEqual(
      new Set(relayLines.map((l) => l.holder)),
      new Set([1, 2].map((r) => holderHex(plane.replicas[r].service.holderId))),
    );
    for (const l of relayLines) {
      assert.equal(l.status, 200);
      assert.equal(l.outcome, "forwarded");
      assert.ok(
        [1, 2].some((r) => l.to === plane.replicas[r].url),
        `relayed to ${String(l.to)}, an address from the registry`,
      );
    }
  },
);

test("large bodies pass the relay both ways, streamed and intact", LIMIT, async (t) => {
  const { plane } = await sharedAddressPlane(t, { replicas: 2 });
  const digest = await plane.addFunction({ inferenceUrl: "/digest" });
  const large = await plane.addFunction({ inferenceUrl: "/large" });

  // 5 MiB up: 32 KiB travel inline, the rest is fetched with GET request-attach through the relay
  const body = randomBytes(5 * 1024 * 1024);
  const up = await invoke(digest.invokeUrl(1), digest.fn.apiKey, body);
  assert.equal(up.res.status, 200, up.body.toString().slice(0, 300));
  assert.deepEqual(JSON.parse(up.body.toString()), {
    bytes: body.length,
    sha256: createHash("sha256").update(body).digest("hex"),
  });
  assert.equal(await attachCount(plane, 0, { kind: "request", result: "relayed" }), 1);
  assert.equal(await attachCount(plane, 1, { kind: "request", result: "ok" }), 1);

  // 8 MiB down: the framed answer flows from the worker through replica 1 to replica 2's client
  const bytes = 8 * 1024 * 1024 + 123;
  const down = await invoke(`${large.invokeUrl(1)}?bytes=${bytes}`, large.fn.apiKey, "");
  assert.equal(down.res.status, 200);
  assert.equal(down.body.length, bytes);
  const chunk = Buffer.alloc(64 * 1024);
  for (let i = 0; i < chunk.length; i++) chunk[i] = i % 251;
  for (let off = 0; off < bytes; off += chunk.length) {
    const n = Math.min(chunk.length, bytes - off);
    assert.ok(down.body.subarray(off, off + n).equals(chunk.subarray(0, n)), `bytes differ at ${off}`);
  }
  assert.equal(await attachCount(plane, 0, { kind: "response", result: "relayed" }), 2);
});

test("a callback for a replica that is gone gets 502 HOLDER_GONE at once, never a hang", LIMIT, async (t) => {
  const { plane } = await sharedAddressPlane(t, {
    replicas: 2,
    relay: { enabled: true, registryTtlMs: 1000 },
    inferenceUrl: "/slow",
    logs: true,
  });
  const replica1 = plane.replicas[0].url;

  // a holder that never existed
  let started = performance.now();
  const unknown = await postAttach(replica1, `deadbeef.${newToken()}`);
  const never = await problemOf(unknown, 502);
  assert.ok(performance.now() - started < 2000, "the worker is answered at once");
  assert.equal(never.code, "HOLDER_GONE");
  assert.match(never.detail, /deadbeef/);
  assert.match(never.detail, /not in the registry/);

  // a real request held by replica 2, which dies while the worker works on it
  const gone = plane.replicas[1];
  const goneHex = holderHex(gone.service.holderId);
  const client = fetch(`${plane.invokeUrl(1)}?seconds=1`, {
    method: "POST",
    headers: bearer(plane.fn.apiKey, { "content-type": "application/json" }),
    body: "{}",
  }).then(
    (r) => r.status,
    () => "connection lost",
  );
  await waitFor("the worker to take the request", async () =>
    (await metricValue(plane.workers[0].registry, "callplane_worker_busy_slots")) === 1 ? true : undefined,
  );
  gone.service.destroy();
  assert.equal(await client, "connection lost");
  // the worker finishes after 1 s and calls back at the shared address: replica 1 relays, finds
  // the holder's address refusing connections (or, once its entry expired, no entry at all)
  const line = await waitFor(
    "the worker to be told the holder is gone",
    () => plane.logs("worker-0").find((l) => l.msg === "the replica did not take the response"),
    { timeoutMs: 10_000 },
  );
  assert.equal(line.status, 502);
  assert.match(String(line.answer), /HOLDER_GONE/);
  assert.match(String(line.answer), new RegExp(goneHex));

  // a callback for the dead replica, while and after its registry entry expires
  started = performance.now();
  const soon = await problemOf(await postAttach(replica1, `${goneHex}.${newToken()}`), 502);
  assert.ok(performance.now() - started < 2000, "the worker is answered at once");
  assert.equal(soon.code, "HOLDER_GONE");
  const expired = await waitFor(
    "the dead replica's registry entry to expire",
    async () => {
      const p = await problemOf(await postAttach(replica1, `${goneHex}.${newToken()}`), 502);
      return /not in the registry/.test(p.detail) ? p : undefined;
    },
    { timeoutMs: 10_000, intervalMs: 200 },
  );
  assert.equal(expired.code, "HOLDER_GONE");
  assert.match(expired.detail, new RegExp(goneHex));
});

test("a callback that was relayed once is never relayed again", LIMIT, async (t) => {
  const { plane } = await sharedAddressPlane(t, { replicas: 2, workers: 0 });
  const token = `${holderHex(plane.replicas[1].service.holderId)}.${newToken()}`;
  const looped = await postAttach(plane.replicas[0].url, token, { "x-callplane-relayed": "0badc0de" });
  assert.equal((await problemOf(looped, 401)).code, "ATTACH_TOKEN_INVALID");
  assert.equal(await attachCount(plane, 0, { result: "relayed" }), 0);
  assert.equal(await attachCount(plane, 1, {}), 0, "nothing reached the holder");

  // the same token without the marker is relayed once; the holder, which does not know it, refuses
  // it and does not send it back
  const once = await postAttach(plane.replicas[0].url, token);
  assert.equal((await problemOf(once, 401)).code, "ATTACH_TOKEN_INVALID");
  assert.equal(await attachCount(plane, 0, { result: "relayed" }), 1);
  assert.equal(await attachCount(plane, 1, { result: "bad_token" }), 1);
  assert.equal(await attachCount(plane, 1, { result: "relayed" }), 0);
});

test(
  "with the relay turned off, a callback for another replica is refused and that client times out",
  LIMIT,
  async (t) => {
    const { plane } = await sharedAddressPlane(t, {
      replicas: 2,
      relay: { enabled: false },
      invocation: {
        poll: { defaultSeconds: 60, streamingDefaultSeconds: 60, maxSeconds: 3600, graceSeconds: 0.5 },
      },
      logs: true,
    });
    const token = `${holderHex(plane.replicas[1].service.holderId)}.${newToken()}`;
    const refused = await postAttach(plane.replicas[0].url, token);
    assert.equal((await problemOf(refused, 401)).code, "ATTACH_TOKEN_INVALID");

    // what the configuration rule prevents: the worker's callback lands on replica 1 and is dropped
    const res = await fetch(plane.invokeUrl(1), {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "content-type": "application/json", "nvcf-poll-seconds": "1" }),
      body: "{}",
      signal: AbortSignal.timeout(20_000),
    });
    assert.equal((await problemOf(res, 504)).code, "INVOCATION_TIMEOUT");
    const line = await waitFor("the worker's refused callback", () =>
      plane.logs("worker-0").find((l) => l.msg === "the replica did not take the response"),
    );
    assert.equal(line.status, 401);
    assert.equal(await attachCount(plane, 0, { kind: "response", result: "bad_token" }), 2);
    assert.equal(await attachCount(plane, 0, { result: "relayed" }), 0);
  },
);

test(
  "status polls on replicas that do not hold the request are answered, with callbacks through the proxy",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, {
      replicas: 3,
      replicaHosts: HOSTS,
      proxy: true,
      relay: { enabled: true },
      inferenceUrl: "/slow",
      workerEnv: POSTED_ANSWERS,
    });
    const podName = (r: number) => `${HOSTS[r].replaceAll(".", "-")}.invocation.nvcf.svc.cluster.local`;
    for (const [r, replica] of plane.replicas.entries()) {
      assert.equal(replica.service.targetUri, `http://${podName(r)}:${plane.proxy!.podPort}`);
    }
    const first = await fetch(`${plane.invokeUrl(0)}?seconds=4`, {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "1", "content-type": "application/json" }),
      body: "{}",
      signal: AbortSignal.timeout(20_000),
    });
    assert.equal(first.status, 202, await first.text());
    const id = first.headers.get("nvcf-reqid") ?? "";
    const answeredBy = new Set<number>();
    let final: { status: number; text: string } | undefined;
    let polls = 0;
    for (let n = 0; !final; n++) {
      polls++;
      assert.ok(n < 30, "no final answer after 30 polls");
      const r = 1 + (n % 2); // replicas 2 and 3 only: neither holds the request
      const res = await fetch(`${plane.replicas[r].url}/v2/nvcf/pexec/status/${id}`, {
        headers: bearer(plane.fn.apiKey, { "nvcf-poll-seconds": "1" }),
        signal: AbortSignal.timeout(20_000),
      });
      const text = await res.text();
      assert.ok(res.status === 202 || res.status === 200, `poll on replica ${r + 1}: ${res.status} ${text}`);
      assert.equal(res.headers.get("nvcf-reqid"), id);
      answeredBy.add(r);
      if (res.status === 200) final = { status: res.status, text };
    }
    assert.deepEqual(JSON.parse(final.text), { done: true, seconds: 4 });
    assert.deepEqual([...answeredBy].sort(), [1, 2], "both replicas answered polls");

    // every worker callback went through the proxy, to the pod that minted its token
    // one callback for the first 202 and one per poll; each is logged once its exchange is over
    const lines = await waitFor("an access-log line per callback", () => {
      const l = plane.proxy!.accessLog();
      return l.length >= 1 + polls ? l : undefined;
    });
    assert.equal(lines.length, 1 + polls);
    assert.ok(
      lines.every((l) => l.outcome === "forwarded" && l.status === 200),
      JSON.stringify(lines),
    );
    const pods = new Set(lines.map((l) => l.target));
    assert.ok(pods.has(podName(0)), "the first 202 went to the holder's pod");
    assert.ok(pods.has(podName(1)) && pods.has(podName(2)), `pods reached: ${[...pods].join(", ")}`);
    assert.equal(plane.proxy!.callbacks("forwarded"), lines.length);
    for (const r of [0, 1, 2]) assert.equal(await attachCount(plane, r, { result: "relayed" }), 0);
  },
);

test("200 invocations spread over two replicas all come back right through the proxy", LIMIT, async (t) => {
  const plane = await startPlane(t, {
    replicas: 2,
    replicaHosts: HOSTS.slice(0, 2),
    proxy: true,
    workers: 2,
    workerEnv: POSTED_ANSWERS,
  });
  let next = 0;
  const failures: string[] = [];
  const loop = async () => {
    for (let n = next++; n < 200; n = next++) {
      // one body in five is larger than the inline part, so GET request-attach goes through the proxy too
      const body =
        n % 10 < 2 ? randomBytes(100 * 1024) : Buffer.from(JSON.stringify({ n, r: Math.random() }));
      const r = n % 2;
      try {
        const { res, body: got } = await invoke(plane.invokeUrl(r), plane.fn.apiKey, body);
        if (res.status !== 200 || !got.equals(body))
          failures.push(`#${n} on replica ${r + 1}: ${res.status} ${got.toString().slice(0, 200)}`);
      } catch (err) {
        failures.push(`#${n} on replica ${r + 1}: ${(err as Error).message}`);
      }
    }
  };
  await Promise.all(Array.from({ length: 16 }, loop));
  assert.deepEqual(failures, []);
  // 200 POST callbacks and 40 GETs for the bodies beyond the inline part, each counted once its
  // exchange is over (a moment after the client has its answer), all forwarded
  const proxy = plane.proxy!;
  await waitFor("the proxy to log every callback", () =>
    Promise.resolve(proxy.callbacks() >= 240 ? true : undefined),
  );
  assert.equal(proxy.callbacks("forwarded"), 240);
  for (const r of [0, 1]) {
    assert.equal(await attachCount(plane, r, { kind: "response", result: "ok" }), 100, `replica ${r + 1}`);
    assert.equal(await attachCount(plane, r, { kind: "request", result: "ok" }), 20, `replica ${r + 1}`);
  }
  const pods = new Set(plane.proxy!.accessLog().map((l) => l.target));
  assert.equal(pods.size, 2, "callbacks reached both pods");
});

test(
  "every callback through the proxy is one access-log line, streamed bodies too",
  {
    ...LIMIT,
  },
  async (t) => {
    const plane = await startPlane(t, {
      replicaHosts: HOSTS.slice(0, 1),
      proxy: true,
      workerEnv: POSTED_ANSWERS,
    });
    // 100 KiB: fetched with GET request-attach, answered with a POST whose body streams in chunks
    const body = randomBytes(100 * 1024);
    const { res, body: got } = await invoke(plane.invokeUrl(0), plane.fn.apiKey, body);
    assert.equal(res.status, 200);
    assert.ok(got.equals(body));
    const lines = await waitFor(
      "an access-log line for the GET and the POST",
      () => {
        const l = plane.proxy!.accessLog();
        return l.length >= 2 ? l : undefined;
      },
      { timeoutMs: 3000 },
    );
    assert.deepEqual(lines.map((l) => l.method).sort(), ["GET", "POST"]);
    for (const l of lines) {
      assert.equal(l.outcome, "forwarded");
      assert.match(String(l.worker), /^127\.0\.0\.1:\d+$/);
    }
    // the worker TLS listener serves the attach routes and /health, not the replica's metrics
    const podUrl = `https://${plane.replicas[0].host}:${plane.proxy!.podPort}`;
    const get = (path: string) =>
      new Promise<number>((resolve, reject) => {
        const r = httpsGet(
          `${podUrl}${path}`,
          {
            ca: plane.proxy!.pki.ca.certPem,
            servername: `${dashIp(plane.replicas[0].host)}.invocation.nvcf.svc.cluster.local`,
          },
          (res) => {
            res.resume();
            resolve(res.statusCode ?? 0);
          },
        );
        r.on("error", reject);
      });
    assert.equal(await get("/health"), 200);
    assert.equal(await get("/metrics"), 404);
  },
);

test(
  "a replica that drains still gets the relayed callbacks of the requests it holds",
  {
    ...LIMIT,
  },
  async (t) => {
    const { plane } = await sharedAddressPlane(t, { replicas: 2, inferenceUrl: "/slow", logs: true });
    const client = fetch(`${plane.invokeUrl(1)}?seconds=1`, {
      method: "POST",
      headers: bearer(plane.fn.apiKey, { "content-type": "application/json" }),
      body: "{}",
      signal: AbortSignal.timeout(20_000),
    }).then(async (r) => ({ status: r.status, text: await r.text() }));
    await waitFor("the worker to take the request", async () =>
      (await metricValue(plane.workers[0].registry, "callplane_worker_busy_slots")) === 1 ? true : undefined,
    );
    // a graceful stop: in-flight work (and its worker callbacks) is to finish
    const closing = plane.replicas[1].service.close(4000);
    const answer = await client;
    await closing;
    assert.equal(answer.status, 200, answer.text);
    assert.deepEqual(JSON.parse(answer.text), { done: true, seconds: 1 });
  },
);

test(
  "callplane's workers answer small requests over NATS and post large answers through the proxy",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { replicaHosts: HOSTS.slice(0, 1), proxy: true });
    const small = Buffer.from(JSON.stringify({ small: true }));
    for (let n = 0; n < 5; n++) {
      const { res, body } = await invoke(plane.invokeUrl(0), plane.fn.apiKey, small);
      assert.equal(res.status, 200);
      assert.ok(body.equals(small));
    }
    // 100 KiB echoed: larger than an answer over NATS may be, so it is posted (and its request
    // body fetched with GET request-attach), both through the proxy
    const large = randomBytes(100 * 1024);
    const { res, body } = await invoke(plane.invokeUrl(0), plane.fn.apiKey, large);
    assert.equal(res.status, 200);
    assert.ok(body.equals(large));
    const lines = await waitFor(
      "an access-log line for the GET and the POST",
      () => {
        const l = plane.proxy!.accessLog();
        return l.length >= 2 ? l : undefined;
      },
      { timeoutMs: 3000 },
    );
    await sleep(300);
    assert.deepEqual(
      plane
        .proxy!.accessLog()
        .map((l) => l.method)
        .sort(),
      ["GET", "POST"],
      "the five small answers did not go through the proxy",
    );
    assert.equal(lines.length, 2);
    assert.equal(await attachCount(plane, 0, { kind: "response", result: "ok" }), 6);
  },
);
