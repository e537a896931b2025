// `npm run bench [-- invoke] [--seconds N] [--connections N] [--workers N] [--concurrency N]`
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { cleanup, stopAll } from "./harness.js";
import { benchInvoke } from "./invoke.js";
import { benchProxy, type ProxyResult } from "./proxy.js";

function flag(name: string, def: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i === -1 ? def : Number(process.argv[i + 1]);
}

const which = process.argv[2] && !process.argv[2].startsWith("--") ? process.argv[2] : "invoke";

async function main(): Promise<void> {
  let result: Record<string, unknown>;
  if (which === "invoke") {
    result = await benchInvoke({
      seconds: flag("seconds", 10),
      connections: flag("connections", 64),
      workers: flag("workers", 1),
      concurrency: flag("concurrency", 128),
    });
    const l = result.latency as {
      direct: { p50: number; p99: number };
      callplane: { p50: number; p99: number };
      addedP50ms: number;
    };
    const t = result.throughput as {
      direct: { rps: number };
      callplane: { rps: number; errors: number; non2xx: number };
      ratio: number;
    };
    console.log(`\ninvoke benchmark (1 KiB echo), ${String(result.machine)}`);
    console.log(
      `  latency, 1 client:      direct p50 ${l.direct.p50} ms p99 ${l.direct.p99} ms | callplane p50 ${l.callplane.p50} ms p99 ${l.callplane.p99} ms | added p50 ${l.addedP50ms} ms`,
    );
    console.log(
      `  throughput, ${flag("connections", 64)} clients: direct ${Math.round(t.direct.rps)}/s | callplane ${Math.round(t.callplane.rps)}/s (errors ${t.callplane.errors}, non-2xx ${t.callplane.non2xx}) | ratio ${t.ratio}`,
    );
  } else if (which === "proxy") {
    result = await benchProxy({
      seconds: flag("seconds", 8),
      connections: flag("connections", 50),
      largeBytes: flag("large-bytes", 1024 * 1024),
      rounds: flag("rounds", 2),
    });
    const r = result.results as Record<string, Record<string, ProxyResult>>;
    const row = (scenario: string, metric: (x: ProxyResult) => string) =>
      r[scenario]
        ? ["direct", "haproxy", "callplane", "nodeTlsPipe"]
            .filter((k) => r[scenario][k])
            .map((k) => `${k} ${metric(r[scenario][k])}`)
            .join(" | ")
        : "(not run)";
    const cpuMs = (x: { cpuUsPerRequest?: number }) =>
      x.cpuUsPerRequest !== undefined ? ` cpu ${(x.cpuUsPerRequest / 1000).toFixed(1)} ms/req` : "";
    console.log(`\nproxy benchmark (TLS to the proxy, TLS to the pod), ${String(result.machine)}`);
    console.log(
      `  small callbacks (POST 100 B, ${flag("connections", 50)} connections): ${row("small", (x) => `${Math.round(x.rps)}/s p50 ${x.p50ms} ms p99 ${x.p99ms} ms${x.cpuUsPerRequest !== undefined ? ` cpu ${x.cpuUsPerRequest} us/req` : ""}${x.errors ? ` errors ${x.errors}` : ""}`)}`,
    );
    console.log(
      `  large responses (GET ${flag("large-bytes", 1024 * 1024)} B, 8 connections): ${row("largeDown", (x) => `${Math.round(x.mbPerSec)} MB/s${cpuMs(x)}${x.errors ? ` errors ${x.errors}` : ""}`)}`,
    );
    console.log(
      `  large uploads (POST ${flag("large-bytes", 1024 * 1024)} B, 8 connections): ${row("largeUp", (x) => `${Math.round((x.rps * flag("large-bytes", 1024 * 1024)) / 2 ** 20)} MB/s${cpuMs(x)}${x.errors ? ` errors ${x.errors}` : ""}`)}`,
    );
    console.log(
      "  (nodeTlsPipe: a bare node:tls byte pipe with no HTTP, no routing, no pooling: the ceiling for a proxy on Node's TLS)",
    );
    console.log(`  ratios vs HAProxy: ${JSON.stringify(result.ratios)}`);
  } else {
    throw new Error(`unknown benchmark ${which}; use invoke or proxy`);
  }
  const dir = join(import.meta.dirname, "..", "..", "bench", "results");
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${which}-${new Date().toISOString().replace(/[:.]/g, "-")}.json`);
  writeFileSync(
    file,
    `${JSON.stringify({ command: `npm run bench -- ${process.argv.slice(2).join(" ")}`.trim(), at: new Date().toISOString(), ...result }, null, 2)}\n`,
  );
  console.log(`  recorded in ${file}`);
}

main()
  .then(async () => {
    await stopAll();
    process.exit(0);
  })
  .catch((err: unknown) => {
    console.error(err);
    cleanup();
    process.exit(1);
  });
