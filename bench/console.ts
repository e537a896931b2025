// Benchmark: the operator console at scale (issue 24: "with 1,000 functions and 10,000 requests in
// flight, every page answers within 300 ms on this machine and the live page's updates cost the
// replicas and the API under 5% of a core"). The bench chain (bench/chain.ts: nats-server, the API,
// invocation replicas, a worker) with the replicas' relay on, as `npm start` runs several replicas:
// then they register, and the console's snapshot ends as soon as every registered replica has
// answered instead of waiting out its 300 ms. Set-up through the API's own routes: functions up to
// `functions` (every `deployEvery`-th deployed, with no instance: nothing but the records), a few
// audit entries (confirmed scale actions posted to the console), some answered echo invocations
// (the replicas' last-minute stats), and `inFlight` requests held on the replicas: each a POST to a
// deployed function no worker serves, with NVCF-POLL-SECONDS 3600, on its own raw keep-alive socket
// from this process; the console's own health page (each replica's report, "N requests held") says
// how many are held. Then:
// - every page, one request at a time on one keep-alive connection with an admin Bearer token, the
//   pages taken in turn (so a drift of the machine touches each alike), against the API's own JSON
//   list of the same functions (GET /v2/nvcf/functions, the same token) and GET /v1/info;
// - the live page's cost: the CPU time (utime + stime, /proc) of the API, each replica and
//   nats-server over `liveSeconds` with K server-sent-event clients on /console/live/events, minus
//   the mean of the same length with none just before and just after, as a share of one core.
import { request as httpRequest, type ClientRequest } from "node:http";
import { connect, type Socket } from "node:net";
import { readFileSync } from "node:fs";
import { Client } from "undici";
import type { Chain } from "./chain.js";
import { startChain } from "./chain.js";
import { cpuMs, loadavg, machine } from "./harness.js";

export interface ConsoleBenchOptions {
  /** Functions on the plane in all (the chain's echo function and the held one included). */
  functions: number;
  /** Requests to hold in flight on the replicas. */
  inFlight: number;
  /** Invocation replicas that hold them (the chain's in-cluster replica answers the console too). */
  replicas: number;
  /** Requests per page (after a warm-up of a tenth of them, at least 3). */
  samples: number;
  /** Seconds of each interval of the live page's cost. */
  liveSeconds: number;
  /** Live-page clients to measure (each count its own interval). */
  liveClients: number[];
  /** Every n-th created function is deployed (no instance starts: the bench has no compute agent). */
  deployEvery: number;
  /** Confirmed scale actions posted to the console before measuring (the audit page's rows). */
  auditEntries: number;
  rampTimeoutSeconds: number;
}

/** The goals of the issue, for the lines under the table. */
export const CONSOLE_GOALS = { pageMs: 300, livePercentOfCore: 5 } as const;

/** Requests sent and not yet seen held, at most (the replicas' accept queues and auth checks). */
const RAMP_WINDOW = 1000;
/** The name filter the functions page is measured with: cb-fn-0000 … cb-fn-0099. */
const FILTER = "fn-00";

interface Latency {
  n: number;
  p50: number;
  p99: number;
  mean: number;
  max: number;
  /** The answer's size, the last time. */
  bytes: number;
  errors: number;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const round = (x: number, digits = 2) => Math.round(x * 10 ** digits) / 10 ** digits;

function latency(times: number[], bytes: number, errors: number): Latency {
  const s = [...times].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))];
  return {
    n: s.length,
    p50: round(at(0.5)),
    p99: round(at(0.99)),
    mean: round(s.reduce((a, b) => a + b, 0) / Math.max(1, s.length)),
    max: round(s[s.length - 1] ?? NaN),
    bytes,
    errors,
  };
}

/** The soft limit on open files of this process (its children inherit it). */
function openFileLimit(): number {
  const m = /^Max open files\s+(\d+)/m.exec(readFileSync("/proc/self/limits", "utf8"));
  return m ? Number(m[1]) : NaN;
}

async function api<T>(chain: Chain, method: string, path: string, body?: unknown): Promise<T> {
  const r = await fetch(`${chain.api.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${chain.adminToken}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${path}: ${r.status} ${text.slice(0, 300)}`);
  return JSON.parse(text) as T;
}

