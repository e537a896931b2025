// Two networks, end to end (issue 4). The workers and their inference server live in a network
// namespace of their own whose only link reaches an address in the root namespace where NATS and the
// worker callback proxy listen; the three invocation replicas listen on loopback addresses of the
// root namespace (127.0.60.1-3), which the workers cannot reach. So every callback must go through
// the proxy, which forwards it to the replica that holds the request (the workers here post even
// their small answers, which callplane's workers otherwise send over NATS). NATS is the stack's: TLS, and
// every worker authenticates (issue 10): one with the shared worker nkey, two with identity tokens of
// their own through the auth callout (token mode), so both modes run end to end through the proxy.
//
// Thousands of invocations, spread over the three replicas, each with its own payload, each answer
// checked by content. A third of the way through, replica 2 is SIGKILLed: the requests it held fail
// at once (their clients lose the connection), the workers holding its requests get a clear 502 from
// the proxy within 2 s and acknowledge them, and every request on the other replicas completes. To
// make "the workers holding its requests" exact rather than a matter of timing, the inference server
// is frozen (SIGSTOP) around the kill until every request in flight is held by a worker, so every
// request replica 2 held at the kill must come back to the proxy as a callback and get its 502.
//
// Needs root, for the namespace; without it the test says so and skips.
import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import { createServer } from "node:net";
import { join } from "node:path";
import { test } from "node:test";
import { jetstreamManager, type ConsumerInfo, type StreamInfo } from "@nats-io/jetstream";
import { Agent, request } from "undici";
import { subjects } from "../../src/lib/nats/index.js";
import { waitFor } from "../testkit/client.js";
import { issueIdentity, startCallout } from "../testkit/trust.js";
import { writeFileAtomic } from "../../src/lib/fs.js";
import { netnsSupport, tcpConnectFrom } from "../testkit/netns.js";
import { deployFunction } from "../testkit/plane.js";
import { reverseScope, scripts, startService, type ChildHandle } from "../testkit/processes.js";
import { SERVICE_DOMAIN, WORKER_DOMAIN, startTwoNetworkPlane } from "../testkit/two-networks.js";

const REGION = "test";
/** Replica i listens on 127.0.60.i: root-namespace loopback, out of the workers' reach. */
const REPLICA_IPS = ["127.0.60.1", "127.0.60.2", "127.0.60.3"];
/** Index of the replica that is killed (replica 2). */
const KILLED = 1;
const INVOCATIONS = Number(process.env.CALLPLANE_TWO_NETWORKS_INVOCATIONS ?? 3000);
/** Client requests in flight at any time, over all replicas. */
const CLIENT_CONCURRENCY = 48;
const WORKERS = 3;
const WORKER_CONCURRENCY = 32;
/**
 * Each client request gives up after this long: a hang is a failure, not a wait. It is past the
 * replica's own limit (the 60 s poll window plus 2 s), so a request that went astray shows how it
 * ended (a 504, or a late answer after a redelivery) rather than only that it took too long.
 */
const CLIENT_TIMEOUT_MS = 70_000;
/** How soon after the kill the killed replica's clients must have failed, and workers got their 502. */
const PROMPT_MS = 2000;
const PROBE_PATH = "/isolation-probe";
/** node -e: one HTTPS request over TLS verified with the given CA; prints the status line. */
const TLS_PROBE = `
const [host, port, servername, ca] = process.argv.slice(1);
const s = require("node:tls").connect({ host, port: Number(port), servername, ca });
s.setTimeout(5000, () => { console.error("timeout"); process.exit(1); });
s.once("secureConnect", () => s.write("GET ${PROBE_PATH} HTTP/1.1\\r\\nHost: " + servername + "\\r\\nConnection: close\\r\\n\\r\\n"));
let text = "";
s.on("data", (d) => (text += d));
s.once("end", () => { console.log(text.split("\\r\\n")[0].slice(0, 12)); process.exit(0); });
s.once("error", (e) => { console.error(e.message); process.exit(1); });
`;
const CONNECTION_ERRORS = new Set(["ECONNRESET", "ECONNREFUSED", "UND_ERR_SOCKET", "EPIPE"]);

