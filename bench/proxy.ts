// Benchmark: the worker callback proxy (HAProxy, with the configuration callplane writes: every
// check on the target, the access log, problem answers) side by side with a minimal HAProxy
// configured for the bare job (../shared/reference/baselines/haproxy-callback-proxy.cfg: TLS
// frontend, path and host rules, TLS to the pod verified against the CA and the pod name, per-pod
// connection reuse) and the direct path (straight to the pod), in one run. Load from wrk, with absolute-form
// forward-proxy requests. Reports requests/s and p50/p99 for small callbacks, MB/s for large
// streamed bodies, and each proxy's CPU time per request.
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createCa, issueServerCert } from "../src/lib/tls/index.js";
import { ensureTool, requireTools } from "./tools.js";
import {
  treeCpuMs as cpuMs,
  freePort,
  machine,
  median,
  medianOf,
  procs,
  start,
  wrk,
  type WrkResult,
} from "./harness.js";

const dist = join(import.meta.dirname, "..");
const POD = "127-0-0-1.invocation.nvcf.svc.cluster.local";
const PATH = "/v2/nvcf/worker/request-attach";

/** One path's figures in one scenario: wrk's, and the CPU the proxy spent per request. */
export type ProxyResult = WrkResult & { cpuUsPerRequest?: number };

export interface ProxyBenchOptions {
  seconds: number;
  connections: number;
  largeBytes: number;
  rounds: number;
}

