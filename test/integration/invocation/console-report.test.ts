// What the invocation replicas tell the operator console over NATS (services/invocation/
// console-report.ts), asked as the API asks (services/api/replica-reports.ts, on a connection with
// the API's own NATS grant): the requests each replica holds, how one request went, the live
// replicas; and that a worker's NATS identity may neither ask nor pose as a replica.
import assert from "node:assert/strict";
import type { IncomingMessage, ServerResponse } from "node:http";
import { test } from "node:test";
import { handle as exampleHandler } from "../../../examples/inference-server.js";
import { holderHex, newHolderId, newRequestId } from "../../../src/lib/ids.js";
import { silentLogger } from "../../../src/lib/log.js";
import {
  connectNats,
  DEFAULT_QUEUE_LIMITS,
  INBOX,
  readWorkerSeed,
  REGISTRY_BUCKET,
  subjects,
} from "../../../src/lib/nats/index.js";
import { ReplicaReports, type ReplicaReport } from "../../../src/services/api/replica-reports.js";
import type { Store } from "../../../src/services/api/store/types.js";
import { WorkerTrust, type WorkerTrustOptions } from "../../../src/services/api/worker-trust.js";
import { waitFor } from "../../testkit/client.js";
import { startPlane } from "../../testkit/plane.js";
import { connectWithNkey } from "../../testkit/trust.js";

const LIMIT = { timeout: 90_000 };

/**
 * An inference server whose /hold answers only when the test lets it: with ?head=1 it sends its
 * response head and first bytes at once (the request is then "responding" on its replica), else
 * nothing until released (the request stays "queued" there: no worker's answer has begun). With
 * ?length=1 the answer has a Content-Length (a worker sends such a small answer over NATS).
 */
function heldInference() {
  const waiting: Array<() => void> = [];
  const handler = (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://inference");
    if (url.pathname !== "/hold") return exampleHandler(req, res);
    req.resume();
    if (url.searchParams.get("head") === "1") {
      res.writeHead(200, { "content-type": "text/plain" });
      res.write("first ");
    }
    const length = url.searchParams.has("length") ? { "content-length": "4" } : {};
    waiting.push(() => {
      if (!res.headersSent) res.writeHead(200, { "content-type": "text/plain", ...length });
      res.end("done");
    });
  };
  return {
    handler,
    held: () => waiting.length,
    release: () => waiting.splice(0).forEach((f) => f()),
  };
}

function invoke(url: string, apiKey: string, pollSeconds: number): Promise<Response> {
  return fetch(url, {
    method: "POST",
    headers: {
      authorization: `Bearer ${apiKey}`,
      "content-type": "application/json",
      "nvcf-poll-seconds": String(pollSeconds),
    },
    body: "{}",
  });
}

