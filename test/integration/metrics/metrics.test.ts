// What an operator reads on /metrics after known traffic, from real services (nats-server, the API,
// invocation replicas, workers, HAProxy as the callback proxy, grpc-proxy): every invocation is
// counted once, in the series of its function version, with its outcome and status class; the
// latency histograms count what they should; the queue depth the API samples rises while no worker
// takes work and falls once one does.
import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { echoMessage, grpcClient, meta, startGrpcPlane, unary } from "../../testkit/grpc.js";
import { parseMetrics, scrape, scrapeUntil, valueOf, type Scrape } from "../../testkit/metrics.js";
import { type DeployedFunction, deployFunction, POSTED_ANSWERS, startPlane } from "../../testkit/plane.js";

const LIMIT = { timeout: 120_000 };

function invoke(
  url: string,
  fn: DeployedFunction,
  opts: { pollSeconds?: number; query?: string; signal?: AbortSignal } = {},
): Promise<Response> {
  return fetch(`${url}/v2/nvcf/pexec/functions/${fn.functionId}${opts.query ?? ""}`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${fn.apiKey}`,
      "content-type": "application/json",
      ...(opts.pollSeconds ? { "nvcf-poll-seconds": String(opts.pollSeconds) } : {}),
    },
    body: JSON.stringify({ hello: "metrics" }),
    ...(opts.signal ? { signal: opts.signal } : {}),
  });
}

const ids = (fn: DeployedFunction) => ({ function_id: fn.functionId, function_version_id: fn.versionId });

test(
  "an invocation replica counts each invocation once, in its function version's series",
  LIMIT,
  async (t) => {
    // every answer posted through HAProxy (none over NATS), so that its metrics count the callbacks
    const plane = await startPlane(t, {
      proxy: true,
      invocation: { metricsOnClientPort: true },
      workerEnv: POSTED_ANSWERS,
    });
    const replica = plane.replicas[0].url;
    const echo = plane.fn;
    const slow = await plane.addFunction({ inferenceUrl: "/slow" });
    const missing = await plane.addFunction({ inferenceUrl: "/no-such-route" });
    // deployed, but no worker ever takes its work
    const idle = await deployFunction(plane.api, "idle");

    for (let i = 0; i < 3; i++) {
      const r = await invoke(replica, echo);
      assert.equal(r.status, 200, await r.text());
    }
    // the worker answers 202 when the poll window nears its end
    const accepted = await invoke(replica, slow.fn, { pollSeconds: 1, query: "?seconds=5" });
    assert.equal(accepted.status, 202, await accepted.text());
    const notFound = await invoke(replica, missing.fn);
    assert.equal(notFound.status, 404, await notFound.text());
    const timedOut = await invoke(replica, idle, { pollSeconds: 1 });
    assert.equal(timedOut.status, 504, await timedOut.text());
    // a client that leaves while its request is held
    const ac = new AbortController();
    const gone = invoke(replica, slow.fn, { query: "?seconds=30", signal: ac.signal }).catch(() => undefined);
    await scrapeUntil(
      `${replica}/metrics`,
      "the slow request held",
      (s) => valueOf(s, "callplane_invocations_in_flight", ids(slow.fn)) === 1,
    );
    ac.abort();
    await gone;

    // every client's response has closed once nothing is in flight
    const m = await scrapeUntil(
      `${replica}/metrics`,
      "nothing in flight",
      (s) => valueOf(s, "callplane_invocations_total", ids(slow.fn)) === 2,
    );
    const inv = (fn: DeployedFunction, outcome: string, status_class: string) =>
      valueOf(m, "callplane_invocations_total", { ...ids(fn), outcome, status_class });
    assert.equal(inv(echo, "answered", "2xx"), 3);
    assert.equal(inv(slow.fn, "answered", "2xx"), 1, "the 202 is an answer");
    assert.equal(inv(slow.fn, "client_gone", "none"), 1);
    assert.equal(inv(missing.fn, "answered", "4xx"), 1, "the worker's 404 is its answer");
    assert.equal(inv(idle, "timeout", "5xx"), 1);
    assert.equal(valueOf(m, "callplane_invocations_total"), 7, "nothing else was counted");
    for (const [fn, n, answered] of [
      [echo, 3, 3],
      [slow.fn, 2, 1],
      [missing.fn, 1, 1],
      [idle, 1, 0],
    ] as const) {
      assert.equal(valueOf(m, "callplane_invocation_duration_seconds_count", ids(fn)), n, fn.functionId);
      assert.equal(valueOf(m, "callplane_invocation_first_byte_seconds_count", ids(fn)), answered);
      assert.equal(valueOf(m, "callplane_invocation_duration_seconds_bucket", { ...ids(fn), le: "+Inf" }), n);
      assert.equal(valueOf(m, "callplane_invocations_in_flight", ids(fn)), 0);
    }
    // HTTP by route, method and status: the route's pattern, never the function id
    const route = "/v2/nvcf/pexec/functions/:fid";
    const http = (status: string) =>
      valueOf(m, "callplane_http_requests_total", { route, method: "POST", status });
    assert.deepEqual(
      ["200", "202", "404", "504", "0"].map(http),
      [3, 1, 1, 1, 1],
      "200, 202, 404, 504, and 0 for the client that left",
    );
    assert.equal(valueOf(m, "callplane_http_request_duration_seconds_count", { route, method: "POST" }), 7);
    assert.ok(!m.text.includes(`route="/v2/nvcf/pexec/functions/${echo.functionId}`));
    // the callbacks (through HAProxy): one response attach per answer
    assert.equal(valueOf(m, "callplane_attach_requests_total", { kind: "response", result: "ok" }), 5);
    assert.equal(valueOf(m, "callplane_nats_connected"), 1);
    const haproxy = await scrape(plane.proxy!.metricsUrl);
    assert.ok(
      valueOf(haproxy, "haproxy_backend_http_responses_total", { proxy: "invocation_pods", code: "2xx" }) >=
        5,
      "HAProxy passed the callbacks to the replica",
    );

    // the echo function's worker: labelled with its version, its busy time counted beside its slots
    const w = parseMetrics(await plane.workers[0].registry.metrics());
    assert.equal(valueOf(w, "callplane_worker_requests_total", { ...ids(echo) }), 3);
    assert.equal(valueOf(w, "callplane_worker_slots", ids(echo)), 8);
    assert.equal(valueOf(w, "callplane_worker_busy_slots", ids(echo)), 0);
    const busy = valueOf(w, "callplane_worker_busy_seconds_total", ids(echo));
    assert.ok(busy > 0, `busy seconds ${busy}`);
    // a request still running counts its busy time so far (not only once it ends)
    const slowWorker = async () => parseMetrics(await plane.workers[1].registry.metrics());
    const hold = invoke(replica, slow.fn, { query: "?seconds=2" });
    let s = await slowWorker();
    while (valueOf(s, "callplane_worker_busy_slots") < 1) {
      await sleep(50);
      s = await slowWorker();
    }
    const before = valueOf(s, "callplane_worker_busy_seconds_total");
    assert.ok(valueOf(await slowWorker(), "callplane_worker_busy_seconds_total") > before);
    assert.ok([200, 202].includes((await hold).status));
  },
);

