// Regression guards for the data path: large bodies through the callback proxy and through the
// replica relay with a reader slower than the writer on each side, the shape that once collapsed
// (the proxy kept reading the pod while its worker-side socket was full: a 256 MiB chunked echo
// ran at 3 MB/s while the proxy held 300 MiB). Each test counts bytes, not seconds: the bytes held
// between the writer and the slow reader, and the proxy's or replica's resident memory, must stay
// under bounds far below the body size, and every byte must arrive intact.
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { Readable } from "node:stream";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { request } from "undici";
import { createSecureContext } from "node:tls";
import { podAwareLookup } from "../../../src/lib/net/index.js";
import { CallbackClient } from "../../../src/services/worker/callback.js";
import { startApi, startNats, tmpDir } from "../../testkit/index.js";
import { deployFunction, workerEnv } from "../../testkit/plane.js";
import {
  reverseScope,
  sampleRss,
  scripts,
  startExampleProcess,
  startService,
  type RssPeak,
} from "../../testkit/processes.js";
import { testPki } from "../../testkit/tls.js";

const MiB = 1024 * 1024;
/** The body each test streams: far above every bound below. */
const TOTAL = 192 * MiB;
/**
 * Resident-memory growth allowed for a process that relays TOTAL bytes: half the body. V8 collects
 * spent Buffers only once their external memory passes about 64 MiB, so a process streaming with a
 * few chunks live grows that far (33-66 MiB measured here); one that held its backlog grew by
 * hundreds of MiB. The bytes-in-flight bound below is the sharper guard.
 */
const RSS_BOUND = 96 * MiB;
/**
 * Bytes allowed between the writer and the slow reader: the proxy's own pause budget (256 KiB) and
 * socket buffers, plus what the kernel buffers on two loopback connections (receive buffers grow to
 * tens of MiB under autotuning). Before the fix the proxy alone held 300 MiB of backlog.
 */
const IN_FLIGHT_BOUND = 80 * MiB;
const POD = "127-0-0-1.invocation.nvcf.svc.cluster.local";

/** A pattern whose byte i is i % 251 (a length prime to every chunk size), checked as it arrives. */
const PATTERN = Buffer.alloc(64 * 1024);
for (let i = 0; i < PATTERN.length; i++) PATTERN[i] = i % 251;

/**
 * TOTAL bytes of the pattern in chunks of about `chunkBytes`. Small chunks are the hard case: a
 * replica forwards a client's body in the chunks the client sent (curl streaming from a pipe sends
 * a few KiB at a time), and each becomes one HTTP chunk downstream.
 */
function patternStream(
  total: number,
  onChunk: (n: number, chunk: Buffer) => void,
  chunkBytes = PATTERN.length,
): Readable {
  let sent = 0;
  return new Readable({
    highWaterMark: 256 * 1024,
    read() {
      while (sent < total) {
        // a chunk that does not start at a multiple of the pattern length keeps the check honest
        const off = sent % 251;
        const n = Math.min(chunkBytes, PATTERN.length - off, total - sent);
        sent += n;
        const chunk = PATTERN.subarray(off, off + n);
        onChunk(n, chunk);
        if (!this.push(chunk)) return;
      }
      this.push(null);
    },
  });
}

/** Reads a body slowly (a pause of `pauseMs` after each MiB), checking the pattern and counting bytes. */
async function readSlowly(
  body: AsyncIterable<Buffer>,
  pauseMs: number,
  onBytes: (n: number) => void,
): Promise<{ bytes: number; mismatchAt: number | undefined }> {
  let bytes = 0;
  let sinceLast = 0;
  let mismatchAt: number | undefined;
  for await (const c of body) {
    for (let i = 0; i < c.length && mismatchAt === undefined; i += 4093) {
      if (c[i] !== (bytes + i) % 251) mismatchAt = bytes + i;
    }
    bytes += c.length;
    sinceLast += c.length;
    onBytes(c.length);
    if (sinceLast >= MiB) {
      sinceLast = 0;
      await sleep(pauseMs);
    }
  }
  return { bytes, mismatchAt };
}

/** Tracks the largest gap between bytes written and bytes read. */
function gap(): { wrote(n: number): void; read(n: number): void; readonly max: number } {
  let written = 0;
  let read = 0;
  let max = 0;
  return {
    wrote(n) {
      written += n;
      max = Math.max(max, written - read);
    },
    read(n) {
      read += n;
    },
    get max() {
      return max;
    },
  };
}

const mib = (n: number) => `${(n / MiB).toFixed(1)} MiB`;

function report(t: { diagnostic(m: string): void }, peaks: Record<string, RssPeak>): void {
  for (const [name, p] of Object.entries(peaks))
    t.diagnostic(
      `${name}: RSS ${mib(p.baseline)} -> peak ${mib(p.peak)} (+${mib(p.growth)}, ${p.samples} samples)`,
    );
}

