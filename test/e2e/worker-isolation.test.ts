// A hostile worker on the stack's default configuration (nats.workerAuth left unset). The stack
// runs as a user runs it, with its demo functions; A is demo-stream and B demo-echo. The attacker
// holds exactly what the compute agent handed A's worker process (its environment, read from
// /proc, and the token file it names) and connects the way the worker does. NATS must refuse it
// B's queue, polls, cancels and everything else of B, each refusal asserted on the permission
// error the client gets, while B keeps serving and the same credential still serves A.
// In nkey mode (the default before issue 21) the shared key handed to every worker allowed (a) to
// (c): this file fails there.
// Addresses: services on 127.0.44.1, invocation replicas on 127.0.45.0/24, instances on
// 127.0.46.0/24, grpc-proxy replicas on 127.0.47.0/24 (no other test uses them).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import type { NatsConnection } from "@nats-io/transport-node";
import { silentLogger } from "../../src/lib/log.js";
import { connectNats, readWorkerSeed, subjects } from "../../src/lib/nats/index.js";
import { workerNatsAccess } from "../../src/services/worker/agent.js";
import { workerConfigFromEnv, type WorkerConfig } from "../../src/services/worker/config.js";
import { call, waitFor } from "../testkit/client.js";
import { tmpDir } from "../testkit/index.js";
import { lifo } from "../testkit/proc.js";
import {
  environOf,
  runStack,
  stackProcesses,
  waitStackReady,
  writeStackConfig,
  type StackJson,
} from "../testkit/stack.js";

/** The worker processes the stack's compute agent runs for a function, with their environments. */
function workersOf(dir: string, functionId: string): Array<{ pid: number; env: Record<string, string> }> {
  return stackProcesses(dir)
    .filter((p) => p.cmdline.includes(join("services", "worker", "main.js")))
    .map((p) => ({ pid: p.pid, env: environOf(p.pid) }))
    .filter((w) => w.env.FUNCTION_ID === functionId);
}

/** A NATS client and every error NATS reported on it (a permission violation arrives this way). */
interface Hostile {
  nc: NatsConnection;
  errors: string[];
}

async function violation(h: Hostile, kind: "Publish" | "Subscription", subject: string): Promise<string> {
  const want = `Permissions Violation for ${kind} to "${subject}"`;
  return await waitFor(`NATS to refuse: ${want}`, () => h.errors.find((e) => e.includes(want)), {
    timeoutMs: 10_000,
    onTimeout: () => `errors NATS reported: ${JSON.stringify(h.errors)}`,
  });
}

