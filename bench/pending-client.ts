// The client side of the pending benchmark (bench/pending.ts), as its own process: it holds many
// polled requests against one invocation replica with as little memory and CPU as it can (raw
// sockets, one keep-alive connection per request, a response parser that reads only the status and
// the headers it needs). Each request is a POST that the worker answers with a 202 once its poll
// window (NVCF-POLL-SECONDS: 1) is over, then a status poll with a long window on the same
// connection, sent again whenever a 202 ends it. The parent says how many requests to hold
// ({type: "target", count}) and reads the counts this process reports every second.
// Usage: node pending-client.js <config JSON>
import { connect, type Socket } from "node:net";

interface Config {
  host: string;
  port: number;
  /** The invocation path, with the query string the inference server gets. */
  path: string;
  key: string;
  /** POSTs waiting for their 202 at most at once. */
  inflight: number;
  pollSeconds: number;
}

const cfg = JSON.parse(process.argv[2]) as Config;

const counts = {
  /** Requests started (connections opened). */
  started: 0,
  /** POSTs sent and not yet answered. */
  posting: 0,
  /** Requests that got their 202 and have a status poll outstanding. */
  polling: 0,
  /** Status polls answered with another 202 (and sent again). */
  repolls: 0,
  /** Final answers of any kind, connection errors: the request is no longer held. */
  ended: 0,
  errors: 0,
  /**
   * POSTs answered 504 (no worker took the request within its 1 s window and the grace): on a
   * machine too busy for the workers to keep up; the request is cancelled, not held, and another
   * is started in its place.
   */
  postTimeouts: 0,
  statuses: {} as Record<string, number>,
  /** The first few errors as they came (a refusal's phase, status line and body, or the socket's error). */
  errorSamples: [] as string[],
};
let target = 0;
/**
 * POSTs allowed to wait for their 202 at once: starts at cfg.inflight, halves on every 504 (the
 * workers did not take requests within their 1 s window: the machine is behind) and grows by one
 * with each 202, back up to cfg.inflight. Without it a ramp on a busy machine feeds itself: each
 * 504 starts another POST at once, and more of them time out.
 */
let window = cfg.inflight;
const sockets = new Set<Socket>();

const head = (method: string, path: string, extra: string) =>
  `${method} ${path} HTTP/1.1\r\nHost: ${cfg.host}:${cfg.port}\r\nAuthorization: Bearer ${cfg.key}\r\n${extra}\r\n`;
const post = Buffer.from(
  head("POST", cfg.path, "Content-Type: application/json\r\nNVCF-POLL-SECONDS: 1\r\nContent-Length: 2\r\n") +
    "{}",
);
const pollHead = (id: string) =>
  head("GET", `/v2/nvcf/pexec/status/${id}`, `NVCF-POLL-SECONDS: ${cfg.pollSeconds}\r\n`);

/** One held request on its own connection. */
function hold(): void {
  counts.started++;
  counts.posting++;
  let phase: "post" | "poll" = "post";
  let buf: Buffer = Buffer.alloc(0);
  let requestId = "";
  const s = connect(cfg.port, cfg.host);
  sockets.add(s);
  s.setNoDelay(true);
  const end = (why: string, isError: boolean) => {
    if (phase === "post") counts.posting--;
    else counts.polling--;
    counts.ended++;
    if (isError) {
      counts.errors++;
      if (counts.errorSamples.length < 5) counts.errorSamples.push(why);
    }
    sockets.delete(s);
    s.destroy();
    pump();
  };
  s.once("connect", () => s.write(post));
  s.on("error", (err) => end(err.message, true));
  s.on("close", () => {
    if (sockets.has(s)) end("connection closed by the server", true);
  });
  s.on("data", (chunk: Buffer) => {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    for (;;) {
      const i = buf.indexOf("\r\n\r\n");
      if (i === -1) return;
      const text = buf.subarray(0, i).toString("latin1");
      const status = Number(text.slice(9, 12));
      const length = Number(/\r\ncontent-length:\s*(\d+)/i.exec(text)?.[1] ?? 0);
      const chunked = /\r\ntransfer-encoding:\s*chunked/i.test(text);
      let bodyEnd = i + 4 + length;
      if (chunked) {
        const z = buf.indexOf("0\r\n\r\n", i + 4);
        if (z === -1) return;
        bodyEnd = z + 5;
      }
      if (buf.length < bodyEnd) return;
      const body = buf.subarray(i + 4, Math.min(bodyEnd, i + 4 + 400)).toString("utf8");
      buf = buf.subarray(bodyEnd);
      counts.statuses[status] = (counts.statuses[status] ?? 0) + 1;
      if (status === 504 && phase === "post") {
        counts.postTimeouts++;
        window = Math.max(10, Math.floor(window / 2));
        end("504 on the POST", false);
        return;
      }
      if (status !== 202) {
        const why = `${phase === "post" ? "POST" : "status poll"}: ${text.split("\r\n")[0]} ${body}`;
        end(why, true);
        return;
      }
      if (phase === "post") {
        requestId = /\r\nnvcf-reqid:\s*([0-9a-f-]+)/i.exec(text)?.[1] ?? "";
        if (!requestId) {
          end("a 202 without NVCF-REQID", true);
          return;
        }
        phase = "poll";
        window = Math.min(cfg.inflight, window + 1);
        counts.posting--;
        counts.polling++;
        pump();
      } else counts.repolls++;
      s.write(pollHead(requestId));
    }
  });
}

/** Starts requests while fewer than `target` are held and fewer than `window` POSTs wait. */
function pump(): void {
  while (counts.started - counts.ended < target && counts.posting < window) hold();
}

process.on("message", (m: { type: string; count?: number }) => {
  if (m.type === "target") {
    target = m.count ?? 0;
    pump();
  } else if (m.type === "stop") {
    for (const s of sockets) s.destroy();
    process.exit(0);
  }
});
setInterval(() => process.send?.({ type: "counts", counts }), 1000);
process.send?.({ type: "ready", service: "pending-client", urls: {} });
