// The fault cases: each puts the plane under steady load (or sends requests shaped for the fault),
// injects one fault, and checks its criterion from what the clients saw. A case returns the loads'
// accounting and the problems it found; no problem means it passed. Every case leaves the plane as
// it found it (every piece running and balanced), so the next one starts clean.
import { jetstreamManager } from "@nats-io/jetstream";
import { request as httpRequest } from "node:http";
import { connect as netConnect, type Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { setTimeout as sleep } from "node:timers/promises";
import { subjects } from "../../../src/lib/nats/index.js";
import { describe, isHang, startLoad, type Load, type LoadResult } from "./load.js";
import { REGION, type FaultPlane, type Restartable } from "./plane.js";

export type ProfileName = "small" | "full";

export interface Profile {
  name: ProfileName;
  /** Load generator threads per load. */
  concurrency: number;
  /** Requests sent between steps (so each fault lands on a loaded plane). */
  settle: number;
  /** Replicas restarted in a rolling restart (the full profile restarts all of them). */
  rollAll: boolean;
  /** Certificate rotations under load. */
  rotations: number;
  /** Slow connections opened at once. */
  slowConnections: number;
  /** Whether the latency criterion (p99 within 2× of its baseline) is asserted; CI's machine is shared. */
  assertLatency: boolean;
}

export const PROFILES: Record<ProfileName, Profile> = {
  small: {
    name: "small",
    concurrency: 4,
    settle: 200,
    rollAll: false,
    rotations: 3,
    slowConnections: 50,
    assertLatency: false,
  },
  full: {
    name: "full",
    concurrency: 8,
    settle: 1500,
    rollAll: true,
    rotations: 10,
    slowConnections: 400,
    assertLatency: true,
  },
};

export interface CaseContext {
  plane: FaultPlane;
  profile: Profile;
  log(msg: string): void;
}

export interface CaseOutcome {
  loads: Record<string, LoadResult>;
  problems: string[];
  /** What the case saw besides the loads' counts. */
  notes: string[];
}

export interface FaultCase {
  name: string;
  criterion: string;
  run(ctx: CaseContext): Promise<CaseOutcome>;
}

const httpLoad = (ctx: CaseContext, extra: { timeoutSeconds?: number } = {}): Load =>
  startLoad("http", ctx.plane.invokeUrl(), {
    headers: [`authorization: Bearer ${ctx.plane.fn.apiKey}`],
    concurrency: ctx.profile.concurrency,
    ...extra,
  });

const grpcLoad = (ctx: CaseContext): Load =>
  startLoad("grpc", ctx.plane.grpcTarget, {
    headers: [
      `authorization=Bearer ${ctx.plane.grpcFn.apiKey}`,
      `function-id=${ctx.plane.grpcFn.functionId}`,
    ],
    concurrency: ctx.profile.concurrency,
  });

/** The problems every load shares: nothing unaccounted, nothing answered wrongly, nothing hung. */
function accounting(name: string, r: LoadResult): string[] {
  const p: string[] = [];
  if (r.unaccounted !== 0) p.push(`${name}: ${r.unaccounted} requests unaccounted`);
  if (r.wrong !== 0) p.push(`${name}: ${r.wrong} answers with the wrong body`);
  if (r.answered === 0) p.push(`${name}: nothing was answered`);
  const hung = Object.entries(r.reasons).filter(([k]) => isHang(k));
  if (hung.length)
    p.push(
      `${name}: requests hung until the client's timeout (${hung.map(([k, v]) => `${k} ×${v}`).join(", ")})`,
    );
  return p;
}

const noFailures = (name: string, r: LoadResult): string[] =>
  r.failed === 0 ? [] : [`${name}: ${r.failed} failed (${describe(r)})`];

/** Restarts each piece in turn (SIGTERM, drain, start, back in the balancer) under load. */
async function roll(ctx: CaseContext, load: Load, pieces: Restartable[]): Promise<string[]> {
  const notes: string[] = [];
  for (const r of ctx.profile.rollAll ? pieces : pieces.slice(0, 2)) {
    await load.untilSent(ctx.profile.settle);
    const t0 = Date.now();
    await r.stop();
    const stopped = Date.now() - t0;
    await r.start();
    await ctx.plane.waitBalanced(r.name);
    notes.push(`${r.name} stopped in ${(stopped / 1000).toFixed(1)} s`);
    ctx.log(`${r.name} restarted (stop took ${stopped} ms)`);
  }
  await load.untilSent(ctx.profile.settle);
  return notes;
}

/** A rolling restart under HTTP load, which must not fail a single invocation. */
async function rollUnderHttpLoad(ctx: CaseContext, pieces: Restartable[]): Promise<CaseOutcome> {
  const load = httpLoad(ctx);
  const notes = await roll(ctx, load, pieces);
  const r = await load.stop();
  return { loads: { http: r }, problems: [...accounting("http", r), ...noFailures("http", r)], notes };
}

/** The work queue's consumer has nothing in flight (no worker holds work it cannot finish). */
async function queueSettles(ctx: CaseContext, timeoutMs = 30_000): Promise<string[]> {
  const nc = await ctx.plane.nats.observe("faults-queue");
  try {
    const jsm = await jetstreamManager(nc);
    const stream = subjects.stream(REGION, ctx.plane.fn.versionId);
    const consumer = subjects.consumer(REGION, ctx.plane.fn.versionId);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const info = await jsm.consumers.info(stream, consumer).catch(() => undefined);
      if (info && info.num_ack_pending === 0 && info.num_pending === 0) return [];
      if (Date.now() > deadline)
        return [
          `the work queue still holds work ${timeoutMs / 1000} s after the fault: ` +
            `${info?.num_pending ?? "?"} pending, ${info?.num_ack_pending ?? "?"} awaiting an ack`,
        ];
      await sleep(250);
    }
  } finally {
    await nc.close();
  }
}

