// Two networks, gRPC (issue 9): the workers and the example gRPC server live in a network namespace
// of their own whose only link reaches an address in the root namespace where NATS and the worker
// callback proxy listen; the two grpc-proxy replicas listen on loopback addresses of the root
// namespace (127.0.61.1-2), out of the workers' reach. So every worker tunnel goes through the
// proxy, routed by its server name (<dashed-ip>.worker.callplane.test) to the replica holding the
// session, over a TLS session of the proxy's own to the replica's worker TLS listener.
//
// Clients on both replicas (@grpc/grpc-js, several connections each) make unary calls with their
// own payloads and keep server streams open; midway replica 2 is SIGKILLed. Every call on
// replica 1 must be answered with its own payload; the calls replica 2 held must fail fast with
// UNAVAILABLE (not wait for a deadline), and later connections to it are refused. Python's grpcio
// then runs its whole scenario through the survivor.
//
// Needs root, for the namespace; without it the test says so and skips.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { test } from "node:test";
import { status, type ClientReadableStream } from "@grpc/grpc-js";
import type { EchoMessage } from "../../src/gen/callplane/examples/echo_pb.js";
import { waitFor } from "../testkit/client.js";
import { GRPC_FUNCTION, echoMessage, grpcClient, meta, runPython, unary } from "../testkit/grpc.js";
import { netnsSupport, tcpConnectFrom } from "../testkit/netns.js";
import { deployFunction } from "../testkit/plane.js";
import { reverseScope, scripts, startService, type ChildHandle } from "../testkit/processes.js";
import { WORKER_DOMAIN, startTwoNetworkPlane } from "../testkit/two-networks.js";

const REGION = "test";
const REPLICA_IPS = ["127.0.61.1", "127.0.61.2"];
const KILLED = 1;
const CONNECTIONS_PER_REPLICA = 4;
const CALLS_PER_CONNECTION = Number(process.env.CALLPLANE_TWO_NETWORKS_GRPC_CALLS ?? 60);
/** The killed replica's calls must end well before their deadline: a hang is not "failing fast". */
const CALL_DEADLINE_MS = 60_000;
const FAST_MS = 10_000;

interface CallOutcome {
  replica: number;
  ok: boolean;
  code: number | undefined;
  details: string | undefined;
  ended: number;
}

