// Invocations keep flowing while one node of a three-node JetStream cluster is SIGKILLed and then
// started again: real nats-server processes (test/testkit/nats-cluster.ts), work queues with three
// replicas, an invocation replica and two workers in this process (the testkit plane) in front of
// the example inference server. The node killed is the one that holds the invocation replica's
// connection and, moved there first, the leaders of the function's stream and consumer, so the kill
// takes a client connection and both JetStream leaders at once.
//
// Everything is counted, nothing is timed: the node is killed once a number of invocations have
// been answered, started again once a number more have been answered with it down, and the run ends
// with a batch after the cluster reports itself healthy again. Every invocation must end either
// answered (its own body back) or failed with a problem document (a code and a status), never hang
// (each has a window of its own, NVCF-POLL-SECONDS, after which the replica answers 504); the
// inference server must have seen each payload at most once, and each answered one exactly once;
// the stream and its consumer must end with nothing waiting, nothing unacknowledged.
import assert from "node:assert/strict";
import type { IncomingMessage, ServerResponse } from "node:http";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { jetstreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/transport-node";
import { handle as exampleHandler } from "../../examples/inference-server.js";
import { NATS_ACCOUNTS, subjects } from "../../src/lib/nats/index.js";
import { waitFor } from "../testkit/client.js";
import { startNatsCluster, type NatsCluster } from "../testkit/nats-cluster.js";
import { startPlane } from "../testkit/plane.js";
import { lifo } from "../testkit/proc.js";

const REGION = "test";
/** Each invocation's window: a request no worker took ends in 504 within it plus the 2 s grace. */
const POLL_SECONDS = 20;
const CLIENTS = 4;
const BEFORE_KILL = 30;
const WHILE_DOWN = 30;
const AFTER_RESTART = 30;
const WHEN_HEALTHY = 20;

/** Which server (by name) holds each APP connection, by connection name, as every server lists its own. */
async function whereConnected(sys: NatsConnection, servers: number): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const replies = await sys.requestMany(
    "$SYS.REQ.SERVER.PING.CONNZ",
    JSON.stringify({ acc: NATS_ACCOUNTS.app, limit: 1024 }),
    { strategy: "count", maxMessages: servers, maxWait: 5000 },
  );
  for await (const m of replies) {
    const r = m.json<{ server: { name: string }; data: { connections?: Array<{ name?: string }> } }>();
    for (const c of r.data.connections ?? []) if (c.name) out.set(c.name, r.server.name);
  }
  return out;
}

/** Moves a stream's (or a consumer's) leader to `node` by asking the leader to step down until it lands there. */
async function leadOn(
  obs: NatsConnection,
  node: string,
  what: { stream: string; consumer?: string },
): Promise<number> {
  const jsm = await jetstreamManager(obs);
  const leader = async () =>
    what.consumer
      ? (await jsm.consumers.info(what.stream, what.consumer)).cluster?.leader
      : (await jsm.streams.info(what.stream)).cluster?.leader;
  const subject = what.consumer
    ? `$JS.API.CONSUMER.LEADER.STEPDOWN.${what.stream}.${what.consumer}`
    : `$JS.API.STREAM.LEADER.STEPDOWN.${what.stream}`;
  for (let steps = 0; ; steps++) {
    const now = await waitFor(`a leader of ${what.consumer ?? what.stream}`, () => leader(), 30_000);
    if (now === node) return steps;
    // each step down elects one of the others; on three nodes, the one we want half the time
    assert.ok(steps < 20, `the leader of ${what.consumer ?? what.stream} never landed on ${node}`);
    await obs.request(subject, "", { timeout: 5000 });
    await waitFor(
      `a new leader of ${what.consumer ?? what.stream}`,
      async () => {
        const l = await leader().catch(() => undefined);
        return l !== undefined && l !== now;
      },
      30_000,
    );
  }
}

type Outcome =
  | { seq: number; phase: Phase; kind: "answered" }
  | { seq: number; phase: Phase; kind: "failed"; status: number; code: string; detail: string };
type Phase = "before" | "down" | "rejoining" | "healthy";

