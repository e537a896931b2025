// End to end with real processes: the invocation service and worker agents run as child processes
// (node dist/.../main.js, configured by environment), beside a real nats-server, the API and the
// example inference server. What a user would see is asserted: status codes, bodies, bytes and
// hashes; and what an operator would: a killed worker loses no request, a large body does not grow
// a service's memory, SIGTERM drains.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { Readable } from "node:stream";
import { test } from "node:test";
import { Client, request } from "undici";
import { REQUEST_ID, waitFor } from "../testkit/client.js";
import { tmpDir } from "../testkit/index.js";
import { sampleRss, startProcessPlane, type ChildHandle, type RssPeak } from "../testkit/processes.js";

const MiB = 1024 * 1024;
const BIG = 100 * MiB;
/**
 * Peak RSS growth allowed for a service while 100 MiB pass through it: below the body size, so a
 * service that held the body would fail, but not as low as 64 MiB. V8 collects spent Buffers when
 * their external memory passes about 64 MiB, so RSS grows that far with only a few chunks live:
 * growth measured 5-60 MiB over repeated runs, and the same with a 400 MiB body.
 */
const RSS_BOUND = 80 * MiB;

async function getJson<T>(url: string): Promise<{ status: number; body: T }> {
  const r = await request(url);
  return { status: r.statusCode, body: (await r.body.json()) as T };
}

function mib(n: number): string {
  return `${(n / MiB).toFixed(1)} MiB`;
}

function reportRss(t: { diagnostic(msg: string): void }, peaks: Record<string, RssPeak>): void {
  for (const [name, p] of Object.entries(peaks))
    t.diagnostic(
      `${name}: RSS baseline ${mib(p.baseline)}, peak ${mib(p.peak)}, growth ${mib(p.growth)} (${p.samples} samples)`,
    );
}

function assertBounded(peaks: Record<string, RssPeak>, names: string[]): void {
  for (const name of names) {
    const p = peaks[name];
    assert.ok(p && p.samples >= 3, `${name}: too few RSS samples`);
    assert.ok(
      p.growth < RSS_BOUND,
      `${name}: RSS grew by ${mib(p.growth)} while 100 MiB passed through (bound ${mib(RSS_BOUND)})`,
    );
  }
}

/** One request on a fresh connection: a status, or "refused" when no connection could be made. */
async function attempt(
  origin: string,
  method: "GET" | "POST",
  path: string,
  opts: { headers?: Record<string, string>; body?: string } = {},
): Promise<{ outcome: string; text: string }> {
  const client = new Client(origin);
  try {
    const r = await client.request({ method, path, headers: opts.headers, body: opts.body });
    return { outcome: String(r.statusCode), text: await r.body.text() };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ECONNREFUSED") return { outcome: "refused", text: "" };
    return { outcome: `error ${code ?? ""}`, text: (err as Error).message };
  } finally {
    await client.close().catch(() => undefined);
  }
}

/** The worker (of several) whose readiness endpoint reports a busy slot. */
async function busyWorker(workers: ChildHandle[]): Promise<ChildHandle | undefined> {
  for (const w of workers) {
    const r = await getJson<{ busy: number }>(`${w.urls.health}/v1/health/ready`);
    if (r.body.busy > 0) return w;
  }
  return undefined;
}

test("a worker killed before it answers loses nothing: JetStream redelivers to another worker", async (t) => {
  const plane = await startProcessPlane(t, {
    inferenceUrl: "/once-hang",
    workers: 2,
    concurrency: 1,
    ackWaitSeconds: 2,
    workerEnv: { CALLPLANE_KEEPALIVE_SECONDS: "1" },
  });
  const key = randomUUID();
  const body = `hello redelivery ${key}`;
  const answer = request(plane.invokeUrl(`?key=${key}`), {
    method: "POST",
    headers: {
      authorization: `Bearer ${plane.fn.apiKey}`,
      "content-type": "text/plain",
      "nvcf-poll-seconds": "30",
    },
    body,
  });
  answer.catch(() => undefined);
  await waitFor(
    "the inference server to hold the first call",
    async () => {
      const s = await getJson<{ hanging: number }>(`${plane.inference.url}/stats`);
      return s.body.hanging === 1 ? true : undefined;
    },
    { timeoutMs: 10_000 },
  );
  const holder = await waitFor("a worker to report the busy slot", () => busyWorker(plane.workers), {
    timeoutMs: 10_000,
  });
  const other = plane.workers.find((w) => w !== holder)!;
  t.diagnostic(`${holder.name} holds the request; killing it`);
  // the in-progress acks (every 1 s) kept the message while the holder lived; now they stop
  const exit = await holder.kill("SIGKILL");
  assert.equal(exit.signal, "SIGKILL");

  const res = await answer;
  const text = await res.body.text();
  assert.equal(res.statusCode, 200, text);
  assert.equal(text, body);
  assert.equal(res.headers["nvcf-status"], "fulfilled");
  assert.match(String(res.headers["nvcf-reqid"]), REQUEST_ID);
  const stats = await getJson<{ hanging: number; abandoned: number }>(`${plane.inference.url}/stats`);
  assert.equal(stats.body.hanging, 0, "the killed worker's inference call was closed");
  assert.ok(stats.body.abandoned >= 1);
  assert.ok(other.running, "the other worker is still running");
});