/** Runs `f` over 0..n-1, `width` at a time. */
async function pool(n: number, width: number, f: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(width, n) }, async () => {
      while (next < n) await f(next++);
    }),
  );
}

interface Fn {
  id: string;
  versionId: string;
  name: string;
}

async function createFunction(chain: Chain, name: string, deploy: boolean): Promise<Fn> {
  const f = (
    await api<{ function: { id: string; versionId: string } }>(chain, "POST", "/v2/nvcf/functions", {
      name,
      inferenceUrl: "/echo",
      containerImage: "local/echo",
      health: { uri: "/health" },
    })
  ).function;
  if (deploy)
    await api(chain, "POST", `/v2/nvcf/deployments/functions/${f.id}/versions/${f.versionId}`, {
      deploymentSpecifications: [
        {
          gpu: "local",
          instanceType: "local.cpu",
          minInstances: 1,
          maxInstances: 1,
          maxRequestConcurrency: 1,
        },
      ],
    });
  return { id: f.id, versionId: f.versionId, name };
}

/**
 * Requests held open on raw sockets, one per connection: a POST that no worker answers, so the
 * replica keeps it queued for its whole poll window. Any answer (a refusal, a 504) ends it.
 */
class HeldRequests {
  readonly sockets = new Set<Socket>();
  opened = 0;
  ended = 0;
  readonly statuses: Record<string, number> = {};
  readonly samples: string[] = [];

  constructor(
    private readonly path: string,
    private readonly key: string,
  ) {}

  open(address: string): void {
    const [host, port] = address.split(":");
    const s = connect(Number(port), host);
    this.opened++;
    this.sockets.add(s);
    const end = (why: string) => {
      if (!this.sockets.delete(s)) return;
      this.ended++;
      if (this.samples.length < 5) this.samples.push(why);
      s.destroy();
    };
    s.once("connect", () =>
      s.write(
        `POST ${this.path} HTTP/1.1\r\nHost: ${address}\r\nAuthorization: Bearer ${this.key}\r\n` +
          "Content-Type: application/json\r\nNVCF-POLL-SECONDS: 3600\r\nContent-Length: 2\r\n\r\n{}",
      ),
    );
    s.once("data", (d: Buffer) => {
      const line = d.subarray(0, d.indexOf("\r\n")).toString("latin1");
      const status = line.slice(9, 12);
      this.statuses[status] = (this.statuses[status] ?? 0) + 1;
      end(`${line}: ${d.subarray(0, 400).toString("utf8").split("\r\n\r\n")[1] ?? ""}`);
    });
    s.on("error", (err) => end(err.message));
    s.on("close", () => end("closed by the server"));
  }

  get alive(): number {
    return this.opened - this.ended;
  }

  close(): void {
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }
}

/** One console page's HTML (with the admin token), or an error saying what came back. */
async function page(chain: Chain, path: string): Promise<string> {
  const r = await fetch(`${chain.api.url}${path}`, {
    headers: { authorization: `Bearer ${chain.adminToken}` },
    redirect: "manual",
  });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`GET ${path}: ${r.status} ${text.slice(0, 300)}`);
  return text;
}

/** What the console's health page says each invocation replica holds (its report's inFlight). */
async function heldByReplica(chain: Chain): Promise<Record<string, number>> {
  const out: Record<string, number> = {};
  for (const row of (await page(chain, "/console/health")).split("<tr")) {
    if (!row.includes('data-component="invocation"')) continue;
    const id = /data-id="([0-9a-f]+)"/.exec(row)?.[1];
    const n = /(\d+) requests held/.exec(row)?.[1];
    if (id && n !== undefined) out[id] = Number(n);
  }
  return out;
}

const sum = (xs: Record<string, number>) => Object.values(xs).reduce((a, b) => a + b, 0);

/** A live-page client: counts the `inflight` events and the bytes it reads. */
class LiveClient {
  events = 0;
  bytes = 0;
  private tail = "";
  private readonly req: ClientRequest;

