// Benchmark: one large body through the whole chain and back (client → replica → callback proxy →
// worker → echo server, and the echo back the same way), the shape that collapsed while a 1 MiB
// proxy benchmark looked fine. Three paths in one run: straight to the echo server, callplane with
// workers calling the replica's pod address (in-cluster), and callplane through the callback proxy
// (what `npm start` sets up). The client is curl (not ours), uploading a sparse file and counting
// what comes back. For each process of the chain, the peak resident memory during the transfer
// over its size just before it (the kernel's VmHWM, reset before each run).
import { spawn } from "node:child_process";
import { closeSync, openSync, ftruncateSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { startChain } from "./chain.js";
import { cpuMs, machine } from "./harness.js";

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

function rssKiB(pid: number, field: "VmRSS" | "VmHWM"): number {
  const m = new RegExp(`^${field}:\\s+(\\d+)`, "m").exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) : NaN;
}

/** Resets the kernel's peak-RSS mark of a process (root, or the process's owner). */
function resetPeak(pid: number): void {
  writeFileSync(`/proc/${pid}/clear_refs`, "5");
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
};

export async function benchStream(o: StreamBenchOptions): Promise<Record<string, unknown>> {
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
        const pids = Object.entries(roles).flatMap(([role, ps]) => ps.map((pid) => ({ role, pid })));
        const idle = new Map(pids.map(({ pid }) => [pid, rssKiB(pid, "VmRSS")]));
        const cpu0 = new Map(pids.map(({ pid }) => [pid, cpuMs(pid)]));
        for (const { pid } of pids) resetPeak(pid);
        const t = await curlEcho(p.url, body, p.headers);
        if (t.status !== 200 || t.bytes !== o.mib * 2 ** 20)
          throw new Error(`${name}: status ${t.status}, ${t.bytes} of ${o.mib * 2 ** 20} bytes came back`);
        const row = (rows[name] ??= { transfers: [], peakGrowthMiB: {}, cpuMsPerMiB: {} });
        row.transfers.push(t);
        for (const { role, pid } of pids) {
          const growth = Math.max(0, rssKiB(pid, "VmHWM") - idle.get(pid)!) / 1024;
          (row.peakGrowthMiB[role] ??= []).push(Math.round(growth));
          (row.cpuMsPerMiB[role] ??= []).push(
            Math.round(((cpuMs(pid) - cpu0.get(pid)!) / o.mib) * 100) / 100,
          );
        }
      }
    }
    const summary = Object.fromEntries(
      Object.entries(rows).map(([name, r]) => [
        name,
        {
          mbPerSecEachWay: median(r.transfers.map((t) => t.mbPerSecEachWay)),
          runs: r.transfers.map((t) => t.mbPerSecEachWay),
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
        peakGrowthMiB: Record<string, number>;
        cpuMsPerMiB: Record<string, number>;
      }
    >;
    const ratio = (a: number, b: number) => Math.round((a / b) * 100) / 100;
    return {
      benchmark: "stream",
      machine: machine(),
      options: o,
      results: summary,
      ratios: {
        viaProxyVsEcho: ratio(summary.viaProxy.mbPerSecEachWay, summary.echo.mbPerSecEachWay),
        viaProxyVsDirectCallbacks: ratio(
          summary.viaProxy.mbPerSecEachWay,
          summary.directCallbacks.mbPerSecEachWay,
        ),
        directCallbacksVsEcho: ratio(summary.directCallbacks.mbPerSecEachWay, summary.echo.mbPerSecEachWay),
      },
    };
  } finally {
    chain.close();
  }
}