/** After a fault: a short clean load answers everything (the plane recovered without restarts). */
async function recovers(ctx: CaseContext, loads: Record<string, LoadResult>): Promise<string[]> {
  const after = httpLoad(ctx);
  await after.untilSent(ctx.profile.settle, 120_000).catch(() => undefined);
  const r = await after.stop();
  loads["http after"] = r;
  return [...accounting("http after", r), ...noFailures("http after", r)];
}

/** One request with node:http, settled as the client sees it: status, bytes and how it ended. */
interface OneResult {
  status?: number;
  bytes: number;
  ended: "complete" | "error" | "timeout";
  error?: string;
  ms: number;
  body: Buffer;
}
function one(
  ctx: CaseContext,
  query: string,
  body: Buffer,
  timeoutMs: number,
  extra: Record<string, string> = {},
): Promise<OneResult> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let bytes = 0;
    let status: number | undefined;
    let done = false;
    const finish = (ended: OneResult["ended"], error?: string) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      req.destroy();
      resolve({ status, bytes, ended, error, ms: Date.now() - t0, body: Buffer.concat(chunks) });
    };
    const req = httpRequest(ctx.plane.invokeUrl(query), {
      method: "POST",
      headers: {
        authorization: `Bearer ${ctx.plane.fn.apiKey}`,
        "content-type": "application/octet-stream",
        "content-length": String(body.length),
        ...extra,
      },
      agent: false,
    });
    const timer = setTimeout(() => finish("timeout"), timeoutMs);
    req.once("error", (err) => finish("error", err.message));
    req.once("response", (res) => {
      status = res.statusCode;
      res.on("data", (c: Buffer) => {
        bytes += c.length;
        if (chunks.length < 64) chunks.push(c);
      });
      res.once("end", () => finish("complete"));
      res.once("aborted", () => finish("error", "response aborted"));
      res.once("error", (err) => finish("error", err.message));
    });
    req.end(body);
  });
}

/** Counts the results of several one() calls: `complete 200 ×3, error (aborted) ×2`. */
function tally(rs: OneResult[]): string {
  const m = new Map<string, number>();
  for (const r of rs) {
    const k = r.ended === "complete" ? `${r.status}` : `${r.ended}${r.error ? ` (${r.error})` : ""}`;
    m.set(k, (m.get(k) ?? 0) + 1);
  }
  return [...m].map(([k, v]) => `${k} ×${v}`).join(", ");
}

/**
 * Opens `n` connections that each send a request head one byte a second (slowloris), or a whole
 * head and then its body one byte a second; counts those the server closes.
 */
function slowClients(
  n: number,
  open: () => Socket,
  head: string,
  slowPart: "head" | "body",
): { closed: () => number; opened: () => number; stop: () => void } {
  let closed = 0;
  let opened = 0;
  const sockets: Socket[] = [];
  const timers: NodeJS.Timeout[] = [];
  for (let i = 0; i < n; i++) {
    const s = open();
    sockets.push(s);
    s.on("error", () => undefined);
    s.resume();
    s.once("close", () => closed++);
    s.once("encrypted" in s ? "secureConnect" : "connect", () => {
      opened++;
      s.write(slowPart === "head" ? head.slice(0, head.indexOf("\r\n") + 2) + "x-slow: " : head);
      timers.push(
        setInterval(() => {
          if (!s.destroyed) s.write("a");
        }, 1000),
      );
    });
  }
  return {
    closed: () => closed,
    opened: () => opened,
    stop: () => {
      for (const t of timers) clearInterval(t);
      for (const s of sockets) s.destroy();
    },
  };
}

