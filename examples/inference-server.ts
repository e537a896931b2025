// The example inference server used by the demo, the tests and the benchmarks. One small HTTP
// server with a route per behaviour a function may have:
//   POST /echo            the request body back, byte for byte, streamed, with the same Content-Type
//                         (?readPauseMs=N: a slow reader, pausing N ms after each MiB it reads;
//                         ?fault=stall|reset|hang-once&key=k: as /stall, /reset, /once-hang, for a
//                         function whose inference URL is /echo)
//   GET|POST /sse         server-sent events (?events=5&intervalMs=200; intervalMs=0: as fast as the
//                         reader takes them; &bytes=N pads each event's data with N bytes)
//   POST /slow            answers after ?seconds=3, writing NVCF progress files meanwhile
//   GET|POST /large       ?bytes=N bytes of a repeating pattern, streamed (Content-Length set)
//   POST /digest          {bytes, sha256} of the request body (for large uploads)
//   ANY /status/{code}    that status, with {"error": "..."} for 4xx/5xx
//   ANY /headers          the request headers as JSON
//   ANY /secrets          the function's secrets as the server reads them now from $SECRETS_PATH
//                         (NVCF's secrets.json): their names and SHA-256 digests, never values;
//                         ?name=N adds that one secret's value; ?env=N says whether $N is set and
//                         its digest
//   ANY /hang             never answers; /stats counts how many such calls were abandoned
//   ANY /stall            answers its head and 1 KiB of body, then never sends more (a stalled server)
//   ANY /reset            answers its head and 64 KiB of body, then resets the connection
//   ANY /once-hang?key=k  the first call with a key never answers; later calls echo (redelivery tests)
//   GET /health, /v2/health/ready
// It listens on INFERENCE_HOST:INFERENCE_PORT (default 127.0.0.1:8000) or --listen host:port.
import { createHash } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { readFile, writeFile, rename } from "node:fs/promises";
import { join } from "node:path";
import { writeRepeated } from "../src/lib/http/index.js";

const stats = { requests: 0, abandoned: 0, hanging: 0 };
const seenKeys = new Set<string>();