test(
  "the console sees each replica's requests in flight, how each one ended, and the live replicas",
  LIMIT,
  async (t) => {
    const inference = heldInference();
    const plane = await startPlane(t, {
      replicas: 2,
      relay: { enabled: true },
      inferenceUrl: "/hold",
      inferenceHandler: inference.handler,
    });
    // asked as the API asks: through its WorkerTrust, on its APP connection (the console's path)
    const trustOpts = {
      region: "test",
      queue: DEFAULT_QUEUE_LIMITS,
      workerAuth: "nkey" as const,
      identity: {} as WorkerTrustOptions["identity"],
    };
    const noNats = new WorkerTrust(trustOpts, {} as Store, silentLogger());
    await noNats.start();
    assert.equal(noNats.replicaReports(), undefined, "no NATS configured: nothing to ask");
    const trust = new WorkerTrust(
      { ...trustOpts, nats: { app: plane.nats.access("api") } },
      {} as Store,
      silentLogger(),
    );
    await trust.start();
    t.after(() => trust.close());
    const reports = trust.replicaReports()!;
    const { fn } = plane;
    const [h0, h1] = plane.replicas.map((r) => holderHex(r.service.holderId));
    const ofReplica = (all: ReplicaReport[], h: string) => all.find((r) => r.holder === h);

    // three requests held by replica 0, one at a time so their order is known; one answering on replica 1
    const queued: Array<Promise<Response>> = [];
    for (let i = 0; i < 3; i++) {
      queued.push(invoke(plane.invokeUrl(0), fn.apiKey, 60));
      await waitFor(
        `request ${i + 1} at the inference server`,
        () => inference.held() === i + 1 || undefined,
      );
    }
    const responding = await invoke(`${plane.invokeUrl(1)}?head=1`, fn.apiKey, 60);
    assert.equal(responding.status, 200);
    const respondingId = responding.headers.get("nvcf-reqid")!;

    const registry = await reports.registry();
    assert.deepEqual(
      registry
        .filter((e) => e.kind === "invocation")
        .map((e) => e.holder)
        .sort(),
      [h0, h1].sort(),
      "both replicas are in the registry",
    );
    for (const e of registry) assert.match(e.relayUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
    // no worker TLS listener here: no certificate to name
    for (const e of registry) assert.deepEqual(e.certificates, []);

    const all = await reports.snapshot();
    assert.equal(all.length, 2, "every replica answers");
    const r0 = ofReplica(all, h0)!;
    const r1 = ofReplica(all, h1)!;
    assert.equal(r0.kind, "invocation");
    assert.match(r0.version, /^\d+\.\d+\.\d+/);
    assert.ok(!Number.isNaN(Date.parse(r0.startedAt)));
    assert.equal(r0.inFlight, 3);
    assert.equal(r0.requests.length, 3);
    for (const row of r0.requests) {
      assert.equal(row.functionId, fn.functionId);
      assert.equal(row.versionId, fn.versionId);
      assert.equal(row.state, "queued");
      assert.equal(row.poll, false);
      assert.equal(row.requestId.slice(0, 8), h0, "its id names its replica");
    }
    const ages = r0.requests.map((r) => r.ageMs);
    assert.deepEqual(
      ages,
      [...ages].sort((a, b) => b - a),
      "oldest first",
    );
    assert.deepEqual(
      r0.functions.map((f) => [f.versionId, f.inFlight]),
      [[fn.versionId, 3]],
    );
    assert.deepEqual(
      r1.requests.map((r) => [r.requestId, r.state]),
      [[respondingId, "responding"]],
    );

    const limited = ofReplica(await reports.snapshot({ limit: 2 }), h0)!;
    assert.equal(limited.inFlight, 3, "the total is all of them");
    assert.deepEqual(
      limited.requests.map((r) => r.requestId),
      r0.requests.slice(0, 2).map((r) => r.requestId),
      "the limit keeps the oldest",
    );
    const other = ofReplica(
      await reports.snapshot({ functionId: "00000000-0000-4000-8000-000000000000" }),
      h0,
    )!;
    assert.deepEqual([other.inFlight, other.requests.length, other.functions.length], [0, 0, 0]);

    const queuedId = r0.requests[0].requestId;
    const q = await reports.lookup(queuedId);
    assert.equal(q?.state, "queued");
    assert.equal(q.holder, h0);
    assert.equal(q.functionId, fn.functionId);
    assert.ok(q.ageMs! >= 0);
    assert.equal((await reports.lookup(respondingId))?.state, "responding");

    // released: every one is answered; the console's minute counts them
    inference.release();
    const answers = await Promise.all(queued);
    for (const a of answers) assert.equal(await a.text(), "done");
    assert.equal(await responding.text(), "first done");
    const answered = await waitFor("the lookup to say answered", async () => {
      const l = await reports.lookup(queuedId);
      return l?.state === "answered" ? l : undefined;
    });
    assert.equal(answered.status, 200);
    assert.equal(answered.versionId, fn.versionId);
    assert.equal(answered.code, undefined);
    assert.ok(answered.durationMs! > 0);
    assert.ok(!Number.isNaN(Date.parse(answered.endedAt!)));
    const after = ofReplica(await reports.snapshot(), h0)!;
    assert.equal(after.inFlight, 0);
    const stats = after.functions.find((f) => f.versionId === fn.versionId)!;
    assert.deepEqual([stats.requests, stats.errors, stats.inFlight], [3, 0, 0]);
    assert.ok(stats.p50Ms! > 0 && stats.p99Ms! >= stats.p50Ms!, JSON.stringify(stats));

    // a function no worker serves: its request times out, and the lookup says so, with the code
    const lonely = await plane.addFunction({ inferenceUrl: "/hold", workers: 0 });
    const late = await invoke(lonely.invokeUrl(0), lonely.fn.apiKey, 1);
    assert.equal(late.status, 504);
    const lateId = late.headers.get("nvcf-reqid")!;
    await late.text();
    const failed = await waitFor("the lookup to say failed", async () => {
      const l = await reports.lookup(lateId);
      return l?.state === "failed" ? l : undefined;
    });
    assert.equal(failed.status, 504);
    assert.equal(failed.code, "INVOCATION_TIMEOUT");
    assert.match(failed.detail!, /no worker answered function/);
    const lonelyStats = ofReplica(
      await reports.snapshot({ functionId: lonely.fn.functionId }),
      h0,
    )!.functions;
    assert.deepEqual(
      lonelyStats.map((f) => [f.versionId, f.requests, f.errors]),
      [[lonely.fn.versionId, 1, 1]],
    );
    // a function's hour, asked with its id: only that function's versions, minute by minute
    const hour = ofReplica(
      await reports.snapshot({ functionId: lonely.fn.functionId, hour: true }),
      h0,
    )!.hour!;
    assert.deepEqual(
      hour.map((v) => [v.versionId, v.requests.length, v.requests.reduce((a, b) => a + b, 0)]),
      [[lonely.fn.versionId, 60, 1]],
    );
    assert.equal(
      hour[0].errors.reduce((a, b) => a + b, 0),
      1,
    );
    assert.equal(
      ofReplica(await reports.snapshot({ hour: true }), h0)!.hour,
      undefined,
      "only for one function",
    );

    // an id nobody minted here, then one whose replica is gone: no answer
    assert.equal(await reports.lookup(newRequestId(newHolderId())), undefined);
    assert.equal(await reports.lookup("not-a-request-id"), undefined);
    plane.replicas[1].service.destroy();
    await waitFor(
      "replica 1 to stop answering",
      async () => (await reports.lookup(respondingId)) === undefined || undefined,
    );
    assert.deepEqual(
      (await reports.snapshot()).map((r) => r.holder),
      [h0],
    );
  },
);

function violation(errors: string[], kind: "Publish" | "Subscription", subject: string) {
  const want = `Permissions Violation for ${kind} to "${subject}"`;
  return waitFor(`NATS to refuse: ${want}`, () => errors.some((e) => e.includes(want)) || undefined, {
    timeoutMs: 10_000,
  });
}

test(
  "a worker's NATS identity may not ask the replicas, nor answer for one; the API reads the registry but may not write it",
  LIMIT,
  async (t) => {
    const plane = await startPlane(t, { workers: 0, relay: { enabled: true } });
    const w = await connectWithNkey(
      t,
      plane.nats,
      readWorkerSeed(plane.nats.credentialsDir),
      INBOX.nkeyWorker("x"),
    );
    const holder = holderHex(plane.replicas[0].service.holderId);
    w.nc.publish(subjects.consoleInflight, "{}", { reply: `${INBOX.nkeyWorker("x")}.r` });
    await violation(w.errors, "Publish", subjects.consoleInflight);
    w.nc.publish(subjects.consoleRequest(holder), newRequestId(plane.replicas[0].service.holderId));
    await violation(w.errors, "Publish", subjects.consoleRequest(holder));
    w.nc.subscribe(subjects.consoleInflight);
    await violation(w.errors, "Subscription", subjects.consoleInflight);
    w.nc.subscribe(subjects.consoleRequestFilter);
    await violation(w.errors, "Subscription", subjects.consoleRequestFilter);

    // the API's grant: reading the registry is what the console needs; writing or removing it is not
    const api = await connectNats(plane.nats.access("api"), "api-console-test", silentLogger());
    t.after(() => api.close());
    const apiErrors: string[] = [];
    void (async () => {
      for await (const s of api.status()) if (s.type === "error") apiErrors.push(s.error.message);
    })();
    const reports = new ReplicaReports(api, silentLogger());
    assert.deepEqual(
      (await reports.registry()).map((e) => [e.kind, e.holder]),
      [["invocation", holder]],
    );
    for (const subject of [
      `$KV.${REGISTRY_BUCKET}.${holder}`,
      `$JS.API.STREAM.DELETE.KV_${REGISTRY_BUCKET}`,
      `$JS.API.STREAM.PURGE.KV_${REGISTRY_BUCKET}`,
      `$JS.API.STREAM.UPDATE.KV_${REGISTRY_BUCKET}`,
    ]) {
      api.publish(subject, "{}");
      await violation(apiErrors, "Publish", subject);
    }
    assert.deepEqual(
      (await reports.registry()).map((e) => e.holder),
      [holder],
      "the registry is untouched",
    );
  },
);

test(
  "with relay off every replica is in the registry (the console's wait ends when all have answered), and each request names the worker that has it",
  LIMIT,
  async (t) => {
    const inference = heldInference();
    // no relay (startPlane's default): only the registry's use by the relay is off
    const plane = await startPlane(t, {
      replicas: 2,
      inferenceUrl: "/hold",
      inferenceHandler: inference.handler,
      workerEnv: { INSTANCE_ID: "console-worker-0" },
    });
    const api = await connectNats(plane.nats.access("api"), "api-console-relay-off", silentLogger());
    t.after(() => api.close());
    const reports = new ReplicaReports(api, silentLogger());
    const [h0, h1] = plane.replicas.map((r) => holderHex(r.service.holderId));
    assert.deepEqual(
      (await reports.registry())
        .filter((e) => e.kind === "invocation")
        .map((e) => e.holder)
        .sort(),
      [h0, h1].sort(),
      "both replicas registered with relay off",
    );
    // a wait of 5 s ends as soon as both registered replicas answered (the pages wait 300 ms)
    const started = performance.now();
    const all = await reports.snapshot({ waitMs: 5000 });
    const took = performance.now() - started;
    assert.deepEqual(all.map((r) => r.holder).sort(), [h0, h1].sort());
    assert.ok(took < 2500, `the snapshot took ${Math.round(took)} ms of its 5000 ms wait`);

    // one request whose body fits in the work message: the worker runs it without calling back
    const small = invoke(`${plane.invokeUrl(0)}?length=1`, plane.fn.apiKey, 60);
    await waitFor("the small request at the inference server", () => inference.held() === 1 || undefined);
    // one whose body does not (past the 32 KiB inline part): the worker fetches the rest first
    const large = fetch(plane.invokeUrl(0), {
      method: "POST",
      headers: {
        authorization: `Bearer ${plane.fn.apiKey}`,
        "content-type": "application/json",
        "nvcf-poll-seconds": "60",
      },
      body: JSON.stringify({ pad: "x".repeat(64 * 1024) }),
    });
    await waitFor("the large request at the inference server", () => inference.held() === 2 || undefined);
    const rows = ofHolder(await reports.snapshot(), h0).requests;
    assert.equal(rows.length, 2, JSON.stringify(rows));
    const [smallRow, largeRow] = rows;
    assert.equal(smallRow.state, "queued", "no worker has called back for it");
    assert.equal(smallRow.worker, undefined);
    assert.equal(largeRow.state, "with-worker", "its worker fetched the rest of the body");
    assert.deepEqual(largeRow.worker, { instanceId: "console-worker-0", address: "127.0.0.1" });
    const looked = await reports.lookup(largeRow.requestId);
    assert.equal(looked?.state, "with-worker");
    assert.deepEqual(looked.worker, largeRow.worker);

    inference.release();
    assert.equal(await (await small).text(), "done");
    assert.equal(await (await large).text(), "done");
    // ended: the lookup still names the worker that answered; the small answer came over NATS,
    // where the worker's inbox names its instance (no address: it did not call back over HTTP)
    const answered = async (id: string) =>
      waitFor(`${id} answered`, async () => {
        const l = await reports.lookup(id);
        return l?.state === "answered" ? l : undefined;
      });
    assert.deepEqual((await answered(smallRow.requestId)).worker, { instanceId: "console-worker-0" });
    assert.equal((await answered(largeRow.requestId)).worker?.instanceId, "console-worker-0");
  },
);

function ofHolder(all: ReplicaReport[], holder: string): ReplicaReport {
  const r = all.find((x) => x.holder === holder);
  assert.ok(r, `replica ${holder} answered: ${JSON.stringify(all.map((x) => x.holder))}`);
  return r;
}