test(
  "the queue depth the API samples rises while no worker takes work, and falls once one does",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { workers: 0, invocation: { metricsOnClientPort: true } });
    const fn = plane.fn;
    const api = `${plane.api.url}/metrics`;
    const depth = (s: Scrape) => valueOf(s, "callplane_queue_depth", ids(fn));
    const idle = await scrapeUntil(api, "the version's queue sampled", (s) =>
      s.samples.some(
        (x) => x.name === "callplane_queue_depth" && x.labels.function_version_id === fn.versionId,
      ),
    );
    assert.equal(depth(idle), 0);
    assert.equal(valueOf(idle, "callplane_deployment_instances_desired", ids(fn)), 1);
    assert.equal(
      valueOf(idle, "callplane_deployment_instances_ready", ids(fn)),
      0,
      "no compute agent reports one",
    );

    const held = [1, 2, 3].map(() => invoke(plane.replicas[0].url, fn, { pollSeconds: 60 }));
    const queued = await scrapeUntil(api, "three messages queued", (s) => depth(s) === 3);
    assert.equal(valueOf(queued, "callplane_queue_in_progress", ids(fn)), 0);
    const r = await scrape(`${plane.replicas[0].url}/metrics`);
    assert.equal(valueOf(r, "callplane_invocations_in_flight", ids(fn)), 3);

    await plane.addWorker();
    for (const p of held) assert.equal((await p).status, 200);
    await scrapeUntil(api, "the queue drained", (s) => depth(s) === 0);
  },
);

test(
  "grpc-proxy counts each call in its function version's series, and its own refusals by code",
  LIMIT,
  async (t) => {
    const plane = await startGrpcPlane(t);
    const { proxy, target } = plane.proxies[0];
    const client = grpcClient(t, target);
    for (let i = 0; i < 2; i++) {
      const r = await unary(client, echoMessage("hi"), meta(plane.fn));
      assert.equal(r.err, null);
    }
    const noKey = await unary(client, echoMessage("hi"), meta({ ...plane.fn, apiKey: "nope" }));
    assert.ok(noKey.err);
    const url = `${proxy.urls!.connect.origin}/metrics`;
    const m = await scrapeUntil(
      url,
      "two calls counted",
      (s) =>
        valueOf(s, "callplane_grpc_calls_total", ids(plane.fn)) === 2 &&
        valueOf(s, "callplane_grpc_calls_in_flight", ids(plane.fn)) === 0,
    );
    assert.equal(
      valueOf(m, "callplane_grpc_calls_total", { ...ids(plane.fn), outcome: "ok", grpc_code: "OK" }),
      2,
    );
    assert.equal(valueOf(m, "callplane_grpc_call_duration_seconds_count", ids(plane.fn)), 2);
    assert.equal(valueOf(m, "callplane_grpc_call_first_byte_seconds_count", ids(plane.fn)), 2);
    // refused before its function version was known: by code, in no function's series
    assert.equal(valueOf(m, "callplane_grpc_refusals_total"), 1);
    assert.equal(valueOf(m, "callplane_grpc_calls_total"), 2);
    assert.equal(valueOf(m, "callplane_grpc_tunnels_total", { result: "ok" }), 1);
    assert.equal(valueOf(m, "callplane_nats_connected"), 1);
  },
);