function json(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

async function writeProgress(dir: string, id: string, progress: number, partial: unknown): Promise<void> {
  const tmp = join(dir, `.progress.${process.pid}.tmp`);
  await writeFile(tmp, JSON.stringify({ id, progress, partialResponse: partial }));
  await rename(tmp, join(dir, "progress"));
}

/**
 * Echoes like pipe(), but pauses reading for `ms` after each MiB: a reader slower than its writer.
 * Reading resumes once the pause is over and the response has drained.
 */
function echoSlowly(req: IncomingMessage, res: ServerResponse, ms: number): void {
  let sinceLast = 0;
  let waits = 0;
  const hold = () => {
    if (waits++ === 0) req.pause();
  };
  const release = () => {
    if (--waits === 0) req.resume();
  };
  req.on("data", (c: Buffer) => {
    if (!res.write(c)) {
      hold();
      res.once("drain", release);
    }
    sinceLast += c.length;
    if (sinceLast >= 1024 * 1024) {
      sinceLast = 0;
      hold();
      setTimeout(release, ms);
    }
  });
  req.once("end", () => res.end());
  res.once("close", () => req.destroy());
}

/** The first call with a key never answers (and counts as hanging); later calls echo. */
/** Never answers more; /stats counts it as hanging until the caller gives up. */
function hang(req: IncomingMessage, res: ServerResponse): void {
  stats.hanging++;
  req.resume();
  res.once("close", () => {
    stats.hanging--;
    stats.abandoned++;
  });
}

function onceHang(req: IncomingMessage, res: ServerResponse, key: string): void {
  if (!seenKeys.has(key)) {
    seenKeys.add(key);
    return hang(req, res);
  }
  res.writeHead(200, { "content-type": req.headers["content-type"] ?? "application/octet-stream" });
  req.pipe(res);
}

/** Answers its head and some body, then stalls for ever or resets the connection. */
function misbehave(how: "stall" | "reset", req: IncomingMessage, res: ServerResponse): void {
  req.resume();
  res.writeHead(200, { "content-type": "application/octet-stream" });
  res.write(Buffer.alloc(how === "stall" ? 1024 : 64 * 1024, "s"));
  if (how === "reset") setTimeout(() => res.socket?.resetAndDestroy(), 50);
  else {
    stats.hanging++;
    res.once("close", () => {
      stats.hanging--;
      stats.abandoned++;
    });
  }
}

export function handle(req: IncomingMessage, res: ServerResponse): void {
  stats.requests++;
  const url = new URL(req.url ?? "/", "http://inference");
  const path = url.pathname;
  if (path === "/health" || path === "/v2/health/ready" || path === "/v2/health/live")
    return json(res, 200, { status: "ok" });
  if (path === "/stats") return json(res, 200, stats);
  if (path === "/echo") {
    const fault = url.searchParams.get("fault");
    if (fault === "stall" || fault === "reset") return misbehave(fault, req, res);
    if (fault === "hang-once") return onceHang(req, res, url.searchParams.get("key") ?? "");
    const headers: Record<string, string> = {
      "content-type": req.headers["content-type"] ?? "application/octet-stream",
    };
    if (req.headers["content-length"] !== undefined)
      headers["content-length"] = req.headers["content-length"];
    res.writeHead(200, headers);
    const pause = Number(url.searchParams.get("readPauseMs") ?? 0);
    if (pause > 0) echoSlowly(req, res, pause);
    else req.pipe(res);
    return;
  }
  if (path === "/sse") {
    const events = Number(url.searchParams.get("events") ?? 5);
    const interval = Number(url.searchParams.get("intervalMs") ?? 200);
    const pad = "x".repeat(Math.max(0, Number(url.searchParams.get("bytes") ?? 0)));
    const event = (n: number) =>
      `id: ${n}\ndata: ${JSON.stringify(pad ? { i: n, at: Date.now(), pad } : { i: n, at: Date.now() })}\n\n`;
    req.resume();
    res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
    let i = 0;
    if (interval === 0) {
      // a producer faster than any reader: write until the socket's buffer is full, then wait for drain
      const burst = () => {
        while (i < events && !res.destroyed) {
          if (!res.write(event(i++))) {
            res.once("drain", burst);
            return;
          }
        }
        if (!res.destroyed) res.end("event: done\ndata: {}\n\n");
      };
      burst();
      return;
    }
    const tick = () => {
      if (res.destroyed) return;
      res.write(event(i));
      i++;
      if (i >= events) res.end("event: done\ndata: {}\n\n");
      else setTimeout(tick, interval);
    };
    tick();
    return;
  }
  if (path === "/slow") {
    const seconds = Number(url.searchParams.get("seconds") ?? 3);
    const dir = req.headers["nvcf-large-output-dir"];
    const id = String(req.headers["nvcf-reqid"] ?? "");
    req.resume();
    const started = Date.now();
    const step = Math.max(100, Number(url.searchParams.get("progressMs") ?? 1000));
    const timer = setInterval(() => {
      const pct = Math.min(99, Math.floor(((Date.now() - started) / (seconds * 1000)) * 100));
      if (typeof dir === "string") writeProgress(dir, id, pct, { progress: pct }).catch(() => undefined);
    }, step);
    const done = setTimeout(() => {
      clearInterval(timer);
      json(res, 200, { done: true, seconds });
    }, seconds * 1000);
    res.once("close", () => {
      clearInterval(timer);
      clearTimeout(done);
      if (!res.writableFinished) stats.abandoned++;
    });
    return;
  }
  if (path === "/large") {
    const total = Number(url.searchParams.get("bytes") ?? 1024 * 1024);
    req.resume();
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": total });
    const chunk = Buffer.alloc(64 * 1024);
    for (let i = 0; i < chunk.length; i++) chunk[i] = i % 251;
    writeRepeated(res, chunk, total);
    return;
  }
  if (path === "/digest") {
    const h = createHash("sha256");
    let bytes = 0;
    req.on("data", (c: Buffer) => {
      bytes += c.length;
      h.update(c);
    });
    req.on("end", () => json(res, 200, { bytes, sha256: h.digest("hex") }));
    return;
  }
  if (path.startsWith("/status/")) {
    const code = Number(path.slice("/status/".length));
    req.resume();
    if (!(code >= 200 && code <= 599)) return json(res, 400, { error: "status must be 200-599" });
    return json(
      res,
      code,
      code >= 400 ? { error: `the example server was asked to fail with ${code}` } : { status: code },
    );
  }
  if (path === "/secrets") {
    req.resume();
    const digest = (v: unknown) =>
      createHash("sha256")
        .update(typeof v === "string" ? v : JSON.stringify(v))
        .digest("hex");
    const file = process.env.SECRETS_PATH;
    if (!file)
      return json(res, 404, { error: "SECRETS_PATH is not set: this instance was given no secrets file" });
    // read on every request: the file is rewritten when a secret changes
    readFile(file, "utf8")
      .then((text) => {
        const secrets = JSON.parse(text) as Record<string, unknown>;
        const name = url.searchParams.get("name");
        const env = url.searchParams.get("env");
        json(res, 200, {
          path: file,
          names: Object.keys(secrets).sort(),
          sha256: Object.fromEntries(Object.entries(secrets).map(([k, v]) => [k, digest(v)])),
          ...(name !== null ? { name, value: secrets[name] ?? null } : {}),
          ...(env !== null
            ? {
                env: {
                  name: env,
                  set: process.env[env] !== undefined,
                  sha256: process.env[env] !== undefined ? digest(process.env[env]) : null,
                },
              }
            : {}),
        });
      })
      .catch((err: unknown) => json(res, 500, { error: `cannot read ${file}: ${(err as Error).message}` }));
    return;
  }
  if (path === "/headers") {
    req.resume();
    return json(res, 200, { method: req.method, url: req.url, headers: req.headers });
  }
  if (path === "/once-hang") return onceHang(req, res, url.searchParams.get("key") ?? "");
  if (path === "/stall" || path === "/reset")
    return misbehave(path === "/stall" ? "stall" : "reset", req, res);
  if (path === "/hang") return hang(req, res);
  req.resume();
  json(res, 404, { error: `no route ${path}` });
}

function listenAddress(): { host: string; port: number } {
  const i = process.argv.indexOf("--listen");
  if (i !== -1) {
    const [host, port] = process.argv[i + 1].split(":");
    return { host: host, port: Number(port) };
  }
  return {
    host: process.env.INFERENCE_HOST ?? "127.0.0.1",
    port: Number(process.env.INFERENCE_PORT ?? 8000),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { host, port } = listenAddress();
  const server = createServer({ keepAliveTimeout: 65_000 }, handle);
  // no cap on the number of header fields (Node drops those past 1000 without a word): an echo
  // must see what it was sent
  server.maxHeadersCount = 0;
  server.listen(port, host, () => {
    const a = server.address();
    console.log(
      JSON.stringify({
        msg: "example inference server listening",
        host,
        port: typeof a === "object" && a ? a.port : port,
      }),
    );
  });
  const stop = () => server.close(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
