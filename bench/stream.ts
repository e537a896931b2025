// Benchmark: one large body through the whole chain and back (client → replica → callback proxy →
// worker → echo server, and the echo back the same way), the shape that collapsed while a 1 MiB
// proxy benchmark looked fine. Three paths in one run: straight to the echo server, callplane with
// workers calling the replica's pod address (in-cluster), and callplane through the callback proxy
// (what `npm start` sets up). The client is curl (not ours), uploading a sparse file and counting
// what comes back. For each process of the chain, the peak resident memory during the transfer
// over its size just before it (the kernel's VmHWM, reset before each run).
import { spawn } from "node:child_process";
import { closeSync, openSync, ftruncateSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { startChain } from "./chain.js";
import { requireTools } from "./tools.js";
import { cpuMs, machine, median, resetPeak, rssKiB } from "./harness.js";

export interface StreamBenchOptions {
  mib: number;
  rounds: number;
  /** Upload with chunked framing (a body of unknown length) rather than a Content-Length. */
  chunked: boolean;
}

interface Transfer {
  bytes: number;
  seconds: number;
  mbPerSecEachWay: number;
  status: number;
}

/**
 * curl uploads `bytes` and counts what comes back. With `pipe`, the body comes from a pipe (curl
 * -T -, chunked, in the few-KiB pieces a pipe delivers: what a user streaming a body sends, and
 * the shape that once collapsed); otherwise from a sparse file with a Content-Length.
 */
function curlEcho(
  url: string,
  body: { pipe: true; bytes: number } | { pipe: false; file: string },
  headers: Record<string, string>,
): Promise<Transfer> {
  return new Promise((resolve, reject) => {
    const args = ["-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_total}"];
    for (const [k, v] of Object.entries(headers)) args.push("-H", `${k}: ${v}`);
    args.push("-X", "POST", "-T", body.pipe ? "-" : body.file, url);
    const p = body.pipe
      ? spawn("bash", ["-c", `head -c ${body.bytes} /dev/zero | exec curl "$@"`, "curl", ...args], {
          stdio: ["ignore", "pipe", "inherit"],
        })
      : spawn("curl", args, { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    p.stdout.on("data", (d: Buffer) => (out += d.toString()));
    p.on("error", reject);
    p.on("close", () => {
      const [status, bytes, seconds] = out.trim().split(" ").map(Number);
      resolve({
        status,
        bytes,
        seconds,
        mbPerSecEachWay: Math.round((bytes / 1e6 / seconds) * 10) / 10,
      });
    });
  });
}

/** Per process role: the peak resident size during a transfer, its growth over the size before, CPU ms. */
export interface TransferFootprint {
  peakRssMiB: Record<string, number>;
  peakGrowthMiB: Record<string, number>;
  cpuMs: Record<string, number>;
}

/**
 * Runs `transfer` and reads, for each process by role, its peak resident memory during it (the
 * kernel's VmHWM, reset just before), that peak over its size just before, and the CPU it used.
 */
export async function withFootprint<T>(
  roles: Record<string, number[]>,
  transfer: () => Promise<T>,
): Promise<{ result: T; footprint: TransferFootprint }> {
  const pids = Object.entries(roles).flatMap(([role, ps]) => ps.map((pid) => ({ role, pid })));
  const idle = new Map(pids.map(({ pid }) => [pid, rssKiB(pid, "VmRSS")]));
  const cpu0 = new Map(pids.map(({ pid }) => [pid, cpuMs(pid)]));
  for (const { pid } of pids) resetPeak(pid);
  const result = await transfer();
  const footprint: TransferFootprint = { peakRssMiB: {}, peakGrowthMiB: {}, cpuMs: {} };
  for (const { role, pid } of pids) {
    const peak = rssKiB(pid, "VmHWM");
    footprint.peakRssMiB[role] = Math.max(footprint.peakRssMiB[role] ?? 0, Math.round(peak / 1024));
    footprint.peakGrowthMiB[role] = Math.max(
      footprint.peakGrowthMiB[role] ?? 0,
      Math.round(Math.max(0, peak - idle.get(pid)!) / 1024),
    );
    footprint.cpuMs[role] = (footprint.cpuMs[role] ?? 0) + cpuMs(pid) - cpu0.get(pid)!;
  }
  return { result, footprint };
}

export async function benchStream(o: StreamBenchOptions): Promise<Record<string, unknown>> {
  requireTools("curl");
  const chain = await startChain({ workers: 1, concurrency: 8 });
  try {
    const file = join(chain.dir, "body.bin");
    const fd = openSync(file, "w");
    ftruncateSync(fd, o.mib * 2 ** 20);
    closeSync(fd);
    // chunked from a pipe by default: the shape of a client streaming a body of unknown length,
    // which makes every hop stream (no Content-Length anywhere on the way back)
    const body = o.chunked
      ? ({ pipe: true, bytes: o.mib * 2 ** 20 } as const)
      : ({ pipe: false, file } as const);
    const auth = {
      authorization: `Bearer ${chain.key}`,
      "content-type": "application/octet-stream",
      "nvcf-poll-seconds": "3600",
    };
    const paths = {
      echo: {
        url: `${chain.echo.url}/echo`,
        headers: { "content-type": "application/octet-stream" },
      },
      directCallbacks: { url: chain.direct.url, headers: auth },
      viaProxy: { url: chain.viaProxy.url, headers: auth },
    } as const;
    // warm up: the key cache, the pools, the JIT
    for (const p of Object.values(paths)) {
      const small = join(chain.dir, "warm.bin");
      writeFileSync(small, Buffer.alloc(4 * 2 ** 20));
      await curlEcho(p.url, { pipe: false, file: small }, p.headers);
    }
    type Row = {
      transfers: Transfer[];
      peakRssMiB: Record<string, number[]>;
      peakGrowthMiB: Record<string, number[]>;
      cpuMsPerMiB: Record<string, number[]>;
    };
    const rows: Record<string, Row> = {};
    for (let round = 0; round < o.rounds; round++) {
      for (const [name, p] of Object.entries(paths)) {
        const roles =
          name === "echo"
            ? { echo: [chain.echo.proc.pid!] }
            : chain.roles(name as "viaProxy" | "directCallbacks");
        const { result: t, footprint } = await withFootprint(roles, () => curlEcho(p.url, body, p.headers));
        if (t.status !== 200 || t.bytes !== o.mib * 2 ** 20)
          throw new Error(`${name}: status ${t.status}, ${t.bytes} of ${o.mib * 2 ** 20} bytes came back`);
        const row = (rows[name] ??= { transfers: [], peakRssMiB: {}, peakGrowthMiB: {}, cpuMsPerMiB: {} });
        row.transfers.push(t);
        for (const role of Object.keys(roles)) {
          (row.peakRssMiB[role] ??= []).push(footprint.peakRssMiB[role]);
          (row.peakGrowthMiB[role] ??= []).push(footprint.peakGrowthMiB[role]);
          (row.cpuMsPerMiB[role] ??= []).push(Math.round((footprint.cpuMs[role] / o.mib) * 100) / 100);
        }
      }
    }
    const summary = Object.fromEntries(
      Object.entries(rows).map(([name, r]) => [
        name,
        {
          mbPerSecEachWay: median(r.transfers.map((t) => t.mbPerSecEachWay)),
          runs: r.transfers.map((t) => t.mbPerSecEachWay),
          peakRssMiB: Object.fromEntries(Object.entries(r.peakRssMiB).map(([k, v]) => [k, Math.max(...v)])),
          peakGrowthMiB: Object.fromEntries(
            Object.entries(r.peakGrowthMiB).map(([k, v]) => [k, Math.max(...v)]),
          ),
          cpuMsPerMiB: Object.fromEntries(Object.entries(r.cpuMsPerMiB).map(([k, v]) => [k, median(v)])),
        },
      ]),
    ) as Record<
      string,
      {
        mbPerSecEachWay: number;
        runs: number[];
        peakRssMiB: Record<string, number>;
        peakGrowthMiB: Record<string, number>;
        cpuMsPerMiB: Record<string, number>;
      }
    >;
    // the median over the rounds of each round's ratio (the two paths measured back to back)
    const ratio = (a: string, b: string) =>
      Math.round(
        median(rows[a].transfers.map((t, i) => t.mbPerSecEachWay / rows[b].transfers[i].mbPerSecEachWay)) *
          100,
      ) / 100;
    return {
      benchmark: "stream",
      machine: machine(),
      options: o,
      results: summary,
      ratios: {
        viaProxyVsEcho: ratio("viaProxy", "echo"),
        viaProxyVsDirectCallbacks: ratio("viaProxy", "directCallbacks"),
        directCallbacksVsEcho: ratio("directCallbacks", "echo"),
      },
    };
  } finally {
    chain.close();
  }
}
