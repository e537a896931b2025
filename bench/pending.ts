// Benchmark: memory per pending (polled) request. Requests that got a 202 and whose workers keep
// them open, each with a client long-polling for it (the shape of NVCF's asynchronous invocation):
// the function's inference path is the example server's /slow route told to take two hours and
// write no progress, so each request stays in progress at its worker; the client's POST carries
// NVCF-POLL-SECONDS: 1 (so the worker answers 202 after a second), then polls with a long window.
// What holds such a request: its worker (the work item, its poll subscription, the open call to
// the inference server, the JetStream message kept alive), the replica that holds the outstanding
// poll (the client's connection, the pending entry), nats-server (the unacked message, the poll
// record, the subscription). The resident memory of every process is read at rest, then at each
// checkpoint once that many requests are held; per pending request = the growth / the count.
//
// Limits of this machine it works within: 20,000 open files per process (a hard limit that cannot
// be raised here), so requests are spread over replicas, inference servers and client processes
// of at most `perProcess` each; the worker's MAX_REQUEST_CONCURRENCY of at most 1,024, so workers
// are added until their slots cover the count.
import type { ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { startChain } from "./chain.js";
import { cpuMs, loadavg, machine, rssKiB, start } from "./harness.js";

export interface PendingBenchOptions {
  /** Pending requests to reach, in steps: the memory is read at each. */
  checkpoints: number[];
  /** Requests per replica, inference server and client process at most (open-file limit). */
  perProcess: number;
  /** Worker slots (MAX_REQUEST_CONCURRENCY, at most 1024). */
  concurrency: number;
  /** The status polls' window (NVCF-POLL-SECONDS). */
  pollSeconds: number;
  /** POSTs waiting for their 202 at most at once, per client process (halved on each 504, then regrown). */
  inflight: number;
  /** Seconds to let a checkpoint settle before reading memory and CPU. */
  settleSeconds: number;
  /** Give up reaching a checkpoint after this many seconds. */
  rampTimeoutSeconds: number;
  /**
   * MiB of memory the machine must keep available (MemAvailable) for everyone else: no step is
   * started that would go below it by the figures measured so far, and a ramp stops when it does.
   */
  memoryFloorMiB: number;
}

/** The kernel's estimate of memory available without swapping, in MiB. */
function memAvailableMiB(): number {
  const m = /^MemAvailable:\s+(\d+)/m.exec(readFileSync("/proc/meminfo", "utf8"));
  return m ? Number(m[1]) / 1024 : NaN;
}

interface Counts {
  started: number;
  posting: number;
  polling: number;
  repolls: number;
  ended: number;
  errors: number;
  postTimeouts: number;
  statuses: Record<string, number>;
  errorSamples: string[];
}

const dist = join(import.meta.dirname, "..");
const WORKER_UID = 60_999;

export async function benchPending(o: PendingBenchOptions): Promise<Record<string, unknown>> {
  const steps = [...o.checkpoints].sort((a, b) => a - b);
  const most = steps[steps.length - 1];
  // replicas, inference servers and clients are sized for the largest step; workers are added per step
  const replicas = Math.max(1, Math.ceil(most / o.perProcess));
  const workersFor = (n: number) => Math.max(1, Math.ceil(n / o.concurrency));
  const asRoot = process.getuid?.() === 0;
  const t0 = Date.now();
  const chain = await startChain({
    workers: workersFor(steps[0]),
    concurrency: o.concurrency,
    inferenceUrl: "/slow",
    replicas,
    inferenceServers: replicas,
    startBatch: 4,
    ...(asRoot ? { workerUid: WORKER_UID } : {}),
  });
  const startedS = (Date.now() - t0) / 1000;
  const clients: Array<{ proc: ChildProcess; counts: Counts | undefined }> = [];
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  try {
    for (const r of chain.replicas) {
      const [host, port] = r.address.split(":");
      const u = new URL(r.url);
      const proc = await start(
        "pending-client",
        process.execPath,
        [
          join(dist, "bench", "pending-client.js"),
          JSON.stringify({
            host,
            port: Number(port),
            path: `${u.pathname}?seconds=7200&progressMs=7200000`,
            key: chain.key,
            inflight: o.inflight,
            pollSeconds: o.pollSeconds,
          }),
        ],
        {},
        { ipc: true },
      );
      const c: (typeof clients)[number] = { proc, counts: undefined };
      proc.on("message", (m: { type: string; counts?: Counts }) => {
        if (m.type === "counts") c.counts = m.counts;
      });
      clients.push(c);
    }
    const roles = (): Record<string, number[]> => ({
      replicas: chain.replicas.map((r) => r.proc.pid!),
      workers: chain.workers.map((w) => w.pid!),
      nats: [chain.nats.pid!],
      proxy: [chain.proxy.pid!],
      inference: chain.inference.map((i) => i.proc.pid!),
      clients: clients.map((c) => c.proc.pid!),
    });
    /** Each process's resident memory once it was up and settled, holding nothing. */
    const baseline = new Map<number, number>();
    const settleBaseline = async () => {
      await sleep(o.settleSeconds * 1000);
      for (const ps of Object.values(roles()))
        for (const p of ps) if (!baseline.has(p)) baseline.set(p, rssKiB(p));
    };
    const byRole = (f: (pid: number) => number) =>
      Object.fromEntries(Object.entries(roles()).map(([k, ps]) => [k, ps.reduce((s, p) => s + f(p), 0)]));
    const mib = (x: Record<string, number>) =>
      Object.fromEntries(Object.entries(x).map(([k, v]) => [k, Math.round(v / 1024)]));
    const sum = (f: (c: Counts) => number) => clients.reduce((s, c) => s + (c.counts ? f(c.counts) : 0), 0);
    const errorSamples = () => clients.flatMap((c) => c.counts?.errorSamples ?? []).slice(0, 5);
    const cpuPerSecond = async (seconds: number) => {
      const a = byRole(cpuMs);
      const w0 = Date.now();
      await sleep(seconds * 1000);
      const b = byRole(cpuMs);
      const dt = (Date.now() - w0) / 1000;
      return Object.fromEntries(Object.keys(a).map((k) => [k, Math.round((b[k] - a[k]) / dt)]));
    };
    await settleBaseline();
    const idleRss = byRole((p) => baseline.get(p) ?? 0);
    const idle = {
      rssMiB: mib(idleRss),
      perProcessMiB: Object.fromEntries(
        Object.entries(idleRss).map(([k, v]) => [k, Math.round(v / 1024 / roles()[k].length)]),
      ),
      cpuMsPerSecond: await cpuPerSecond(5),
    };
    const workerIdleMiB = idle.perProcessMiB.workers;
    const checkpoints: Array<Record<string, unknown>> = [];
    let reached = 0;
    let stoppedBecause = "";
    // before any figure is measured: a guess on the high side of what a pending request holds in all
    // the chain's processes, checked against the first step's figures
    let allKiBPerPending = 200;
    for (const wanted of steps) {
      // a step that would leave the machine less than the floor is cut to what fits, and is the last
      const newWorkers = workersFor(wanted) - chain.workers.length;
      const need = (n: number) =>
        Math.max(0, workersFor(n) - chain.workers.length) * workerIdleMiB +
        ((n - reached) * allKiBPerPending) / 1024;
      let n = wanted;
      const room = memAvailableMiB() - o.memoryFloorMiB;
      if (need(n) > room) {
        n = reached;
        for (let x = reached + 1000; x < wanted && need(x) <= room; x += 1000) n = x;
        stoppedBecause = `step ${wanted} would need about ${Math.round(need(wanted))} MiB more memory; ${Math.round(memAvailableMiB())} MiB were available and ${o.memoryFloorMiB} MiB are left for the machine's other users`;
        if (n <= reached) break;
      }
      if (newWorkers > 0) {
        await chain.addWorkers(workersFor(n) - chain.workers.length);
        await settleBaseline();
      }
      clients.forEach((c, i) =>
        c.proc.send({
          type: "target",
          count: Math.floor(n / clients.length) + (i < n % clients.length ? 1 : 0),
        }),
      );
      const rampStart = Date.now();
      const from = sum((c) => c.polling);
      let timedOut = false;
      let memoryStop = false;
      for (;;) {
        await sleep(1000);
        if (sum((c) => c.polling) >= n) break;
        if (sum((c) => c.errors) > Math.max(100, n / 100))
          throw new Error(
            `more than 1% of the pending requests failed (${sum((c) => c.errors)}); first ones: ${errorSamples().join(" | ")}`,
          );
        if (memAvailableMiB() < o.memoryFloorMiB) {
          // hold what is held: no more requests are started
          for (const c of clients) c.proc.send({ type: "target", count: c.counts?.polling ?? 0 });
          memoryStop = true;
          stoppedBecause = `the machine's available memory fell below ${o.memoryFloorMiB} MiB during the step to ${n}`;
          await sleep(3000);
          break;
        }
        if (Date.now() - rampStart > o.rampTimeoutSeconds * 1000) {
          timedOut = true;
          stoppedBecause = `the step to ${n} did not complete within ${o.rampTimeoutSeconds} s`;
          break;
        }
      }
      const rampS = (Date.now() - rampStart) / 1000;
      await sleep(o.settleSeconds * 1000);
      const cpuMsPerSecond = await cpuPerSecond(10);
      const held = sum((c) => c.polling);
      const rss = byRole(rssKiB);
      const base = byRole((p) => baseline.get(p) ?? 0);
      const growth = Object.fromEntries(Object.keys(rss).map((k) => [k, rss[k] - base[k]]));
      const per = (k: string[], of: Record<string, number>) =>
        Math.round((k.reduce((s, x) => s + of[x], 0) * 10) / Math.max(1, held)) / 10;
      const holders = ["replicas", "workers"];
      allKiBPerPending = Math.max(
        50,
        per(["replicas", "workers", "nats", "proxy", "inference", "clients"], growth) * 1.2,
      );
      checkpoints.push({
        target: n,
        held,
        reachedTarget: !timedOut && !memoryStop,
        workers: chain.workers.length,
        rampSeconds: Math.round(rampS),
        rampPerSecond: Math.round((held - from) / rampS),
        rssMiB: mib(rss),
        growthMiB: mib(growth),
        /** Growth over each process's resting size, per pending request. */
        perPendingKiB: {
          replicasAndWorkers: per(holders, growth),
          replicas: per(["replicas"], growth),
          workers: per(["workers"], growth),
          nats: per(["nats"], growth),
          proxy: per(["proxy"], growth),
          inferenceServers: per(["inference"], growth),
          clients: per(["clients"], growth),
        },
        /** The whole resident size of replicas and workers (their resting size too), per pending request. */
        allInKiBPerPending: per(holders, rss),
        cpuMsPerSecond,
        cpuUsPerSecondPerPending: Object.fromEntries(
          Object.entries(cpuMsPerSecond).map(([k, v]) => [
            k,
            Math.round((v * 1000 * 10) / Math.max(1, held)) / 10,
          ]),
        ),
        memAvailableMiB: Math.round(memAvailableMiB()),
        errors: sum((c) => c.errors),
        errorSamples: errorSamples(),
        postTimeouts: sum((c) => c.postTimeouts),
        repolls: sum((c) => c.repolls),
        loadavg: loadavg(),
      });
      reached = held;
      console.log(
        `  pending ${held} of ${n} (step ${Math.round(rampS)} s, ${chain.workers.length} workers): replicas+workers ${per(holders, growth)} KiB per pending request over their resting size; ${Math.round(memAvailableMiB())} MiB available`,
      );
      if (timedOut || memoryStop || n < wanted) break;
    }
    return {
      benchmark: "pending",
      machine: machine(),
      options: o,
      layout: {
        replicas,
        inferenceServers: replicas,
        clientProcesses: clients.length,
        workerConcurrency: o.concurrency,
        workersAs: asRoot ? `uid ${WORKER_UID}` : "this user",
        chainStartSeconds: Math.round(startedS),
      },
      idle,
      checkpoints,
      reached,
      ...(stoppedBecause ? { stoppedBecause } : {}),
      statuses: clients.reduce<Record<string, number>>((acc, c) => {
        for (const [k, v] of Object.entries(c.counts?.statuses ?? {})) acc[k] = (acc[k] ?? 0) + v;
        return acc;
      }, {}),
    };
  } finally {
    for (const c of clients) if (c.proc.exitCode === null) c.proc.send({ type: "stop" });
    chain.close();
  }
}