test("a node of the NATS cluster is killed and started again: every invocation is answered or fails clearly, none is lost; only one in flight at the kill may run twice", async (t) => {
  const ctx = lifo(t);
  const cluster: NatsCluster = await startNatsCluster(ctx, { region: REGION });
  // what reached the inference server, by the sequence number each client request carries
  const seen = new Map<number, number>();
  const counting = (req: IncomingMessage, res: ServerResponse) => {
    const seq = Number(req.headers["x-seq"]);
    if (Number.isInteger(seq)) seen.set(seq, (seen.get(seq) ?? 0) + 1);
    exampleHandler(req, res);
  };
  const plane = await startPlane(ctx, {
    nats: cluster,
    queue: { replicas: 3 },
    workers: 2,
    concurrency: 8,
    logs: true,
    inferenceHandler: counting,
    workerEnv: { CALLPLANE_KEEPALIVE_SECONDS: "2" },
  });
  const stream = subjects.stream(REGION, plane.fn.versionId);
  const consumer = subjects.consumer(REGION, plane.fn.versionId);
  const obs = await cluster.observe();
  const jsm = await jetstreamManager(obs);
  assert.equal((await jsm.streams.info(stream)).config.num_replicas, 3, "the work queue has 3 replicas");

  // the victim: the node that holds the invocation replica's connection; both leaders moved there
  const revoker = await cluster.revoker();
  const placed = await whereConnected(revoker, 3);
  const replicaConn = [...placed.keys()].find((n) => n.startsWith("invocation-"));
  assert.ok(replicaConn, `the replica's connection: ${JSON.stringify([...placed])}`);
  const victim = cluster.nodes.find((n) => n.name === placed.get(replicaConn))!;
  const steps =
    (await leadOn(obs, victim.name, { stream })) + (await leadOn(obs, victim.name, { stream, consumer }));
  t.diagnostic(
    `victim ${victim.name}: ${[...placed].map(([c, s]) => `${c}@${s}`).join(", ")}; leaders moved there in ${steps} step(s)`,
  );

  let phase: Phase = "before";
  const outcomes: Outcome[] = [];
  const answered = { before: 0, down: 0, rejoining: 0, healthy: 0 };
  let nextSeq = 0;
  let issueUntil = Infinity; // in the healthy phase: a fixed batch
  let wake: (() => void) | undefined;
  const changed = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const until = async (cond: () => boolean) => {
    while (!cond()) await new Promise<void>((r) => (wake = r));
  };
  // a gate per phase: clients go on issuing until the phase has its answers
  const quota: Record<Phase, number> = {
    before: BEFORE_KILL,
    down: WHILE_DOWN,
    rejoining: AFTER_RESTART,
    healthy: WHEN_HEALTHY,
  };
  let gate: Promise<void> = Promise.resolve();
  let openGate: (() => void) | undefined;
  const closeGate = () => {
    gate = new Promise<void>((r) => (openGate = r));
  };

  async function invoke(seq: number, at: Phase): Promise<Outcome> {
    const payload = `payload-${seq}`;
    const r = await fetch(plane.invokeUrl(), {
      method: "POST",
      headers: {
        authorization: `Bearer ${plane.fn.apiKey}`,
        "content-type": "text/plain",
        "nvcf-poll-seconds": String(POLL_SECONDS),
        "x-seq": String(seq),
      },
      body: payload,
    });
    const text = await r.text();
    if (r.status === 200) {
      assert.equal(text, payload, `invocation ${seq} answered with another body`);
      return { seq, phase: at, kind: "answered" };
    }
    // a failure must say what happened: a problem document with a code
    assert.match(r.headers.get("content-type") ?? "", /^application\/problem\+json/, `${r.status} ${text}`);
    const p = JSON.parse(text) as { code?: string; detail?: string; status?: number };
    assert.ok(p.code && p.detail && p.status === r.status, text);
    return { seq, phase: at, kind: "failed", status: r.status, code: p.code, detail: p.detail };
  }

  async function client(): Promise<void> {
    for (;;) {
      await gate;
      if (nextSeq >= issueUntil) return;
      const seq = nextSeq++;
      const at = phase;
      const o = await invoke(seq, at);
      outcomes.push(o);
      if (o.kind === "answered") answered[at]++;
      // a client that was refused waits a little before the next request, as "retry shortly" asks
      else await sleep(100);
      changed();
    }
  }

  const clients = Array.from({ length: CLIENTS }, () => client());
  await until(() => answered.before >= quota.before);
  // kill the node while requests are in flight, and let them keep coming
  // what was in flight at the kill: issued, not yet settled
  const settled = new Set(outcomes.map((o) => o.seq));
  const inFlightAtKill = new Set(Array.from({ length: nextSeq }, (_, i) => i).filter((i) => !settled.has(i)));
  await victim.kill("SIGKILL");
  phase = "down";
  t.diagnostic(`killed ${victim.name} after ${outcomes.length} invocations`);
  await until(() => answered.down >= quota.down);
  await victim.start();
  phase = "rejoining";
  await until(() => answered.rejoining >= quota.rejoining);
  // hold new requests until the cluster says it is whole again, then a last batch
  closeGate();
  const health = await cluster.waitHealthy(120_000);
  phase = "healthy";
  issueUntil = nextSeq + quota.healthy;
  openGate!();
  await Promise.all(clients);
  t.diagnostic(
    `cluster healthy again: leader ${health.metaLeader}; stream ${stream} led by ${health.streams.find((s) => s.name === stream)?.leader}`,
  );

  // every invocation ended, answered or refused with a problem document (checked in invoke)
  // sent = answered + failed; nothing unaccounted (a client whose request threw fails the test above)
  const unaccounted = nextSeq - outcomes.length;
  assert.equal(unaccounted, 0, `${unaccounted} of ${nextSeq} invocations have no outcome`);
  const failed = outcomes.filter((o): o is Extract<Outcome, { kind: "failed" }> => o.kind === "failed");
  const byCode = new Map<string, number>();
  for (const f of failed) byCode.set(`${f.status} ${f.code}`, (byCode.get(`${f.status} ${f.code}`) ?? 0) + 1);
  t.diagnostic(
    `${outcomes.length} invocations: ${outcomes.length - failed.length} answered ` +
      `(before ${answered.before}, down ${answered.down}, rejoining ${answered.rejoining}, healthy ${answered.healthy}); ` +
      `${failed.length} failed: ${[...byCode].map(([k, v]) => `${v} x ${k}`).join(", ") || "none"}`,
  );
  for (const f of failed.slice(0, 5))
    t.diagnostic(`failed ${f.seq} (${f.phase}): ${f.status} ${f.code}: ${f.detail}`);
  for (const f of failed)
    assert.ok(f.status >= 500, `a failure of the plane, not of the client: ${f.status} ${f.code}`);
  // the cluster whole again, nothing fails
  assert.deepEqual(
    failed.filter((f) => f.phase === "healthy").map((f) => `${f.seq}: ${f.code}`),
    [],
    "once the cluster is healthy again, every invocation is answered",
  );

  // the queue settles: every message taken is acknowledged (a worker's ack is confirmed after its
  // answer, so the last ones may still be on their way) and none is left. A message whose ack was
  // lost would instead be redelivered after the ack wait and run again: the count below sees it.
  await waitFor(
    "the work queue to be empty, every delivery acknowledged",
    async () => {
      const [st, co] = [await jsm.streams.info(stream), await jsm.consumers.info(stream, consumer)];
      return st.state.messages === 0 && co.num_ack_pending === 0 && co.num_pending === 0;
    },
    { timeoutMs: 60_000, intervalMs: 250 },
  ).catch(() => undefined); // what is left is reported by the assertions below

  // acks sent while the consumer's leader moved were sent again until confirmed (or the message
  // would have been redelivered after the ack wait and run twice)
  const acksRetried = ["worker-0", "worker-1"].map(
    (w) => plane.logs(w).filter((l) => l.msg === "ack confirmed").length,
  );
  t.diagnostic(`acks confirmed only after being sent again: ${acksRetried.join(" + ")}`);
  // The inference server saw each payload at most once, except one in flight at the kill: a
  // delivery the killed node handed out before it replicated that fact is handed out again by the
  // new leader (JetStream's window; seen once in CI). Its client still gets one answer (the
  // second worker's callback finds the single-use token used). Every other payload, once.
  const twice = [...seen].filter(([, n]) => n > 1);
  if (twice.length) t.diagnostic(`run twice (in flight at the kill): ${twice.map(([k]) => k).join(", ")}`);
  assert.deepEqual(
    twice.filter(([k, n]) => !inFlightAtKill.has(k) || n > 2),
    [],
    `payloads the inference server saw more than once, beyond those in flight at the kill (${[...inFlightAtKill].join(", ")})`,
  );
  for (const o of outcomes)
    if (o.kind === "answered")
      assert.ok(
        seen.get(o.seq) === 1 || (inFlightAtKill.has(o.seq) && seen.get(o.seq) === 2),
        `answered invocation ${o.seq} reached the server once (${seen.get(o.seq)})`,
      );
  const stray = [...seen.keys()].filter((s) => s >= nextSeq);
  assert.deepEqual(stray, []);

  // the queue: nothing left, nothing unacknowledged, every message delivered was acknowledged
  const s = await jsm.streams.info(stream);
  const c = await jsm.consumers.info(stream, consumer);
  t.diagnostic(
    `stream: ${s.state.messages} messages (first ${s.state.first_seq}, last ${s.state.last_seq}); ` +
      `consumer: delivered ${c.delivered.consumer_seq} (stream seq ${c.delivered.stream_seq}), ack floor ${c.ack_floor.consumer_seq}, ` +
      `ack pending ${c.num_ack_pending}, pending ${c.num_pending}, redelivered ${c.num_redelivered}`,
  );
  assert.equal(s.state.messages, 0, "no message is left in the work queue");
  assert.equal(c.num_pending, 0, "no message waits for a worker");
  assert.equal(c.num_ack_pending, 0, "no message is delivered and unacknowledged");
  assert.equal(c.ack_floor.consumer_seq, c.delivered.consumer_seq, "every delivery was acknowledged");
  // each request id was stored once: the stream holds one message per subject (request id), and
  // every payload the server saw came from a stored message
  assert.ok(seen.size <= s.state.last_seq, `${seen.size} payloads seen, ${s.state.last_seq} messages stored`);

  // the parts connected to the killed node noticed, and came back by themselves
  const reconnects = (name: string) => plane.logs(name).filter((l) => l.msg === "nats reconnect").length;
  t.diagnostic(
    `reconnects: replica ${reconnects("replica-0")}, workers ${reconnects("worker-0")}, ${reconnects("worker-1")}`,
  );
  assert.ok(reconnects("replica-0") >= 1, "the invocation replica lost its node and reconnected");
});