test("default stack: a worker's own credential reaches its function and nothing of another", async (t) => {
  const ctx = lifo(t);
  const dir = tmpDir(ctx, "callplane-isolation-");
  const cfg = await writeStackConfig(dir, {
    host: "127.0.44.1",
    podNetwork: "127.0.45.0/24",
    grpcNetwork: "127.0.47.0/24",
    instanceNetwork: "127.0.46.0/24",
  });
  const run = runStack(ctx, dir, cfg.file);
  const info: StackJson = await waitStackReady(run, cfg.dataDir);
  const a = { functionId: info.demo.sseFunctionId, versionId: info.demo.sseFunctionVersionId };
  const b = { functionId: info.demo.httpFunctionId, versionId: info.demo.httpFunctionVersionId };

  // A's worker process, and what the compute agent gave it: the attacker's whole kit
  const [workerA] = await waitFor("A's worker process", () => {
    const w = workersOf(dir, a.functionId);
    return w.length ? w : undefined;
  });
  const stolen: WorkerConfig = workerConfigFromEnv(workerA.env);
  const region = stolen.region;
  const bWorkers = workersOf(dir, b.functionId);
  assert.ok(bWorkers.length > 0, "B has a worker");
  const bInboxes = bWorkers.map((w) => workerNatsAccess(workerConfigFromEnv(w.env)).inboxPrefix);

  await t.test("the stack runs token mode by default, and the worker nkey reaches no process", () => {
    assert.doesNotMatch(readFileSync(cfg.file, "utf8"), /workerAuth/, "the test leaves the mode unset");
    assert.equal(info.workerAuth, "token");
    assert.equal(workerA.env.NKEY_SEED, undefined, "A's worker has no NKEY_SEED");
    assert.equal(workerA.env.NVCF_NATS_ACCOUNT, "APP");
    assert.ok(readFileSync(workerA.env.NVCF_TOKEN_FILE_PATH, "utf8").trim(), "A's worker has its token file");
    // the key exists (the callout checks nkey logins against it) but is in no process's environment
    const seed = readWorkerSeed(join(cfg.dataDir, "secrets", "nats"));
    const holders = stackProcesses(dir).filter((p) => {
      try {
        return readFileSync(`/proc/${p.pid}/environ`, "utf8").includes(seed);
      } catch {
        return false;
      }
    });
    assert.deepEqual(holders, [], "no process of the stack has the worker nkey seed in its environment");
  });

  // the attacker connects exactly as A's worker does: its URL, CA, credential and inbox prefix
  const nc = await connectNats(workerNatsAccess(stolen), "hostile-worker", silentLogger());
  ctx.after(() => nc.close().catch(() => undefined));
  const hostile: Hostile = { nc, errors: [] };
  void (async () => {
    for await (const s of nc.status())
      if (s.type === "error") hostile.errors.push((s as { error: Error }).error.message);
  })();
  const [streamA, consumerA] = [subjects.stream(region, a.versionId), subjects.consumer(region, a.versionId)];
  const [streamB, consumerB] = [subjects.stream(region, b.versionId), subjects.consumer(region, b.versionId)];

  await t.test("(a) it cannot pull a work message from B's queue, nor reach B's consumer", async () => {
    const next = `$JS.API.CONSUMER.MSG.NEXT.${streamB}.${consumerB}`;
    // the client sees its request refused, not a message nor an empty queue
    await assert.rejects(
      nc.request(next, JSON.stringify({ batch: 1, expires: 2_000_000_000 }), { timeout: 5000 }),
      (e: Error) => e.message.includes(`Permissions Violation for Publish to "${next}"`),
    );
    await violation(hostile, "Publish", next);
    for (const s of [
      `$JS.API.CONSUMER.INFO.${streamB}.${consumerB}`,
      `$JS.ACK.${streamB}.${consumerB}.1.1.1.1.0`,
    ]) {
      nc.publish(s, "");
      await violation(hostile, "Publish", s);
    }
  });

  await t.test("(b) it cannot subscribe to B's poll subjects", async () => {
    for (const s of [subjects.pollingFilter(b.versionId), subjects.polling(b.versionId, "0")]) {
      nc.subscribe(s);
      await violation(hostile, "Subscription", s);
    }
  });

  await t.test("(c) it cannot subscribe to B's cancels", async () => {
    nc.subscribe(subjects.cancel(b.versionId));
    await violation(hostile, "Subscription", subjects.cancel(b.versionId));
  });

  await t.test(
    "(d) it cannot subscribe to anything of B: work, reconnects, B's worker inbox, wildcards",
    async () => {
      const anythingOfB = [
        subjects.workFilter(region, b.versionId),
        subjects.reconnectFilter(b.versionId),
        ...bInboxes.map((p) => `${p}.>`),
        // every nkey worker's inbox, where the messages they pull arrive
        "_INBOX_WK.>",
        "rq_polling.*.*",
        "nvcf.cancel.*",
        "stateful_session.reconnect.*.*",
        // the replicas' answers: a worker may send one (with its token), never read any
        subjects.answerFilter,
        "rq.>",
        ">",
      ];
      for (const s of anythingOfB) nc.subscribe(s);
      for (const s of anythingOfB) await violation(hostile, "Subscription", s);
      t.diagnostic(`NATS refused ${hostile.errors.length} attempts, for example: ${hostile.errors[0]}`);
    },
  );

  await t.test("(e) an answer it sends a replica without the request's token is refused", async () => {
    const res = await fetch(`${info.invocation[0]}/v2/nvcf/pexec/functions/${b.functionId}`, {
      method: "POST",
      headers: { authorization: `Bearer ${info.demo.apiKey}`, "content-type": "application/json" },
      body: "{}",
    });
    await res.text();
    // the request id begins with its replica's holder id: the subject of that replica's answers
    const holder = (res.headers.get("nvcf-reqid") ?? "").slice(0, 8);
    assert.match(holder, /^[0-9a-f]{8}$/);
    const reply = await nc.request(
      subjects.answer(holder),
      `${holder}.forged\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi`,
      { timeout: 5000 },
    );
    const problem = reply.json<{ status: number; code: string }>();
    assert.deepEqual([problem.status, problem.code], [401, "ATTACH_TOKEN_INVALID"]);
  });

  await t.test("B's invocation still succeeds, and A's credential serves A", async () => {
    const payload = { to: "B", after: "the hostile worker" };
    const rb = await call(`${info.invocation[0]}/v2/nvcf/pexec/functions/${b.functionId}`, {
      token: info.demo.apiKey,
      body: payload,
    });
    assert.equal(rb.status, 200, rb.text);
    assert.deepEqual(rb.body, payload);

    // the stolen credential is a good one, for A: A's consumer, cancels and polls
    const own = [subjects.cancel(a.versionId), subjects.pollingFilter(a.versionId)];
    for (const s of own) nc.subscribe(s);
    const consumer = await nc.request(`$JS.API.CONSUMER.INFO.${streamA}.${consumerA}`, "", { timeout: 5000 });
    assert.equal(consumer.json<{ name: string }>().name, consumerA);
    await nc.flush();
    for (const s of own)
      assert.ok(!hostile.errors.some((e) => e.includes(`"${s}"`)), `NATS refused A's own ${s}`);
    // and A's worker, holding the same credential, serves A
    const ra = await call(
      `${info.invocation[1]}/v2/nvcf/pexec/functions/${a.functionId}?events=3&intervalMs=0`,
      {
        token: info.demo.apiKey,
        body: {},
        headers: { accept: "text/event-stream" },
      },
    );
    assert.equal(ra.status, 200, ra.text);
    assert.deepEqual(
      [...ra.text.matchAll(/^id: (\d+)$/gm)].map((m) => m[1]),
      ["0", "1", "2"],
      ra.text,
    );
  });
});