test("a 100 MiB request body streams through both processes with bounded memory", async (t) => {
  const plane = await startProcessPlane(t, { inferenceUrl: "/digest" });
  const headers = { authorization: `Bearer ${plane.fn.apiKey}`, "content-type": "application/octet-stream" };
  // warm up: connections, the auth cache, JIT; the baseline is taken after this
  const warm = await request(plane.invokeUrl(), { method: "POST", headers, body: "warm" });
  assert.equal(warm.statusCode, 200, await warm.body.text());

  const hash = createHash("sha256");
  const block = randomBytes(64 * 1024);
  const source = Readable.from(
    (function* () {
      for (let i = 0; i < BIG / block.length; i++) {
        const chunk = Buffer.from(block);
        chunk.writeUInt32BE(i, 0);
        hash.update(chunk);
        yield chunk;
      }
    })(),
    { objectMode: false },
  );
  const rss = sampleRss({ invocation: plane.invocation.pid, worker: plane.workers[0].pid });
  let peaks: Record<string, RssPeak>;
  let res;
  try {
    res = await request(plane.invokeUrl(), {
      method: "POST",
      headers: { ...headers, "content-length": String(BIG), "nvcf-poll-seconds": "60" },
      body: source,
    });
  } finally {
    peaks = rss.stop();
  }
  const text = await res.body.text();
  reportRss(t, peaks);
  assert.equal(res.statusCode, 200, text);
  assert.deepEqual(JSON.parse(text), { bytes: BIG, sha256: hash.digest("hex") });
  assertBounded(peaks, ["invocation", "worker"]);
});

test("a 100 MiB response body streams to the client with bounded memory", async (t) => {
  const plane = await startProcessPlane(t, { inferenceUrl: "/large" });
  const headers = { authorization: `Bearer ${plane.fn.apiKey}` };
  const warm = await request(plane.invokeUrl("?bytes=1000000"), { method: "POST", headers });
  assert.equal(warm.statusCode, 200);
  await warm.body.dump({ limit: Infinity });

  // the example server repeats one 64 KiB block whose byte i is i % 251
  const pattern = Buffer.alloc(64 * 1024);
  for (let i = 0; i < pattern.length; i++) pattern[i] = i % 251;
  const rss = sampleRss({ invocation: plane.invocation.pid, worker: plane.workers[0].pid });
  let received = 0;
  let mismatch: number | undefined;
  let peaks: Record<string, RssPeak>;
  let status: number;
  let contentLength: unknown;
  try {
    const res = await request(plane.invokeUrl(`?bytes=${BIG}`), {
      method: "POST",
      headers: { ...headers, "nvcf-poll-seconds": "60" },
    });
    status = res.statusCode;
    contentLength = res.headers["content-length"];
    for await (const c of res.body as AsyncIterable<Buffer>) {
      let off = 0;
      while (off < c.length && mismatch === undefined) {
        const at = (received + off) % pattern.length;
        const n = Math.min(c.length - off, pattern.length - at);
        if (!c.subarray(off, off + n).equals(pattern.subarray(at, at + n))) mismatch = received + off;
        off += n;
      }
      received += c.length;
    }
  } finally {
    peaks = rss.stop();
  }
  reportRss(t, peaks);
  assert.equal(status, 200);
  assert.equal(contentLength, String(BIG));
  assert.equal(received, BIG);
  assert.equal(mismatch, undefined, `the body differs from the pattern near byte ${mismatch}`);
  assertBounded(peaks, ["invocation", "worker"]);
});