test(
  "two networks, gRPC: tunnels go through the callback proxy to the replica holding each session; a replica SIGKILLed midway fails only its own calls, fast, with UNAVAILABLE",
  { timeout: 300_000 },
  async (t) => {
    const unsupported = netnsSupport();
    if (unsupported) {
      t.skip(`needs a network namespace: ${unsupported}`);
      return;
    }
    const scope = reverseScope(t);
    // the API creates the work queue (workers and replicas may not)
    const plane = await startTwoNetworkPlane(scope, {
      prefix: "callplane-two-networks-grpc-",
      region: REGION,
      grpcReplicaIps: REPLICA_IPS,
      upstreamTls: false,
    });
    const { ns, nats, api, proxyPort } = plane;
    const workerTlsPort = plane.grpcTlsPort!;
    t.diagnostic(`namespace ${ns.name}: ${ns.hostIp} <-> ${ns.nsIp}`);
    const fn = await deployFunction(api, `two-networks-grpc-${randomBytes(4).toString("hex")}`, {
      ...GRPC_FUNCTION,
      concurrency: 16,
    });
    const serviceEnv = {
      ...plane.serviceEnv,
      CALLPLANE__WORKER_CALLBACK_PROXY__METRICS_LISTEN: "127.0.0.1:0",
      CALLPLANE__GRPCPROXY__PORT: "0",
      CALLPLANE__GRPCPROXY__CONNECT_PORT: "0",
    };
    const proxyLines: string[] = [];
    await startService(
      scope,
      "callback-proxy",
      scripts.callbackProxy,
      { ...serviceEnv, CALLPLANE__LOG__LEVEL: "info" },
      {
        onLine: (l) => proxyLines.push(l),
        readyTimeoutMs: 30_000,
      },
    );
    const replicas: ChildHandle[] = [];
    for (const [i, ip] of REPLICA_IPS.entries()) {
      const r = await startService(
        scope,
        `grpc-proxy-${i + 1}`,
        scripts.grpcProxy,
        { ...serviceEnv, POD_IP: ip, CALLPLANE__LOG__LEVEL: "info" },
        { readyTimeoutMs: 30_000 },
      );
      assert.equal(
        r.urls.connectUri,
        `https://${ip.replaceAll(".", "-")}.${WORKER_DOMAIN}:${proxyPort}/v1/proxy`,
        `replica ${i + 1} hands workers its name under the proxy`,
      );
      replicas.push(r);
    }
    const targets = replicas.map((r) => new URL(r.urls.grpc).host);

    // isolation: from the namespace NATS and the proxy answer, no replica does
    await waitFor(
      "the link to come up",
      async () => ((await tcpConnectFrom(ns, ns.hostIp, nats.port)).ok ? true : undefined),
      {
        timeoutMs: 10_000,
        intervalMs: 200,
      },
    );
    for (const [i, ip] of REPLICA_IPS.entries()) {
      for (const port of [
        Number(new URL(replicas[i].urls.grpc).port),
        Number(new URL(replicas[i].urls.connect).port),
        workerTlsPort,
      ]) {
        const r = await tcpConnectFrom(ns, ip, port);
        assert.equal(r.ok, false, `replica ${i + 1} (${ip}:${port}) must not be reachable from the workers`);
      }
    }

    // the workers' namespace: the example gRPC server and two worker agents
    await plane.startInference(8000, true);
    const workers: ChildHandle[] = [];
    for (let k = 0; k < 2; k++) {
      workers.push(
        await startService(
          scope,
          `worker-${k}`,
          scripts.worker,
          plane.workerEnv({
            fn,
            key: String(k),
            instanceId: `two-networks-grpc-${k}`,
            name: "two-networks-grpc",
            port: 8000,
            grpc: true,
            concurrency: 16,
            logLevel: "info",
            extra: { CALLPLANE_SESSION_RECONNECT_WAIT_SECONDS: "1" },
          }),
          { prefix: ns.prefix, readyTimeoutMs: 30_000 },
        ),
      );
    }
    const inside = await ns.pids();
    for (const w of workers) assert.ok(inside.includes(w.pid), `${w.name} runs inside ${ns.name}`);

    // --- load: connections on both replicas, unary calls with their own payloads ---
    const clients = REPLICA_IPS.map((_, r) =>
      Array.from({ length: CONNECTIONS_PER_REPLICA }, () => grpcClient(scope, targets[r])),
    );
    // one call per connection first: a broken path fails here with the processes' output
    for (const [r, cs] of clients.entries()) {
      for (const c of cs) {
        const w = await unary(c, echoMessage("warm-up"), meta(fn), {
          deadline: Date.now() + CALL_DEADLINE_MS,
        });
        assert.equal(
          w.err,
          null,
          `warm-up through replica ${r + 1}: ${w.err?.details}\n${replicas[r].output()}\n${workers[0].output()}`,
        );
      }
    }
    // a server stream held open on each replica across the kill
    const streams = REPLICA_IPS.map((_, r) => {
      const call = clients[r][0].ServerStream(echoMessage("tick", 40, 100), meta(fn), {
        deadline: Date.now() + CALL_DEADLINE_MS,
      }) as ClientReadableStream<EchoMessage>;
      return new Promise<{ messages: number; code: number; ended: number }>((resolve) => {
        let messages = 0;
        call.on("data", () => messages++);
        call.on("error", () => undefined);
        call.on("status", (s: { code: number }) =>
          resolve({ messages, code: s.code, ended: performance.now() }),
        );
      });
    });
    const outcomes: CallOutcome[] = [];
    let killAt = 0;
    let done = 0;
    const total = REPLICA_IPS.length * CONNECTIONS_PER_REPLICA * CALLS_PER_CONNECTION;
    let killed: Promise<void> | undefined;
    const lane = async (r: number, c: number) => {
      for (let i = 0; i < CALLS_PER_CONNECTION; i++) {
        if (r === KILLED && killAt) return;
        const payload = `${r}-${c}-${i}-${randomBytes(8).toString("hex")}`;
        const res = await unary(clients[r][c], echoMessage(payload), meta(fn), {
          deadline: Date.now() + CALL_DEADLINE_MS,
        });
        outcomes.push({
          replica: r,
          ok: res.err === null && Buffer.from(res.value?.payload ?? []).toString() === payload,
          code: res.err?.code,
          details: res.err?.details,
          ended: performance.now(),
        });
        if (++done === Math.floor(total / 3) && !killed) {
          killed = (async () => {
            killAt = performance.now();
            const exit = await replicas[KILLED].kill("SIGKILL");
            assert.equal(exit.signal, "SIGKILL");
          })();
        }
      }
    };
    await Promise.all(clients.flatMap((cs, r) => cs.map((_, c) => lane(r, c))));
    assert.ok(killed, "replica 2 was killed midway");
    await killed;
    const [survivorStream, killedStream] = [await streams[0], await streams[KILLED]];

    // every call on the survivor answered with its own payload
    const survivors = outcomes.filter((o) => o.replica !== KILLED);
    assert.equal(survivors.length, CONNECTIONS_PER_REPLICA * CALLS_PER_CONNECTION);
    const lost = survivors.filter((o) => !o.ok);
    assert.deepEqual(lost, [], "every call on the surviving replica was answered with its own payload");
    assert.equal(survivorStream.code, status.OK);
    assert.equal(survivorStream.messages, 40, "the survivor's stream ran to its end across the kill");
    // the killed replica's calls in flight: UNAVAILABLE, promptly
    const failedOnKilled = outcomes.filter((o) => o.replica === KILLED && !o.ok);
    for (const o of failedOnKilled) {
      assert.equal(o.code, status.UNAVAILABLE, `a call on the killed replica: ${o.details}`);
      assert.ok(
        o.ended - killAt < FAST_MS,
        `failed ${Math.round(o.ended - killAt)} ms after the kill, not at its deadline`,
      );
    }
    assert.equal(killedStream.code, status.UNAVAILABLE, "the stream on the killed replica ends UNAVAILABLE");
    assert.ok(killedStream.ended - killAt < FAST_MS, "and at once");
    const late = await unary(grpcClient(scope, targets[KILLED]), echoMessage("late"), meta(fn), {
      deadline: Date.now() + 10_000,
    });
    assert.equal(late.err?.code, status.UNAVAILABLE, "a new connection to the killed replica is refused");
    t.diagnostic(
      `survivor: ${survivors.length}/${survivors.length} calls answered by content; killed replica: ${outcomes.filter((o) => o.replica === KILLED && o.ok).length} answered before the kill, ${failedOnKilled.length} failed UNAVAILABLE within ${Math.round(Math.max(0, ...failedOnKilled.map((o) => o.ended - killAt)))} ms; its stream ended after ${killedStream.messages} messages`,
    );

    // the tunnels went through the proxy, routed by name
    const tunnels = proxyLines.filter((l) => l.includes('"outcome":"grpc_tunnel"')).length;
    const workerOut = workers.map((w) => w.output()).join("\n");
    assert.match(
      workerOut,
      new RegExp(
        `"target":"https://127-0-61-1\\.${WORKER_DOMAIN.replaceAll(".", "\\.")}:${proxyPort}/v1/proxy","msg":"tunnel open"`,
      ),
    );
    t.diagnostic(`proxy: ${tunnels} gRPC tunnels logged as ended so far`);

    // a client we did not write, through the survivor, after the kill
    const py = await runPython([targets[0], fn.apiKey, fn.functionId]);
    assert.equal(py.code, 0, py.stderr);
    const out = py.out as {
      unary: { payload: string };
      large: { sent: string; got: string };
      bidi: string[];
    };
    assert.equal(out.unary.payload, "py-unary");
    assert.equal(out.large.got, out.large.sent);
    assert.deepEqual(out.bidi, ["x", "y", "z"]);
  },
);