export const CASES: FaultCase[] = [
  {
    name: "rolling-restart-invocation",
    criterion: "rolling restart of every invocation replica under load: zero failed client invocations",
    run: (ctx) => rollUnderHttpLoad(ctx, ctx.plane.replicas),
  },
  {
    name: "rolling-restart-grpc-proxy",
    criterion:
      "rolling restart of every grpc-proxy replica under load: zero failed new calls; calls in flight finish or end with UNAVAILABLE",
    async run(ctx) {
      const load = grpcLoad(ctx);
      const notes = await roll(ctx, load, ctx.plane.grpcProxies);
      const r = await load.stop();
      const other = Object.entries(r.reasons).filter(([k]) => !k.startsWith("UNAVAILABLE"));
      const problems = accounting("grpc", r);
      if (other.length)
        problems.push(
          `grpc: calls failed other than UNAVAILABLE: ${other.map(([k, v]) => `${k} ×${v}`).join(", ")}`,
        );
      // a call in flight on a replica that stops may end UNAVAILABLE: at most one per client thread
      // and restart
      const restarts = ctx.profile.rollAll ? ctx.plane.grpcProxies.length : 2;
      const unavailable = r.failed - other.reduce((a, [, v]) => a + v, 0);
      if (unavailable > ctx.profile.concurrency * restarts)
        problems.push(
          `grpc: ${unavailable} UNAVAILABLE, more than the calls that can be in flight at the restarts`,
        );
      return { loads: { grpc: r }, problems, notes };
    },
  },
  {
    name: "rolling-restart-callback-proxy",
    criterion:
      "rolling restart of the callback proxy (two replicas behind the balancer) under load: zero failed invocations",
    run: (ctx) => rollUnderHttpLoad(ctx, ctx.plane.proxies),
  },
  {
    name: "kill-9-invocation-replica",
    criterion:
      "kill -9 of one invocation replica: only its in-flight requests fail, fast and with a clear error; workers do not get stuck on its work",
    async run(ctx) {
      const victim = ctx.plane.replicas[0];
      const load = httpLoad(ctx);
      await load.untilSent(ctx.profile.settle);
      const killedAt = Date.now();
      await victim.kill();
      ctx.log(`${victim.name} killed`);
      await load.untilSent(ctx.profile.settle);
      const r = await load.stop();
      const problems = accounting("http", r);
      // in flight on the victim: at most one request per client connection
      if (r.failed > ctx.profile.concurrency)
        problems.push(
          `http: ${r.failed} failed, more than the ${ctx.profile.concurrency} that can be in flight on one replica`,
        );
      const late = r.failAt.map((s) => r.startedAtMs + s * 1000 - killedAt).filter((ms) => ms > 5000);
      if (late.length) problems.push(`http: ${late.length} failures came more than 5 s after the kill`);
      problems.push(...(await queueSettles(ctx)));
      await victim.start();
      await ctx.plane.waitBalanced(victim.name);
      const loads = { http: r };
      problems.push(...(await recovers(ctx, loads)));
      return {
        loads,
        problems,
        notes: [
          `failures after the kill: ${r.failAt.map((s) => `${Math.round(r.startedAtMs + s * 1000 - killedAt)} ms`).join(", ") || "none"}`,
        ],
      };
    },
  },
  {
    name: "worker-killed-before-attach",
    criterion: "a worker killed before it attaches: the request is redelivered and completes",
    async run(ctx) {
      const [first, second] = ctx.plane.httpWorkers;
      // one worker takes the work: the other stops (gracefully) first
      await second.stop();
      const key = `k${Date.now()}`;
      const n = 4;
      const bodies = Array.from({ length: n }, (_, i) => Buffer.from(`redelivered ${key} ${i}`));
      const calls = bodies.map((b, i) =>
        one(ctx, `?fault=hang-once&key=${key}-${i}`, b, 90_000, { "nvcf-poll-seconds": "60" }),
      );
      // the worker holds them (its inference server hangs on a first call with a key), then dies
      await sleep(1500);
      await first.kill();
      ctx.log(`${first.name} killed holding ${n} requests; ${second.name} starts`);
      await second.start();
      const rs = await Promise.all(calls);
      await first.start();
      const problems: string[] = [];
      rs.forEach((r, i) => {
        if (r.ended !== "complete" || r.status !== 200 || !r.body.equals(bodies[i]))
          problems.push(`request ${i}: ${r.ended} ${r.status ?? ""} ${r.error ?? ""} (${r.bytes} bytes)`);
      });
      problems.push(...(await queueSettles(ctx)));
      return {
        loads: {},
        problems,
        notes: [`${n} requests: ${tally(rs)}; slowest ${Math.max(...rs.map((r) => r.ms))} ms (ackWait 5 s)`],
      };
    },
  },
  {
    name: "worker-killed-mid-response",
    criterion: "a worker killed mid-response: the client gets a clear error, not a hang",
    async run(ctx) {
      const [first, second] = ctx.plane.httpWorkers;
      await second.stop();
      const n = 4;
      // 64 MiB echoed by a slow reader: the answer is streaming when the worker dies
      const body = Buffer.alloc(64 * 1024 * 1024, "m");
      const calls = Array.from({ length: n }, () => one(ctx, "?readPauseMs=200", body, 60_000));
      await sleep(2000);
      await first.kill();
      ctx.log(`${first.name} killed mid-response`);
      const rs = await Promise.all(calls);
      await first.start();
      await second.start();
      const problems: string[] = [];
      for (const [i, r] of rs.entries()) {
        if (r.ended === "timeout") problems.push(`request ${i} hung (${r.bytes} bytes, then nothing)`);
        else if (r.ended === "complete" && r.status === 200 && r.bytes !== body.length)
          problems.push(`request ${i} ended as if complete with ${r.bytes} of ${body.length} bytes`);
      }
      problems.push(...(await queueSettles(ctx)));
      return {
        loads: {},
        problems,
        notes: [`${n} requests: ${tally(rs)}; slowest ${Math.max(...rs.map((r) => r.ms))} ms`],
      };
    },
  },
  {
    name: "nats-stopped-5s",
    criterion:
      "nats-server stopped for 5 s, then back: no invocation hangs; each completes or fails clearly; service recovers without restarts",
    async run(ctx) {
      const load = httpLoad(ctx);
      await load.untilSent(ctx.profile.settle);
      await ctx.plane.nats.stopServer();
      ctx.log("nats-server stopped");
      await sleep(5000);
      await ctx.plane.nats.startServer();
      ctx.log("nats-server started");
      await load.untilSent(ctx.profile.settle, 120_000).catch(() => undefined);
      const r = await load.stop();
      const loads = { "http during": r };
      const problems = [...accounting("http during", r), ...(await recovers(ctx, loads))];
      return { loads, problems, notes: [] };
    },
  },
  {
    name: "worker-link-cut-5s",
    criterion:
      "network between the workers and the proxy (and NATS) cut for 5 s: no invocation hangs; each completes or fails clearly; service recovers",
    async run(ctx) {
      const load = httpLoad(ctx);
      await load.untilSent(ctx.profile.settle);
      await ctx.plane.link(false);
      ctx.log("link down");
      await sleep(5000);
      await ctx.plane.link(true);
      ctx.log("link up");
      await load.untilSent(ctx.profile.settle, 120_000).catch(() => undefined);
      const r = await load.stop();
      const loads = { "http during": r };
      const problems = [...accounting("http during", r), ...(await recovers(ctx, loads))];
      problems.push(...(await queueSettles(ctx)));
      return { loads, problems, notes: [] };
    },
  },
  {
    name: "certificate-rotation",
    criterion:
      "frontend certificate and CA bundle rotated every few seconds under load: zero failed callbacks",
    async run(ctx) {
      const load = httpLoad(ctx);
      for (let i = 0; i < ctx.profile.rotations; i++) {
        await load.untilSent(ctx.profile.settle / 2);
        await ctx.plane.rotateFrontend();
        await sleep(1000);
        await ctx.plane.rotateCaBundle();
        await sleep(1000);
      }
      await load.untilSent(ctx.profile.settle);
      const r = await load.stop();
      return {
        loads: { http: r },
        problems: [...accounting("http", r), ...noFailures("http", r)],
        notes: [`${ctx.profile.rotations} frontend and ${ctx.profile.rotations} CA bundle rotations`],
      };
    },
  },
  {
    name: "slow-clients",
    criterion:
      "slowloris and slow-body clients on the proxy and the client ports: legitimate load keeps its p99 within 2× of its baseline; slow connections closed on their timeout",
    async run(ctx) {
      const base = httpLoad(ctx);
      await base.untilSent(ctx.profile.settle * 2);
      const baseline = await base.stop();
      const n = ctx.profile.slowConnections;
      const replica = new URL(ctx.plane.replicas[1].handle.urls.invocation);
      const proxy = ctx.plane.proxyAddress;
      const invoke = (extra: string) =>
        `POST /v2/nvcf/pexec/functions/${ctx.plane.fn.functionId} HTTP/1.1\r\nhost: ${replica.host}\r\n` +
        `authorization: Bearer ${ctx.plane.fn.apiKey}\r\ncontent-type: application/octet-stream\r\n${extra}`;
      const toReplica = () => netConnect(Number(replica.port), replica.hostname);
      const toProxy = () =>
        tlsConnect({
          host: proxy.host,
          port: proxy.port,
          rejectUnauthorized: false,
          servername: `invocation.${ctx.plane.workerDomain}`,
        });
      const kinds = ["client-port slowloris", "client-port slow body", "proxy slowloris"];
      const opened = [
        slowClients(n, toReplica, invoke("\r\n"), "head"),
        slowClients(n, toReplica, invoke("content-length: 1000000\r\n\r\n"), "body"),
        slowClients(n, toProxy, "POST /x HTTP/1.1\r\nhost: x\r\n\r\n", "head"),
      ];
      const load = httpLoad(ctx);
      await load.untilSent(ctx.profile.settle * 2);
      const r = await load.stop();
      const problems = [
        ...accounting("http under slow clients", r),
        ...noFailures("http under slow clients", r),
      ];
      const ratio = r.p99ms && baseline.p99ms ? r.p99ms / baseline.p99ms : Infinity;
      const latency = `p99 ${r.p99ms} ms under ${n * 3} slow connections vs ${baseline.p99ms} ms baseline (${ratio.toFixed(2)}×)`;
      if (ctx.profile.assertLatency && ratio > 2) problems.push(latency);
      // the slow connections are closed on their timeouts: the client port's 30 s for a head, the
      // poll window (20 s here) for the inline part of a body, the proxy's headersSeconds (10 s)
      const deadline = Date.now() + 45_000;
      while (Date.now() < deadline && opened.some((o) => o.closed() < o.opened())) await sleep(500);
      const closed = opened.map((o, i) => `${kinds[i]} ${o.closed()}/${o.opened()}`);
      for (const [i, o] of opened.entries())
        if (o.closed() < o.opened() || o.opened() < n)
          problems.push(
            `${kinds[i]}: ${o.closed()} of ${o.opened()} opened (${n} tried) closed by the server in time`,
          );
      for (const o of opened) o.stop();
      return {
        loads: { baseline, "http under slow clients": r },
        problems,
        notes: [latency, `closed by the server: ${closed.join(", ")}`],
      };
    },
  },
  {
    name: "inference-stall-and-reset",
    criterion:
      "an inference server that stalls after headers, or resets mid-body: the client gets a clear error within the configured timeout",
    async run(ctx) {
      const idle = ctx.plane.inferenceIdleSeconds * 1000;
      const body = Buffer.from("stall or reset");
      const stalls = Array.from({ length: 3 }, () => one(ctx, "?fault=stall", body, idle + 20_000));
      const resets = Array.from({ length: 3 }, () => one(ctx, "?fault=reset", body, idle + 20_000));
      const st = await Promise.all(stalls);
      const rs = await Promise.all(resets);
      const problems: string[] = [];
      for (const [i, r] of [...st, ...rs].entries()) {
        if (r.ended === "timeout") problems.push(`request ${i} hung past the inference idle timeout + 20 s`);
        else if (r.ended === "complete" && r.status === 200)
          problems.push(`request ${i} ended as if complete (${r.bytes} bytes) instead of failing`);
      }
      const slowestStall = Math.max(...st.map((r) => r.ms));
      if (slowestStall > idle + 10_000)
        problems.push(`a stalled answer took ${slowestStall} ms to fail (idle timeout ${idle} ms)`);
      problems.push(...(await queueSettles(ctx)));
      return {
        loads: {},
        problems,
        notes: [
          `stall: ${tally(st)}, slowest ${slowestStall} ms (idle timeout ${idle} ms)`,
          `reset: ${tally(rs)}, slowest ${Math.max(...rs.map((r) => r.ms))} ms`,
        ],
      };
    },
  },
];