export async function benchProxy(o: ProxyBenchOptions): Promise<Record<string, unknown>> {
  requireTools("wrk", "haproxy");
  const dir = mkdtempSync(join(tmpdir(), "callplane-bench-proxy-"));
  try {
    const ca = await createCa("bench CA");
    const pod = await issueServerCert(ca, [POD]);
    const front = await issueServerCert(ca, ["*.worker.callplane.test", "worker.callplane.test"]);
    const pki = join(dir, "pki");
    mkdirSync(join(pki, "proxy"), { recursive: true });
    writeFileSync(join(pki, "ca.crt"), ca.certPem);
    writeFileSync(join(pki, "ca.key"), ca.keyPem, { mode: 0o600 });
    writeFileSync(join(pki, "proxy", "tls.crt"), front.certPem);
    writeFileSync(join(pki, "proxy", "tls.key"), front.keyPem, { mode: 0o600 });
    writeFileSync(join(dir, "pod.crt"), pod.certPem);
    writeFileSync(join(dir, "pod.key"), pod.keyPem, { mode: 0o600 });
    writeFileSync(join(dir, "front.pem"), `${front.certPem.trim()}\n${front.keyPem.trim()}\n`, {
      mode: 0o600,
    });

    // a script of bench/ as its own process, which says when it is ready
    const startScript = (name: string, script: string, args: string[]) =>
      start(name, process.execPath, [join(dist, "bench", script), ...args], {}, { ipc: true });
    const podPort = await freePort();
    const podProc = await startScript("pod", "pod-server.js", [
      `127.0.0.1:${podPort}`,
      join(dir, "pod.crt"),
      join(dir, "pod.key"),
    ]);

    const cpPort = await freePort();
    const cp = await start(
      "callback-proxy",
      process.execPath,
      [join(dist, "src", "services", "callback-proxy", "main.js")],
      {
        CALLPLANE__GLOBAL__DATA_DIR: dir,
        CALLPLANE__PKI__DIR: pki,
        CALLPLANE__LOG__LEVEL: "info",
        CALLPLANE__WORKER_CALLBACK_PROXY__LISTEN: `127.0.0.1:${cpPort}`,
        CALLPLANE__WORKER_CALLBACK_PROXY__METRICS_LISTEN: `127.0.0.1:${await freePort()}`,
        CALLPLANE__WORKER_CALLBACK_PROXY__POD_NETWORKS: '["127.0.0.0/24"]',
        CALLPLANE__WORKER_CALLBACK_PROXY__INVOCATION__WORKER_TLS_PORT: String(podPort),
      },
      { ipc: true },
    );
    // the access log is part of the proxy's job; it goes to a file as in production
    const haPort = await freePort();
    const haCfg = join(dir, "haproxy.cfg");
    writeFileSync(
      haCfg,
      [
        "global",
        "  maxconn 4000",
        "  nbthread 1",
        "defaults",
        "  mode http",
        "  timeout connect 5s",
        "  timeout client 60s",
        "  timeout server 60s",
        "  http-reuse always",
        "frontend worker_callback",
        `  bind 127.0.0.1:${haPort} ssl crt ${join(dir, "front.pem")} alpn http/1.1`,
        "  acl pod_host req.hdr(host),field(1,:) -m reg ^[0-9]{1,3}-[0-9]{1,3}-[0-9]{1,3}-[0-9]{1,3}\\.invocation\\.nvcf\\.svc\\.cluster\\.local$",
        `  acl cb_path  path ${PATH}`,
        "  http-request deny deny_status 404 unless cb_path",
        "  http-request deny deny_status 403 unless pod_host",
        "  http-request set-var(txn.podip) req.hdr(host),field(1,:),field(1,.),regsub(-,.,g)",
        "  http-request set-dst var(txn.podip)",
        `  http-request set-dst-port int(${podPort})`,
        "  default_backend pods",
        "backend pods",
        `  server pod 0.0.0.0:0 ssl verify required ca-file ${join(pki, "ca.crt")} sni req.hdr(host),field(1,:) pool-max-conn 256`,
        "",
      ].join("\n"),
    );
    const haproxy = ensureTool("haproxy") as string;
    const check = spawnSync(haproxy, ["-c", "-f", haCfg], { encoding: "utf8" });
    if (check.status !== 0) throw new Error(`haproxy -c failed: ${check.stdout}${check.stderr}`);
    const ha = await start("haproxy", haproxy, ["-db", "-f", haCfg], {});
    await new Promise((r) => setTimeout(r, 500));

    // the floor Node's own TLS streams set: a byte pipe with no HTTP in it (bench/tls-pipe.ts)
    const pipePort = await freePort();
    const pipe = await startScript("tls-pipe", "tls-pipe.js", [
      `127.0.0.1:${pipePort}`,
      `127.0.0.1:${podPort}`,
      POD,
      join(pki, "proxy", "tls.crt"),
      join(pki, "proxy", "tls.key"),
      join(pki, "ca.crt"),
    ]);

    const scripts = {
      small: join(dir, "small.lua"),
      largeDown: join(dir, "large-down.lua"),
      largeUp: join(dir, "large-up.lua"),
    };
    const target = `http://${POD}:${podPort}${PATH}`;
    const lua = (path: string, method: string, headers: Record<string, string>, body: string) =>
      `wrk.method = "${method}"\nwrk.path = "${path}"\n${Object.entries(headers)
        .map(([k, v]) => `wrk.headers["${k}"] = "${v}"`)
        .join("\n")}\n${body ? `wrk.body = string.rep("x", ${body})` : ""}\n`;
    const variants = (abs: boolean) => ({
      small: lua(
        abs ? target : PATH,
        "POST",
        {
          Host: `${POD}:${podPort}`,
          Authorization: "Bearer bench",
          "Content-Type": "application/octet-stream+h1",
        },
        "100",
      ),
      largeDown: lua(
        abs ? target : PATH,
        "GET",
        { Host: `${POD}:${podPort}`, Authorization: "Bearer bench", "x-bench-bytes": String(o.largeBytes) },
        "",
      ),
      largeUp: lua(
        abs ? target : PATH,
        "POST",
        {
          Host: `${POD}:${podPort}`,
          Authorization: "Bearer bench",
          "Content-Type": "application/octet-stream+h1",
        },
        String(o.largeBytes),
      ),
    });
    const paths = {
      direct: { url: `https://127.0.0.1:${podPort}`, abs: false, pid: undefined as number | undefined },
      haproxy: { url: `https://127.0.0.1:${haPort}`, abs: true, pid: ha.pid },
      callplane: { url: `https://127.0.0.1:${cpPort}`, abs: true, pid: cp.pid },
      nodeTlsPipe: { url: `https://127.0.0.1:${pipePort}`, abs: true, pid: pipe.pid },
    };
    // every round's figures: round → scenario → path
    const rounds: Array<Record<string, Record<string, ProxyResult>>> = [];
    // warm up every path (TLS session caches, JIT, connection pools)
    for (const [name, p] of Object.entries(paths)) {
      const s = join(dir, `warm-${name}.lua`);
      writeFileSync(s, variants(p.abs).small);
      await wrk(p.url, s, { seconds: 2, connections: 8 });
    }
    for (let round = 0; round < o.rounds; round++) {
      const results: Record<string, Record<string, ProxyResult>> = { small: {}, largeDown: {}, largeUp: {} };
      rounds.push(results);
      for (const scenario of ["small", "largeDown", "largeUp"] as const) {
        if (process.env.CALLPLANE_BENCH_ONLY && process.env.CALLPLANE_BENCH_ONLY !== scenario) continue;
        for (const [name, p] of Object.entries(paths)) {
          if (process.env.CALLPLANE_BENCH_PATH && process.env.CALLPLANE_BENCH_PATH !== name) continue;
          const s = join(dir, `${scenario}-${name}.lua`);
          writeFileSync(s, variants(p.abs)[scenario]);
          const before = p.pid ? cpuMs(p.pid) : 0;
          const r = await wrk(p.url, s, {
            seconds: o.seconds,
            connections: scenario === "small" ? o.connections : 8,
          });
          const cpu = p.pid ? ((cpuMs(p.pid) - before) * 1000) / Math.max(1, r.requests) : undefined;
          results[scenario][name] = {
            ...r,
            ...(cpu !== undefined ? { cpuUsPerRequest: Math.round(cpu) } : {}),
          };
        }
      }
    }
    void podProc;
    void scripts;
    // the median of each figure over the rounds; each ratio is the median of the rounds' ratios
    const results: Record<string, Record<string, ProxyResult>> = {};
    for (const scenario of ["small", "largeDown", "largeUp"])
      for (const name of Object.keys(paths)) {
        const runs = rounds.map((r) => r[scenario]?.[name]).filter((x): x is ProxyResult => x !== undefined);
        if (runs.length) (results[scenario] ??= {})[name] = medianOf(runs);
      }
    const vsHaproxy = (
      scenario: string,
      path: string,
      metric: "rps" | "mbPerSec" | "cpuUsPerRequest" | "p99ms",
    ) => {
      const xs = rounds
        .map((r) => {
          const a = r[scenario]?.[path]?.[metric];
          const b = r[scenario]?.haproxy?.[metric];
          return a === undefined || b === undefined ? NaN : a / b;
        })
        .filter(Number.isFinite);
      return xs.length ? Math.round(median(xs) * 100) / 100 : undefined;
    };
    const vsDirect = (scenario: string, path: string, metric: "rps" | "mbPerSec") => {
      const xs = rounds
        .map((r) => {
          const a = r[scenario]?.[path]?.[metric];
          const b = r[scenario]?.direct?.[metric];
          return a === undefined || b === undefined ? NaN : a / b;
        })
        .filter(Number.isFinite);
      return xs.length ? Math.round(median(xs) * 100) / 100 : undefined;
    };
    return {
      benchmark: "proxy",
      machine: machine(),
      options: o,
      results,
      rounds,
      ratiosVsDirect: {
        small: {
          haproxy: vsDirect("small", "haproxy", "rps"),
          callplane: vsDirect("small", "callplane", "rps"),
        },
        largeDown: {
          haproxy: vsDirect("largeDown", "haproxy", "mbPerSec"),
          callplane: vsDirect("largeDown", "callplane", "mbPerSec"),
        },
        largeUp: {
          haproxy: vsDirect("largeUp", "haproxy", "rps"),
          callplane: vsDirect("largeUp", "callplane", "rps"),
        },
      },
      ratios: {
        smallRpsVsHaproxy: vsHaproxy("small", "callplane", "rps"),
        largeDownMBsVsHaproxy: vsHaproxy("largeDown", "callplane", "mbPerSec"),
        largeUpRpsVsHaproxy: vsHaproxy("largeUp", "callplane", "rps"),
        // the same ratios for the bare Node TLS byte pipe: the ceiling for a proxy built on node:tls
        nodeTlsPipeLargeDownMBsVsHaproxy: vsHaproxy("largeDown", "nodeTlsPipe", "mbPerSec"),
        nodeTlsPipeLargeUpRpsVsHaproxy: vsHaproxy("largeUp", "nodeTlsPipe", "rps"),
        nodeTlsPipeSmallRpsVsHaproxy: vsHaproxy("small", "nodeTlsPipe", "rps"),
        smallCpuVsHaproxy: vsHaproxy("small", "callplane", "cpuUsPerRequest"),
        smallP99VsHaproxy: vsHaproxy("small", "callplane", "p99ms"),
        largeDownCpuVsHaproxy: vsHaproxy("largeDown", "callplane", "cpuUsPerRequest"),
      },
    };
  } finally {
    for (const p of procs) if (p.exitCode === null) p.kill("SIGTERM");
    await new Promise((r) => setTimeout(r, 300));
    rmSync(dir, { recursive: true, force: true });
  }
}