test("a large chunked body streams both ways through the callback proxy with a slow reader on each side, in bounded memory", async (t) => {
  const scope = reverseScope(t);
  const dir = tmpDir(scope, "callplane-datapath-");
  const pki = await testPki();
  const podCert = await pki.issue([POD]);
  const front = await pki.issue(["*.worker.callplane.test", "worker.callplane.test"]);
  const pkiDir = join(dir, "pki");
  mkdirSync(join(pkiDir, "proxy"), { recursive: true });
  writeFileSync(join(pkiDir, "ca.crt"), pki.ca.certPem);
  writeFileSync(join(pkiDir, "proxy", "tls.crt"), front.certPem);
  writeFileSync(join(pkiDir, "proxy", "tls.key"), front.keyPem, { mode: 0o600 });

  // The pod: GET streams TOTAL bytes chunked (no Content-Length), as a replica streams a client's
  // body; POST reads slowly, as a replica whose client reads slowly does.
  const down = gap();
  const up = gap();
  let podGot: { bytes: number; mismatchAt: number | undefined } | undefined;
  const pod = createHttpsServer({ cert: podCert.certPem, key: podCert.keyPem }, (req, res) => {
    if (req.method === "GET") {
      res.writeHead(200, { "content-type": "application/octet-stream" });
      patternStream(TOTAL, (n) => down.wrote(n), 8 * 1024).pipe(res);
      return;
    }
    readSlowly(req, 8, (n) => up.read(n)).then(
      (r) => {
        podGot = r;
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(r));
      },
      () => res.destroy(),
    );
  });
  await new Promise<void>((r) => pod.listen(0, "127.0.0.1", r));
  scope.after(() => {
    pod.closeAllConnections();
    pod.close();
  });
  const podPort = (pod.address() as AddressInfo).port;

  const proxy = await startService(scope, "callback-proxy", scripts.callbackProxy, {
    CALLPLANE__GLOBAL__DATA_DIR: dir,
    CALLPLANE__PKI__DIR: pkiDir,
    CALLPLANE__LOG__LEVEL: "warn",
    CALLPLANE__WORKER_CALLBACK_PROXY__LISTEN: "127.0.0.1:0",
    CALLPLANE__WORKER_CALLBACK_PROXY__METRICS_LISTEN: "127.0.0.1:0",
    CALLPLANE__WORKER_CALLBACK_PROXY__POD_NETWORKS: '["127.0.0.0/24"]',
    CALLPLANE__WORKER_CALLBACK_PROXY__INVOCATION__WORKER_TLS_PORT: String(podPort),
  });
  const proxyPort = new URL(proxy.urls.proxy).port;
  // the worker's own client: forward-proxy requests inside TLS to the proxy, verified with the CA
  const client = new CallbackClient({
    lookup: podAwareLookup(
      new Map([["invocation.worker.callplane.test", "127.0.0.1"]]),
      "nvcf.svc.cluster.local",
    ),
    secureContext: createSecureContext({ ca: pki.ca.certPem }),
  });
  scope.after(() => client.close());
  const target = {
    targetUri: `http://${POD}:${podPort}`,
    token: "t",
    proxyUri: `https://invocation.worker.callplane.test:${proxyPort}`,
  };

  // warm up (TLS sessions, JIT), then measure from a baseline
  const warm = await client.postResponse(target, Buffer.from("warm"), 4, AbortSignal.timeout(10_000));
  await warm.body.text();

  // down: pod → proxy → a worker that reads slowly
  let rss = sampleRss({ proxy: proxy.pid });
  const res = await client.fetchBody(target, AbortSignal.timeout(120_000));
  assert.equal(res.statusCode, 200);
  const got = await readSlowly(res.body as AsyncIterable<Buffer>, 8, (n) => down.read(n));
  const downPeaks = rss.stop();
  report(t, downPeaks);
  t.diagnostic(`down: at most ${mib(down.max)} between the pod's writes and the worker's reads`);
  assert.equal(got.bytes, TOTAL);
  assert.equal(got.mismatchAt, undefined, `the body differs near byte ${got.mismatchAt}`);
  assert.ok(
    down.max < IN_FLIGHT_BOUND,
    `down: ${mib(down.max)} held in flight (bound ${mib(IN_FLIGHT_BOUND)})`,
  );
  assert.ok(
    downPeaks.proxy.growth < RSS_BOUND,
    `down: the proxy grew by ${mib(downPeaks.proxy.growth)} (bound ${mib(RSS_BOUND)})`,
  );

  // up: a worker that writes fast → proxy → a pod that reads slowly (no Content-Length: chunked)
  rss = sampleRss({ proxy: proxy.pid });
  const posted = await client.postResponse(
    target,
    patternStream(TOTAL, (n) => up.wrote(n), 8 * 1024),
    undefined,
    AbortSignal.timeout(120_000),
  );
  const answer = (await posted.body.json()) as { bytes: number };
  const upPeaks = rss.stop();
  report(t, upPeaks);
  t.diagnostic(`up: at most ${mib(up.max)} between the worker's writes and the pod's reads`);
  assert.equal(posted.statusCode, 200);
  assert.equal(answer.bytes, TOTAL);
  assert.equal(podGot?.mismatchAt, undefined, `the upload differs near byte ${podGot?.mismatchAt}`);
  assert.ok(up.max < IN_FLIGHT_BOUND, `up: ${mib(up.max)} held in flight (bound ${mib(IN_FLIGHT_BOUND)})`);
  assert.ok(
    upPeaks.proxy.growth < RSS_BOUND,
    `up: the proxy grew by ${mib(upPeaks.proxy.growth)} (bound ${mib(RSS_BOUND)})`,
  );
});