  constructor(url: string, token: string) {
    this.req = httpRequest(
      url,
      { headers: { authorization: `Bearer ${token}`, accept: "text/event-stream" }, agent: false },
      (res) => {
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => {
          this.bytes += Buffer.byteLength(chunk);
          const text = this.tail + chunk;
          this.events += text.split("event: inflight\n").length - 1;
          this.tail = text.slice(-("event: inflight\n".length - 1));
        });
        res.on("error", () => undefined);
      },
    );
    this.req.on("error", () => undefined);
    this.req.end();
  }

  close(): void {
    this.req.destroy();
  }
}

export async function benchConsole(o: ConsoleBenchOptions): Promise<Record<string, unknown>> {
  const t0 = Date.now();
  const chain = await startChain({
    workers: 1,
    concurrency: 8,
    replicas: o.replicas,
    // several replicas register (as `npm start` runs them), so the console knows how many answers
    // to wait for; with relay off none registers and every snapshot waits out its 300 ms
    serviceEnv: { CALLPLANE__INVOCATION__RELAY__ENABLED: "true" },
  });
  let held: HeldRequests | undefined;
  const live: LiveClient[] = [];
  try {
    const startSeconds = round((Date.now() - t0) / 1000, 1);
    // ----- the plane: functions, deployments, audit entries, answered requests -----
    const s0 = Date.now();
    const hold = await createFunction(chain, "cb-hold", true);
    const created = Math.max(0, o.functions - 2);
    const fns: Fn[] = new Array<Fn>(created);
    await pool(created, 8, async (i) => {
      fns[i] = await createFunction(
        chain,
        `cb-fn-${String(i).padStart(4, "0")}`,
        o.deployEvery > 0 && i % o.deployEvery === 0,
      );
    });
    const deployed = fns.filter((_, i) => o.deployEvery > 0 && i % o.deployEvery === 0);
    const setupSeconds = round((Date.now() - s0) / 1000, 1);
    for (let i = 0; i < o.auditEntries && deployed.length; i++) {
      const f = deployed[i % deployed.length];
      const form = new URLSearchParams({
        functionId: f.id,
        versionId: f.versionId,
        minInstances: String(i % 2),
        maxInstances: String(1 + (i % 2)),
        confirmed: "1",
      });
      const r = await fetch(`${chain.api.url}/console/actions/scale`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${chain.adminToken}`,
          "content-type": "application/x-www-form-urlencoded",
        },
        body: form.toString(),
        redirect: "manual",
      });
      await r.text();
      if (r.status !== 303) throw new Error(`a confirmed scale action answered ${r.status}`);
    }
    // answered requests, so that the replicas have last-minute stats to report
    await pool(200, 8, async () => {
      const r = await fetch(chain.viaProxy.url, {
        method: "POST",
        headers: { authorization: `Bearer ${chain.key}`, "content-type": "application/json" },
        body: "{}",
      });
      await r.arrayBuffer();
    });

    // ----- the requests held in flight -----
    const holdPath = `/v2/nvcf/pexec/functions/${hold.id}`;
    const h = (held = new HeldRequests(holdPath, chain.key));
    const r0 = Date.now();
    let byReplica: Record<string, number> = {};
    let reached = 0;
    let best = 0;
    let lastProgress = Date.now();
    let stoppedBecause: string | undefined;
    let next = 0;
    for (;;) {
      const room = Math.min(o.inFlight - h.alive, RAMP_WINDOW - (h.alive - reached));
      for (let k = 0; k < room; k++) h.open(chain.replicas[next++ % chain.replicas.length].address);
      await sleep(250);
      byReplica = await heldByReplica(chain);
      reached = sum(byReplica);
      if (reached >= o.inFlight) break;
      if (reached > best) {
        best = reached;
        lastProgress = Date.now();
      }
      if (h.ended > Math.max(50, o.inFlight / 100))
        throw new Error(
          `${h.ended} of the requests to hold were answered or failed (statuses ${JSON.stringify(h.statuses)}); first ones: ${h.samples.join(" | ")}`,
        );
      if (Date.now() - r0 > o.rampTimeoutSeconds * 1000) {
        stoppedBecause = `${reached} of ${o.inFlight} were held after ${o.rampTimeoutSeconds} s`;
        break;
      }
      if (Date.now() - lastProgress > 30_000) {
        stoppedBecause = `no more were held for 30 s at ${reached} of ${o.inFlight} (${h.alive} connections open)`;
        break;
      }
    }
    const rampSeconds = round((Date.now() - r0) / 1000, 1);
    console.log(
      `  console: ${o.functions} functions (${deployed.length + 2} deployed), ${reached} requests in flight (${JSON.stringify(byReplica)}) after ${rampSeconds} s`,
    );

    // ----- the pages -----
    const liveHtml = await page(chain, "/console/live");
    const inflightId = /data-request-id="([0-9a-f-]{36})"/.exec(liveHtml)?.[1];
    if (!inflightId) throw new Error("the live page lists no request in flight");
    const lastPage = Math.max(1, Math.ceil(o.functions / 50));
    const pages: Array<{ key: string; path: string; expect: string }> = [
      { key: "health", path: "/console/health", expect: 'id="components"' },
      { key: "functions", path: "/console/functions", expect: 'id="functions"' },
      {
        key: "functionsFiltered",
        path: `/console/functions?q=${FILTER}`,
        expect: 'data-function-name="cb-fn-0000"',
      },
      { key: "functionsLastPage", path: `/console/functions?page=${lastPage}`, expect: "data-function-id=" },
      { key: "function", path: `/console/functions/${hold.id}`, expect: 'id="deployments"' },
      { key: "live", path: "/console/live", expect: "data-request-id=" },
      { key: "audit", path: "/console/audit", expect: o.auditEntries ? 'data-action="scale"' : 'id="audit"' },
      {
        key: "request",
        path: `/console/requests/${inflightId}`,
        expect: 'id="request-state" class="state">queued',
      },
      { key: "apiFunctionList", path: "/v2/nvcf/functions", expect: '"functions"' },
      { key: "apiInfo", path: "/v1/info", expect: "callplane-api" },
    ];
    // each page once, checked for what it must show (a page that answers fast with nothing is no figure)
    const shape: Record<string, number> = {};
    for (const p of pages) {
      const text = await page(chain, p.path);
      if (!text.includes(p.expect))
        throw new Error(`GET ${p.path} does not show ${p.expect}: ${text.slice(0, 300)}`);
      if (p.key === "functions") shape.functionRows = text.split("data-function-id=").length - 1;
      if (p.key === "live") shape.liveRows = text.split("data-request-id=").length - 1;
      if (p.key === "functionsFiltered") shape.filteredRows = text.split("data-function-id=").length - 1;
    }
    const client = new Client(chain.api.url, { keepAliveTimeout: 60_000 });
    const times: Record<string, number[]> = Object.fromEntries(pages.map((p) => [p.key, []]));
    const bytes: Record<string, number> = {};
    const errors: Record<string, number> = Object.fromEntries(pages.map((p) => [p.key, 0]));
    const warmup = Math.max(3, Math.round(o.samples / 10));
    try {
      for (let i = 0; i < warmup + o.samples; i++)
        for (const p of pages) {
          const t = performance.now();
          const r = await client.request({
            method: "GET",
            path: p.path,
            headers: { authorization: `Bearer ${chain.adminToken}` },
          });
          const body = Buffer.from(await r.body.arrayBuffer());
          const ms = performance.now() - t;
          if (i < warmup) continue;
          if (r.statusCode !== 200) errors[p.key]++;
          times[p.key].push(ms);
          bytes[p.key] = body.length;
        }
    } finally {
      await client.close();
    }
    const lat = Object.fromEntries(
      pages.map((p) => [p.key, latency(times[p.key], bytes[p.key] ?? 0, errors[p.key])]),
    );
    const consolePages = pages.filter((p) => !p.key.startsWith("api")).map((p) => p.key);
    const slowest = consolePages.reduce((a, b) => (lat[b].p99 > lat[a].p99 ? b : a));
    const heldAfterPages = sum(await heldByReplica(chain));

    // ----- the live page's cost -----
    const processes: Record<string, number> = {
      api: chain.api.proc.pid!,
      ...Object.fromEntries(chain.replicas.map((r, i) => [`invocation-${i + 1}`, r.proc.pid!])),
      "invocation-in-cluster": chain.direct.proc.pid!,
      nats: chain.nats.pid!,
    };
    const replicaKeys = Object.keys(processes).filter((k) => k.startsWith("invocation"));
    /** CPU ms per second of each process over one interval. */
    const interval = async (): Promise<Record<string, number>> => {
      const a = Object.fromEntries(Object.entries(processes).map(([k, pid]) => [k, cpuMs(pid)]));
      const w = performance.now();
      await sleep(o.liveSeconds * 1000);
      const dt = (performance.now() - w) / 1000;
      const out = Object.fromEntries(
        Object.entries(processes).map(([k, pid]) => [k, round((cpuMs(pid) - a[k]) / dt)]),
      );
      out.replicas = round(replicaKeys.reduce((s, k) => s + out[k], 0));
      return out;
    };
    const settle = () => sleep(2000);
    const idle: Array<Record<string, number>> = [];
    await settle();
    idle.push(await interval());
    const liveRuns: Record<string, Record<string, unknown>> = {};
    for (const k of o.liveClients) {
      const base = `${chain.api.url}/console/live/events`;
      for (let i = 0; i < k; i++) live.push(new LiveClient(base, chain.adminToken));
      await settle();
      const ev0 = live.reduce((s, c) => s + c.events, 0);
      const by0 = live.reduce((s, c) => s + c.bytes, 0);
      const busy = await interval();
      const events = live.reduce((s, c) => s + c.events, 0) - ev0;
      const read = live.reduce((s, c) => s + c.bytes, 0) - by0;
      for (const c of live.splice(0)) c.close();
      await settle();
      const after = await interval();
      const before = idle[idle.length - 1];
      idle.push(after);
      const quiet = Object.fromEntries(Object.keys(busy).map((p) => [p, round((before[p] + after[p]) / 2)]));
      /** Added CPU as a share of one core: ms per second / 10. */
      const added = Object.fromEntries(Object.keys(busy).map((p) => [p, round((busy[p] - quiet[p]) / 10)]));
      liveRuns[String(k)] = {
        clients: k,
        cpuMsPerSecond: busy,
        quietCpuMsPerSecond: quiet,
        addedPercentOfCore: { ...added, apiAndReplicas: round(added.api + added.replicas) },
        // everything the API and the replicas did meanwhile, their work at rest included: an upper
        // bound on the live page's cost that no noise of the quiet intervals can lower
        totalPercentOfCore: { apiAndReplicas: round((busy.api + busy.replicas) / 10) },
        eventsPerSecondPerClient: round(events / o.liveSeconds / k),
        bytesPerEvent: events ? Math.round(read / events) : 0,
      };
    }
    const worstTotal = Math.max(
      ...Object.values(liveRuns).map((r) => (r.totalPercentOfCore as Record<string, number>).apiAndReplicas),
    );
    const worstLive = Math.max(
      ...Object.values(liveRuns).map((r) => (r.addedPercentOfCore as Record<string, number>).apiAndReplicas),
    );
    return {
      benchmark: "console",
      machine: machine(),
      options: o,
      setup: {
        chainStartSeconds: startSeconds,
        functions: o.functions,
        deployed: deployed.length + 2,
        functionsSetupSeconds: setupSeconds,
        auditEntries: o.auditEntries,
        target: o.inFlight,
        held: reached,
        heldAfterPages,
        heldByReplica: byReplica,
        replicas: chain.replicas.length + 1,
        rampSeconds,
        ...(stoppedBecause ? { stoppedBecause } : {}),
        answeredWhileHolding: h.statuses,
        openFileLimit: openFileLimit(),
        inflightId,
        ...shape,
      },
      pages: lat,
      live: { idle, runs: liveRuns },
      checks: {
        slowestPage: slowest,
        slowestP99Ms: lat[slowest].p99,
        everyPageP99Under300ms: consolePages.every((k) => lat[k].p99 < CONSOLE_GOALS.pageMs),
        liveAddedPercentOfCoreMost: worstLive,
        liveTotalPercentOfCoreMost: worstTotal,
        liveUnder5PercentOfCore: worstLive < CONSOLE_GOALS.livePercentOfCore,
      },
      loadavg: loadavg(),
      seconds: Math.round((Date.now() - t0) / 1000),
    };
  } finally {
    for (const c of live) c.close();
    held?.close();
    chain.close();
  }
}