interface Outcome {
  n: number;
  replica: number;
  payload: string;
  started: number;
  ended: number;
  status?: number;
  body?: string;
  nvcfStatus?: string | undefined;
  requestId?: string | undefined;
  error?: { code: string; message: string };
}

const ok = (o: Outcome) => o.status === 200 && o.body === o.payload && o.nvcfStatus === "fulfilled";
const describe = (o: Outcome) =>
  `#${o.n} replica ${o.replica + 1} after ${Math.round(o.ended - o.started)} ms: ${
    o.error
      ? `${o.error.code} ${o.error.message}`
      : `${o.status} nvcf-status=${o.nvcfStatus} body ${o.body === o.payload ? "matches" : `differs: ${o.body?.slice(0, 200)}`}`
  }`;

function jsonLines(lines: string[]): Array<Record<string, unknown>> {
  const out: Array<Record<string, unknown>> = [];
  for (const l of lines) {
    try {
      out.push(JSON.parse(l) as Record<string, unknown>);
    } catch {
      // not a log line
    }
  }
  return out;
}

function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
}

test(
  "two networks: workers reach replicas only through the callback proxy; a replica SIGKILLed midway loses only its own requests",
  { timeout: 300_000 },
  async (t) => {
    const unsupported = netnsSupport();
    if (unsupported) {
      t.skip(`needs a network namespace: ${unsupported}`);
      return;
    }
    // torn down in reverse: workers, inference server, replicas, proxy, API, nats-server, namespace,
    // folder
    const scope = reverseScope(t);
    // the root namespace: nats-server and the proxy on the link's host address; the API, the
    // replicas on loopback. Token mode: worker 0 logs in with the shared worker nkey (as a worker
    // started before a switch would), workers 1 and 2 with identities of their own, checked by the
    // API through the callout
    const plane = await startTwoNetworkPlane(scope, {
      prefix: "callplane-two-networks-",
      region: REGION,
      replicaIps: REPLICA_IPS,
      upstreamTls: true,
      api: { workerAuth: "token" },
    });
    const { dir, ns, nats, api, ca, proxyPort } = plane;
    const workerTlsPort = plane.invocationTlsPort!;
    t.diagnostic(`namespace ${ns.name}: ${ns.hostIf} ${ns.hostIp} <-> ${ns.nsIf} ${ns.nsIp} (${ns.network})`);
    const callout = await startCallout(scope, nats, api, "token");
    const fn = await deployFunction(api, `two-networks-${randomBytes(4).toString("hex")}`, {
      inferenceUrl: "/echo",
      concurrency: WORKER_CONCURRENCY,
    });
    const serviceEnv = {
      ...plane.serviceEnv,
      CALLPLANE__INVOCATION__PORT: "0",
      CALLPLANE__WORKER_CALLBACK_PROXY__METRICS_LISTEN: "127.0.0.1:0",
    };

    const proxyLines: string[] = [];
    const proxy = await startService(
      scope,
      "callback-proxy",
      scripts.callbackProxy,
      { ...serviceEnv, CALLPLANE__LOG__LEVEL: "info" },
      { onLine: (l) => proxyLines.push(l), readyTimeoutMs: 30_000 },
    );
    const replicas: ChildHandle[] = [];
    for (const [i, ip] of REPLICA_IPS.entries()) {
      const r = await startService(
        scope,
        `invocation-${i + 1}`,
        scripts.invocation,
        { ...serviceEnv, POD_IP: ip, CALLPLANE__LOG__LEVEL: "warn" },
        { readyTimeoutMs: 30_000 },
      );
      const expected = `http://${ip.replaceAll(".", "-")}.invocation.${SERVICE_DOMAIN}:${workerTlsPort}`;
      assert.equal(r.urls.target, expected, `replica ${i + 1} hands workers its pod address`);
      replicas.push(r);
    }
    const clientOrigins = replicas.map((r) => {
      assert.ok(r.urls.invocation, `${r.name} reported its client URL`);
      return r.urls.invocation;
    });

    // --- isolation: from the workers' namespace, NATS and the proxy answer; no replica does ---
    await waitFor(
      "the link to come up",
      async () => ((await tcpConnectFrom(ns, ns.hostIp, nats.port)).ok ? true : undefined),
      { timeoutMs: 10_000, intervalMs: 200 },
    );
    // the proxy, over TLS with the stack CA, as a worker would: a path it does not forward gets 404
    const probe = await ns.exec([
      process.execPath,
      "-e",
      TLS_PROBE,
      ns.hostIp,
      String(proxyPort),
      `invocation.${WORKER_DOMAIN}`,
      ca.certPem,
    ]);
    assert.equal(
      probe.stdout.trim(),
      "HTTP/1.1 404",
      `the proxy answers from the namespace: ${probe.stderr}`,
    );
    // its access-log line for the probe; the run's lines come after it
    await waitFor("the probe's access-log line", () =>
      proxyLines.some((l) => l.includes(PROBE_PATH)) ? true : undefined,
    );
    const proxyLinesBefore = proxyLines.length;
    for (const [i, ip] of REPLICA_IPS.entries()) {
      for (const port of [Number(new URL(clientOrigins[i]).port), workerTlsPort]) {
        const fromRoot = await new Promise<boolean>((resolve) => {
          const s = createServer().listen(port, ip);
          s.once("error", () => resolve(true)); // in use: the replica listens there
          s.once("listening", () => s.close(() => resolve(false)));
        });
        assert.ok(fromRoot, `replica ${i + 1} listens on ${ip}:${port} in the root namespace`);
        const r = await tcpConnectFrom(ns, ip, port);
        assert.equal(r.ok, false, `replica ${i + 1} (${ip}:${port}) must not be reachable from the workers`);
      }
    }
    // nor the API (127.0.0.1 there is the namespace's own loopback)
    const apiPort = Number(new URL(api.url).port);
    assert.equal((await tcpConnectFrom(ns, "127.0.0.1", apiPort)).ok, false, "the API is out of reach");
    t.diagnostic(
      `isolation: from ${ns.name} NATS ${ns.hostIp}:${nats.port} and the proxy ${ns.hostIp}:${proxyPort} answer; replicas ${REPLICA_IPS.join(", ")} do not`,
    );

    // --- the workers' namespace: the example inference server and the worker agents ---
    const inference = await plane.startInference(8000);
    // the run freezes it for a moment (SIGSTOP); a stopped process must not outlive the test
    scope.after(() => {
      if (inference.running) process.kill(inference.pid, "SIGCONT");
    });
    const workerLines: string[][] = [];
    const workers: ChildHandle[] = [];
    for (let k = 0; k < WORKERS; k++) {
      const lines: string[] = [];
      workerLines.push(lines);
      let natsEnv: Record<string, string> = nats.workerNkeyEnv();
      if (k > 0) {
        const id = await issueIdentity(api, fn, randomUUID());
        const tokenFile = join(dir, `identity-${k}`, "token");
        writeFileAtomic(tokenFile, id.token);
        natsEnv = {
          NVCF_TOKEN_FILE_PATH: tokenFile,
          NVCF_NATS_ACCOUNT: "APP",
          NVCF_NATS_CA_PEM: nats.pki.ca.certPem,
          INSTANCE_ID: id.instanceId,
        };
      }
      workers.push(
        await startService(
          scope,
          `worker-${k}`,
          scripts.worker,
          plane.workerEnv({
            fn,
            key: String(k),
            instanceId: `two-networks-${k}`,
            name: "two-networks",
            // every answer posted through the proxy, which is what this test is about (small
            // answers over NATS are checked by the stack e2e and worker-isolation tests)
            natsEnv: { ...natsEnv, CALLPLANE_ANSWER_OVER_NATS: "false" },
            port: 8000,
            concurrency: WORKER_CONCURRENCY,
            hostMap: `invocation.${WORKER_DOMAIN}=${ns.hostIp}`,
            logLevel: "info",
          }),
          { prefix: ns.prefix, onLine: (l) => lines.push(l), readyTimeoutMs: 30_000 },
        ),
      );
    }
    const logins = callout
      .log()
      .filter((l) => l.msg === "Authentication successful")
      .map((l) => String(l.user));
    assert.equal(logins.filter((u) => u.startsWith("worker-nkey.")).length, 1, logins.join(", "));
    assert.equal(logins.filter((u) => u.startsWith(`worker-${fn.versionId}.`)).length, 2, logins.join(", "));
    const inside = await ns.pids();
    for (const w of [inference, ...workers])
      assert.ok(inside.includes(w.pid), `${w.name} (pid ${w.pid}) runs inside ${ns.name}`);

    // the test's own view of the work queue
    const nc = await nats.observe("two-networks-test");
    scope.after(() => nc.close());
    const jsm = await jetstreamManager(nc);
    const stream = subjects.stream(REGION, fn.versionId);
    const consumerName = subjects.consumer(REGION, fn.versionId);

    // --- load ---
    const agent = new Agent({ connections: CLIENT_CONCURRENCY, keepAliveTimeout: 10_000 });
    scope.after(() => agent.destroy());
    const invoke = async (n: number, replica: number): Promise<Outcome> => {
      const payload = JSON.stringify({ n, id: randomUUID(), replica, pad: "x".repeat(Math.abs(n) % 997) });
      const o: Outcome = { n, replica, payload, started: performance.now(), ended: 0 };
      try {
        const r = await request(`${clientOrigins[replica]}/v2/nvcf/pexec/functions/${fn.functionId}`, {
          method: "POST",
          dispatcher: agent,
          headers: { authorization: `Bearer ${fn.apiKey}`, "content-type": "application/json" },
          body: payload,
          headersTimeout: CLIENT_TIMEOUT_MS,
          bodyTimeout: CLIENT_TIMEOUT_MS,
          signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS),
        });
        o.status = r.statusCode;
        o.nvcfStatus = r.headers["nvcf-status"] as string | undefined;
        o.requestId = r.headers["nvcf-reqid"] as string | undefined;
        o.body = await r.body.text();
      } catch (err) {
        const e = err as NodeJS.ErrnoException;
        o.error = { code: e.code ?? e.name, message: e.message };
      }
      o.ended = performance.now();
      return o;
    };

    // one per replica first: a broken path fails here with the processes' output, not 3000 times
    for (let i = 0; i < REPLICA_IPS.length; i++) {
      const o = await invoke(-1 - i, i);
      if (!ok(o)) {
        assert.fail(
          `warm-up through replica ${i + 1} failed: ${describe(o)}\n--- proxy ---\n${proxy.output()}\n--- replica ---\n${replicas[i].output()}\n--- worker 0 ---\n${workers[0].output()}`,
        );
      }
    }

    const outcomes: Outcome[] = [];
    const inFlight = new Set<{ replica: number }>();
    let next = 0;
    let completed = 0;
    let killIssued = false;
    let killAt = 0;
    let thawedAt = 0;
    let frozeAt = 0;
    let frozenMs = 0;
    let inFlightOnKilledAtKill = 0;
    let chaos: Promise<void> | undefined;
    let chaosFailed = false;
    let afterKill = 0;
    const left = REPLICA_IPS.map((_, i) => i).filter((i) => i !== KILLED);
    // A third of the way through: freeze the inference server, so that every request in flight ends
    // up held by a worker (pulled, unacked, inference call open); SIGKILL replica 2; thaw. Every
    // request replica 2 held is then held by a worker too, which answers it through the proxy.
    const killMidway = async () => {
      frozeAt = performance.now();
      process.kill(inference.pid, "SIGSTOP");
      try {
        let last: ConsumerInfo | undefined;
        // The same requests in flight for a second as well: an answer the inference server sent
        // just before it froze is still on its way to its client (and its message unacked) for a
        // while, and a request counted as held at the kill would then be answered (seen in CI).
        let stable: { since: number; set: Set<{ replica: number }> } | undefined;
        await waitFor(
          "every request in flight to be held by a worker",
          async () => {
            last = await jsm.consumers.info(stream, consumerName);
            const held =
              inFlight.size === CLIENT_CONCURRENCY &&
              last.num_pending === 0 &&
              last.num_ack_pending === inFlight.size;
            const same =
              stable && stable.set.size === inFlight.size && [...inFlight].every((x) => stable!.set.has(x));
            if (!held || !same) {
              stable = held ? { since: performance.now(), set: new Set(inFlight) } : undefined;
              return undefined;
            }
            return performance.now() - stable!.since >= 1000 ? true : undefined;
          },
          { timeoutMs: 20_000, intervalMs: 50 },
        ).catch((err: Error) => {
          throw new Error(
            `${err.message}: ${inFlight.size} in flight, consumer ${JSON.stringify({ pending: last?.num_pending, ackPending: last?.num_ack_pending })}`,
          );
        });
        inFlightOnKilledAtKill = [...inFlight].filter((x) => x.replica === KILLED).length;
        killIssued = true;
        killAt = performance.now();
        const exit = await replicas[KILLED].kill("SIGKILL");
        assert.equal(exit.signal, "SIGKILL");
      } finally {
        process.kill(inference.pid, "SIGCONT");
        thawedAt = Date.now();
        frozenMs = performance.now() - frozeAt;
      }
    };
    const loadStarted = performance.now();
    const lane = async () => {
      for (;;) {
        const n = next++;
        if (n >= INVOCATIONS || chaosFailed) return;
        // before the kill, round robin over all three; after it, over the two that are left
        const replica = killIssued ? left[afterKill++ % left.length] : n % REPLICA_IPS.length;
        const mark = { replica };
        inFlight.add(mark);
        const o = await invoke(n, replica);
        inFlight.delete(mark);
        outcomes.push(o);
        completed++;
        if (!chaos && completed >= INVOCATIONS / 3) {
          chaos = killMidway();
          // the run stops early; the error is thrown below
          chaos.catch(() => (chaosFailed = true));
        }
      }
    };
    await Promise.all(Array.from({ length: CLIENT_CONCURRENCY }, lane));
    assert.ok(chaos, "replica 2 was killed midway");
    await chaos;
    assert.equal(outcomes.length, INVOCATIONS);
    const loadMs = performance.now() - loadStarted;

    // (c) after the kill, the killed replica refuses connections at once
    const probes: Outcome[] = [];
    for (let i = 0; i < 5; i++) probes.push(await invoke(INVOCATIONS + i, KILLED));
    for (const o of probes) {
      assert.equal(o.error?.code, "ECONNREFUSED", `a request to the killed replica: ${describe(o)}`);
      assert.ok(o.ended - o.started < 1000, `refused at once: ${describe(o)}`);
    }

    // the proxy's access log and the workers' logs
    const killedPod = `${REPLICA_IPS[KILLED].replaceAll(".", "-")}.invocation.${SERVICE_DOMAIN}`;
    const callbacksOf = () =>
      jsonLines(proxyLines.slice(proxyLinesBefore)).filter((l) => l.msg === "callback");
    const workerLogs = () => workerLines.flatMap((lines) => jsonLines(lines));
    const refusedByReplica = () =>
      workerLogs().filter((l) => l.msg === "the replica did not take the response");
    /** What the logs say went wrong, for failure messages. */
    const evidence = () => {
      const odd = callbacksOf().filter((l) => l.status !== 200);
      const warned = workerLogs().filter((l) => l.level !== "info");
      return [
        `proxy callbacks not answered 200 (${odd.length}):`,
        ...odd.slice(0, 10).map((l) => JSON.stringify(l)),
        `worker warnings and errors (${warned.length}):`,
        ...warned.slice(0, 10).map((l) => JSON.stringify(l)),
      ].join("\n");
    };
    // the workers acknowledge everything: the queue empties, nothing awaits an ack (asserted below)
    let consumer: ConsumerInfo | undefined;
    await waitFor(
      `consumer ${consumerName} to have nothing pending`,
      async () => {
        consumer = await jsm.consumers.info(stream, consumerName);
        return consumer.num_ack_pending === 0 && consumer.num_pending === 0 ? true : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 250 },
    ).catch((err: Error) => {
      throw new Error(`${err.message}; last: ${JSON.stringify(consumer)}\n${evidence()}`);
    });
    // a callback's access-log line and the worker's warning are written before the worker acks;
    // they may still be on their way through the pipes
    await waitFor(
      "a log line for every callback",
      () => {
        const callbacks = callbacksOf();
        const odd = callbacks.filter((l) => l.status !== 200).length;
        return callbacks.length >= consumer!.delivered.stream_seq && refusedByReplica().length >= odd
          ? true
          : undefined;
      },
      { timeoutMs: 10_000, intervalMs: 100 },
    ).catch(() => undefined); // the assertions below say what is missing

    // --- (a) every invocation on replicas 1 and 3 answered with its own payload ---
    assert.equal(new Set(outcomes.map((o) => o.n)).size, INVOCATIONS, "every invocation has one outcome");
    const survivors = outcomes.filter((o) => o.replica !== KILLED);
    const lost = survivors.filter((o) => !ok(o));
    if (lost.length > 0) {
      const consumerState = { redelivered: consumer!.num_redelivered, delivered: consumer!.delivered };
      assert.fail(
        [
          `${lost.length} of ${survivors.length} invocations on the surviving replicas did not complete:`,
          ...lost.slice(0, 10).map(describe),
          `consumer: ${JSON.stringify(consumerState)}`,
          evidence(),
        ].join("\n"),
      );
    }
    const ids = new Set(survivors.map((o) => o.requestId));
    assert.equal(ids.size, survivors.length, "every answer carries its own request id");

    // --- (b) on the killed replica: answered correctly before the kill, a prompt connection error
    // for what it held at the kill ---
    const onKilled = outcomes.filter((o) => o.replica === KILLED);
    const failed = onKilled.filter((o) => !ok(o));
    const bad = failed.filter(
      (o) =>
        !o.error ||
        !CONNECTION_ERRORS.has(o.error.code) ||
        o.started > killAt ||
        o.ended < killAt ||
        o.ended - killAt > PROMPT_MS,
    );
    assert.equal(
      bad.length,
      0,
      `requests on the killed replica that failed otherwise than by a prompt connection error (kill at ${Math.round(killAt - loadStarted)} ms):\n${bad
        .slice(0, 10)
        .map((o) => `${describe(o)} (ended ${Math.round(o.ended - killAt)} ms after the kill)`)
        .join("\n")}`,
    );
    assert.ok(inFlightOnKilledAtKill > 0, "the killed replica held requests when it was killed");
    assert.equal(
      failed.length,
      inFlightOnKilledAtKill,
      "every request the killed replica held failed, and no other request on it",
    );
    assert.ok(
      onKilled.filter((o) => o.started > killAt).length === 0,
      "nothing was sent to the killed replica after the kill",
    );
    const failLatency = failed.map((o) => o.ended - killAt);

    // --- (e) the workers acknowledged everything: the queue is empty, nothing awaits an ack ---
    const streamInfo: StreamInfo = await jsm.streams.info(stream);
    assert.equal(
      consumer!.num_redelivered,
      0,
      "no message had to be redelivered (every one was acked in time)",
    );
    assert.equal(streamInfo.state.messages, 0, "the work queue is empty");
    // every invocation that reached a replica's queue was delivered once: the warm-ups, every
    // answered one, and the killed replica's that were published before it died
    const answered = outcomes.filter(ok).length + REPLICA_IPS.length;
    assert.ok(
      consumer!.delivered.stream_seq >= answered &&
        consumer!.delivered.stream_seq <= answered + failed.length,
      `${consumer!.delivered.stream_seq} messages delivered for ${answered} answered and ${failed.length} failed invocations`,
    );

    // --- (d) the proxy's access log and the workers' logs ---
    const callbacks = callbacksOf();
    assert.equal(
      callbacks.length,
      consumer!.delivered.stream_seq,
      "the proxy logged one callback for each message a worker took",
    );
    const fromElsewhere = callbacks.filter((l) => !String(l.worker).startsWith(`${ns.nsIp}:`));
    assert.equal(fromElsewhere.length, 0, `callbacks came only from the workers' namespace (${ns.nsIp})`);
    for (const [i, ip] of REPLICA_IPS.entries()) {
      const pod = `${ip.replaceAll(".", "-")}.invocation.${SERVICE_DOMAIN}`;
      const forwarded = callbacks.filter((l) => l.target === pod && l.status === 200).length;
      assert.ok(forwarded > 0, `the proxy forwarded callbacks to replica ${i + 1}`);
    }
    const notOk = callbacks.filter((l) => l.status !== 200);
    const unexpected = notOk.filter((l) => l.target !== killedPod || l.status !== 502);
    assert.equal(
      unexpected.length,
      0,
      `only callbacks to the killed replica fail, with 502:\n${unexpected
        .slice(0, 10)
        .map((l) => JSON.stringify(l))
        .join("\n")}`,
    );
    const gone = notOk; // all of them 502s for the killed replica, as just checked
    assert.equal(
      gone.length,
      inFlightOnKilledAtKill,
      "each request the killed replica held was held by a worker, whose callback got a 502",
    );
    const slow = gone.filter((l) => typeof l.durationMs !== "number" || l.durationMs >= PROMPT_MS);
    assert.equal(
      slow.length,
      0,
      `a 502 took ${PROMPT_MS} ms or more:\n${slow.map((l) => JSON.stringify(l)).join("\n")}`,
    );
    const refused = refusedByReplica();
    assert.ok(
      refused.every((l) => l.status === 502 && String(l.target).includes(killedPod)),
      `workers were refused only by the killed replica, with 502:\n${refused
        .filter((l) => l.status !== 502 || !String(l.target).includes(killedPod))
        .slice(0, 10)
        .map((l) => JSON.stringify(l))
        .join("\n")}`,
    );
    assert.equal(refused.length, gone.length, "each 502 the proxy logged reached a worker");
    // from the moment the inference server went on: its answers, then the proxy's 502 (reported)
    const refusedAfterMs = refused.map((l) => Date.parse(String(l.time)) - thawedAt);
    const troubles = workerLogs().filter(
      (l) =>
        l.msg === "posting the response to the replica failed" ||
        l.msg === "work failed" ||
        l.msg === "inference call failed" ||
        l.level === "error" ||
        l.level === "fatal",
    );
    assert.equal(
      troubles.length,
      0,
      `workers logged trouble:\n${troubles
        .slice(0, 10)
        .map((l) => JSON.stringify(l))
        .join("\n")}`,
    );

    const latencies = survivors.map((o) => o.ended - o.started);
    const gone502 = gone.map((l) => l.durationMs as number);
    t.diagnostic(
      `${INVOCATIONS} invocations in ${(loadMs / 1000).toFixed(1)} s (${Math.round((INVOCATIONS / loadMs) * 1000)}/s, ${CLIENT_CONCURRENCY} in flight, ${WORKERS} workers x ${WORKER_CONCURRENCY}); replica 2 killed after ${Math.round(killAt - loadStarted)} ms, the inference server frozen for ${Math.round(frozenMs)} ms around the kill`,
    );
    t.diagnostic(
      `surviving replicas: ${survivors.length}/${survivors.length} answered by content (latency p50 ${percentile(latencies, 50).toFixed(0)} ms, p99 ${percentile(latencies, 99).toFixed(0)} ms, max ${Math.max(...latencies).toFixed(0)} ms)`,
    );
    t.diagnostic(
      `killed replica: ${onKilled.length - failed.length} answered before the kill, ${failed.length} failed with a connection error (${inFlightOnKilledAtKill} in flight at the kill; ${[...new Set(failed.map((o) => o.error!.code))].join(", ")}), within ${Math.max(...failLatency).toFixed(0)} ms of the kill; ${probes.length} later requests refused`,
    );
    t.diagnostic(
      `proxy: ${callbacks.length} callbacks, ${gone.length} answered 502 for the killed replica (durationMs max ${Math.max(...gone502)}, p50 ${percentile(gone502, 50)}); workers logged ${refused.length} 502s, at most ${Math.max(...refusedAfterMs)} ms after the thaw, and acked everything (delivered ${consumer!.delivered.stream_seq}, redelivered ${consumer!.num_redelivered}, ack pending ${consumer!.num_ack_pending})`,
    );
  },
);