test("a large chunked body streams both ways through the replica relay with slow readers, in bounded memory", async (t) => {
  const scope = reverseScope(t);
  const dir = tmpDir(scope, "callplane-datapath-relay-");
  const nats = await startNats(scope, { region: "test" });
  // the API creates the work queue (workers and replicas may not)
  const api = await startApi(scope, { nats, region: "test" });
  const fn = await deployFunction(api, `relay-${Math.random().toString(36).slice(2, 8)}`, {
    inferenceUrl: "/echo",
    concurrency: 4,
  });
  const inference = await startExampleProcess(scope);
  const common = {
    CALLPLANE__GLOBAL__DATA_DIR: dir,
    CALLPLANE__GLOBAL__REGION: "test",
    CALLPLANE__LOG__LEVEL: "warn",
    ...nats.serviceEnv(),
    CALLPLANE__API__URL: api.url,
    CALLPLANE__AUTH__SERVICE_TOKEN_DIR: api.serviceTokenDir,
    CALLPLANE__INVOCATION__PORT: "0",
    CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "false",
  };
  // The relayer receives every callback; the holder's workers are told to call back at the
  // relayer's address (a shared callback URL), so each callback crosses the relay both ways.
  const relayer = await startService(scope, "relayer", scripts.invocation, {
    ...common,
    POD_IP: "127.0.0.1",
    // read below: the relay's counters
    CALLPLANE__INVOCATION__METRICS_ON_CLIENT_PORT: "true",
  });
  const holder = await startService(scope, "holder", scripts.invocation, {
    ...common,
    POD_IP: "127.0.0.1",
    CALLPLANE__INVOCATION__SELF_ADDRESS: relayer.urls.invocation,
  });
  const worker = await startService(
    scope,
    "worker",
    scripts.worker,
    workerEnv({ nats, fn, inference }, join(dir, "responses"), {
      NVCF_REGION: "test",
      MAX_REQUEST_CONCURRENCY: "4",
      CALLPLANE_LOG_LEVEL: "warn",
    }),
  );
  const url = `${holder.urls.invocation}/v2/nvcf/pexec/functions/${fn.functionId}`;
  const headers = {
    authorization: `Bearer ${fn.apiKey}`,
    "content-type": "application/octet-stream",
    "nvcf-poll-seconds": "300",
  };
  const warm = await request(url, { method: "POST", headers, body: "warm" });
  assert.equal(await warm.body.text(), "warm");

  // the client writes fast; the inference server reads slowly (so the relayed GET request-attach
  // answer meets a slow worker); the client reads the echo slowly (so the relayed POST meets a
  // slow holder)
  const rss = sampleRss({ relayer: relayer.pid, holder: holder.pid, worker: worker.pid });
  const chain = gap();
  const res = await request(`${url}?readPauseMs=8`, {
    method: "POST",
    headers,
    body: patternStream(TOTAL, (n) => chain.wrote(n), 8 * 1024),
  });
  assert.equal(res.statusCode, 200);
  const got = await readSlowly(res.body as AsyncIterable<Buffer>, 8, (n) => chain.read(n));
  const peaks = rss.stop();
  report(t, peaks);
  t.diagnostic(`at most ${mib(chain.max)} between the client's writes and its reads of the echo`);
  // six connections lie between the client's writes and its reads, each with kernel buffers
  assert.ok(chain.max < 2 * IN_FLIGHT_BOUND, `${mib(chain.max)} held in flight along the chain`);
  assert.equal(got.bytes, TOTAL);
  assert.equal(got.mismatchAt, undefined, `the echo differs near byte ${got.mismatchAt}`);
  for (const name of ["relayer", "holder", "worker"])
    assert.ok(
      peaks[name].growth < RSS_BOUND,
      `${name} grew by ${mib(peaks[name].growth)} while ${mib(TOTAL)} passed each way (bound ${mib(RSS_BOUND)})`,
    );
  // the relay really carried both callbacks
  const metrics = await (await request(`${relayer.urls.invocation}/metrics`)).body.text();
  for (const kind of ["request", "response"])
    assert.match(
      metrics,
      new RegExp(`callplane_attach_requests_total\\{kind="${kind}",result="relayed"[^}]*\\} [1-9]`),
      `the relayer relayed the ${kind} callback`,
    );
});