/** `curl -s -X POST --data-binary @file` to url: exit code, body and status. */
function curlPost(
  url: string,
  file: string,
  headers: string[],
): Promise<{ code: number | null; body: Buffer; status: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const args = ["-s", "-S", "-X", "POST", "--data-binary", `@${file}`, "-w", "\n%{http_code}"];
    for (const h of headers) args.push("-H", h);
    const curl = spawn("curl", [...args, url], { stdio: ["ignore", "pipe", "pipe"] });
    const chunks: Buffer[] = [];
    let stderr = "";
    curl.stdout.on("data", (d: Buffer) => chunks.push(d));
    curl.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    curl.once("error", reject);
    curl.once("close", (code) => {
      const out = Buffer.concat(chunks);
      const nl = out.lastIndexOf("\n");
      resolve({ code, body: out.subarray(0, nl), status: out.subarray(nl + 1).toString(), stderr });
    });
  });
}

test("curl, as an independent client, gets a 1 MiB file echoed byte for byte", async (t) => {
  const plane = await startProcessPlane(t, { inferenceUrl: "/echo" });
  const dir = tmpDir(t);
  // one byte over 1 MiB, curl also sends `Expect: 100-continue`, which must not reach the inference call
  for (const size of [MiB, MiB + 1]) {
    const file = join(dir, `body-${size}.bin`);
    const sent = randomBytes(size);
    writeFileSync(file, sent);
    const out = await curlPost(plane.invokeUrl(), file, [
      `Authorization: Bearer ${plane.fn.apiKey}`,
      "Content-Type: application/octet-stream",
    ]);
    assert.equal(out.code, 0, out.stderr);
    assert.equal(out.status, "200", `${size} bytes: ${out.body.subarray(0, 500).toString()}`);
    assert.equal(out.body.length, sent.length, `${size} bytes`);
    assert.ok(out.body.equals(sent), `${size} bytes: curl received different bytes`);
  }
});

test("SIGTERM on the invocation process finishes the request in flight, refuses new ones, exits 0", async (t) => {
  const plane = await startProcessPlane(t, {
    inferenceUrl: "/slow",
    invocationEnv: { CALLPLANE__INVOCATION__SHUTDOWN_GRACE_SECONDS: "8" },
  });
  const headers = { authorization: `Bearer ${plane.fn.apiKey}`, "content-type": "application/json" };
  // progressMs beyond the run time: no progress file, so the answer is a plain 200 (no 202 + poll)
  const inFlight = request(plane.invokeUrl("?seconds=2&progressMs=10000"), {
    method: "POST",
    headers: { ...headers, "nvcf-poll-seconds": "30" },
    body: "{}",
  });
  inFlight.catch(() => undefined);
  await waitFor("the worker to take the request", () => busyWorker(plane.workers), { timeoutMs: 10_000 });
  plane.invocation.child.kill("SIGTERM");

  // once the replica drains (its health check says so, or it takes no connections), a new
  // request is refused: 503, or no connection at all
  await waitFor(
    "the replica to start draining",
    async () => {
      const r = await attempt(plane.invocationUrl, "GET", "/health");
      return r.outcome === "200" ? undefined : true;
    },
    { timeoutMs: 5000 },
  );
  const late = await attempt(plane.invocationUrl, "POST", new URL(plane.invokeUrl("?seconds=0")).pathname, {
    headers,
    body: "{}",
  });
  t.diagnostic(`late request: ${late.outcome} ${late.text.slice(0, 200)}`);
  assert.ok(
    late.outcome === "503" || late.outcome === "refused",
    `late request: ${late.outcome} ${late.text}`,
  );

  const res = await inFlight.catch((err: unknown) => {
    throw new Error(
      `the request in flight failed: ${String(err)}\n--- worker ---\n${plane.workers[0].output()}\n--- invocation ---\n${plane.invocation.output()}`,
    );
  });
  const text = await res.body.text();
  assert.equal(res.statusCode, 200, text);
  assert.deepEqual(JSON.parse(text), { done: true, seconds: 2 });
  const exit = await plane.invocation.exited;
  assert.deepEqual(exit, { code: 0, signal: null }, plane.invocation.output());
});
