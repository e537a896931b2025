// Benchmark: server-sent events as fast as the reader takes them, through the whole chain. The
// function's inference path is the example server's /sse route in burst mode (intervalMs=0: it
// writes events until its socket is full, then waits for drain), each event padded to
// `eventBytes`; the client is curl with Accept: text/event-stream, reading until the last event.
// Three paths in one run, as in the stream benchmark: straight to the example server, callplane
// with workers calling the replica's pod address, and callplane through the callback proxy (what
// `npm start` sets up). Per process: peak resident memory during the transfer (VmHWM, reset before).
import { spawn } from "node:child_process";
import { startChain } from "./chain.js";
import { machine, median } from "./harness.js";
import { withFootprint } from "./stream.js";
import { requireTools } from "./tools.js";

export interface SseBenchOptions {
  /** MiB of events per transfer. */
  mib: number;
  rounds: number;
  /** Padding of each event's data, in bytes. */
  eventBytes: number;
}

interface SseTransfer {
  status: number;
  bytes: number;
  seconds: number;
  mbPerSec: number;
}

function curlSse(url: string, headers: Record<string, string>): Promise<SseTransfer> {
  return new Promise((resolve, reject) => {
    const args = ["-sN", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{time_total}"];
    for (const [k, v] of Object.entries({ ...headers, accept: "text/event-stream" }))
      args.push("-H", `${k}: ${v}`);
    args.push("-X", "POST", "--data-binary", "{}", url);
    const p = spawn("curl", args, { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    p.stdout.on("data", (d: Buffer) => (out += d.toString()));
    p.on("error", reject);
    p.on("close", () => {
      const [status, bytes, seconds] = out.trim().split(" ").map(Number);
      resolve({ status, bytes, seconds, mbPerSec: Math.round((bytes / 1e6 / seconds) * 10) / 10 });
    });
  });
}

export async function benchSse(o: SseBenchOptions): Promise<Record<string, unknown>> {
  requireTools("curl");
  const chain = await startChain({ workers: 1, concurrency: 8, inferenceUrl: "/sse" });
  try {
    // an event is `id: N\ndata: {"i":N,"at":T,"pad":"x…"}\n\n`: the padding and about 50 bytes
    const events = Math.max(1, Math.round((o.mib * 2 ** 20) / (o.eventBytes + 50)));
    const query = (n: number) => `?events=${n}&intervalMs=0&bytes=${o.eventBytes}`;
    const auth = { authorization: `Bearer ${chain.key}`, "content-type": "application/json" };
    const paths = {
      echo: { url: `${chain.echo.url}/sse`, headers: { "content-type": "application/json" } },
      directCallbacks: { url: chain.direct.url, headers: auth },
      viaProxy: { url: chain.viaProxy.url, headers: auth },
    } as const;
    // warm up: the key cache, the pools, the JIT
    for (const p of Object.values(paths)) await curlSse(p.url + query(2000), p.headers);
    const rows: Record<
      string,
      { runs: SseTransfer[]; peakRssMiB: Record<string, number[]>; peakGrowthMiB: Record<string, number[]> }
    > = {};
    for (let round = 0; round < Math.max(1, o.rounds); round++)
      for (const [name, p] of Object.entries(paths)) {
        const roles =
          name === "echo"
            ? { echo: [chain.echo.proc.pid!] }
            : chain.roles(name as "viaProxy" | "directCallbacks");
        const { result: t, footprint } = await withFootprint(roles, () =>
          curlSse(p.url + query(events), p.headers),
        );
        if (t.status !== 200 || t.bytes < events * o.eventBytes)
          throw new Error(`sse ${name}: status ${t.status}, ${t.bytes} bytes for ${events} events`);
        const row = (rows[name] ??= { runs: [], peakRssMiB: {}, peakGrowthMiB: {} });
        row.runs.push(t);
        for (const [role, v] of Object.entries(footprint.peakRssMiB)) (row.peakRssMiB[role] ??= []).push(v);
        for (const [role, v] of Object.entries(footprint.peakGrowthMiB))
          (row.peakGrowthMiB[role] ??= []).push(v);
      }
    const results = Object.fromEntries(
      Object.entries(rows).map(([name, r]) => [
        name,
        {
          mbPerSec: median(r.runs.map((t) => t.mbPerSec)),
          runs: r.runs.map((t) => t.mbPerSec),
          bytes: r.runs[0].bytes,
          peakRssMiB: Object.fromEntries(Object.entries(r.peakRssMiB).map(([k, v]) => [k, Math.max(...v)])),
          peakGrowthMiB: Object.fromEntries(
            Object.entries(r.peakGrowthMiB).map(([k, v]) => [k, Math.max(...v)]),
          ),
        },
      ]),
    );
    const ratio = (a: string, b: string) =>
      Math.round(median(rows[a].runs.map((t, i) => t.mbPerSec / rows[b].runs[i].mbPerSec)) * 100) / 100;
    return {
      benchmark: "sse",
      machine: machine(),
      options: o,
      events,
      results,
      ratios: {
        viaProxyVsEcho: ratio("viaProxy", "echo"),
        directCallbacksVsEcho: ratio("directCallbacks", "echo"),
      },
    };
  } finally {
    chain.close();
  }
}
