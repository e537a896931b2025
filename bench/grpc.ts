// `npm run bench -- grpc`: gRPC through callplane (client → grpc-proxy → callback proxy → the
// worker's tunnel → worker → the example gRPC server, all real processes on loopback, the path
// `npm start` sets up) against the same calls made straight to the example server, in one run.
// Unary 1 KiB calls are driven by h2load (C, so the load generator costs little CPU of the two
// cores): one call at a time (latency), one connection with many concurrent calls, and many
// connections (each one a session of its own: its own worker tunnel). Streaming MB/s both ways is
// measured with @grpc/grpc-js (the same client both ways, so the ratio is the path's), and so is a
// unary call carrying 32 MiB each way (`largeUnary`: seconds per call and CPU per call by process).
import { create, toBinary } from "@bufbuild/protobuf";
import { Metadata, credentials, makeGenericClientConstructor } from "@grpc/grpc-js";
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Echo, EchoMessageSchema, type EchoMessage } from "../src/gen/callplane/examples/echo_pb.js";
import { frameGrpcMessage, grpcDefinition, rawUnary, UNLIMITED_MESSAGES } from "../src/lib/grpc/index.js";
import { startChain } from "./chain.js";
import { requireTools } from "./tools.js";
import { cpuMs, machine, median, medianOf } from "./harness.js";

export interface GrpcBenchOptions {
  seconds: number;
  /** Concurrent calls on the one connection. */
  streams: number;
  /** Connections (sessions) in the many-connections run, and calls in flight on each. */
  connections: number;
  perConnection: number;
  /** Streaming: messages of 1 MiB each way. */
  streamMiB: number;
  /** Rounds of every measurement; the figures are their medians. */
  rounds: number;
  /** Large unary: one message of this many MiB each way (default 32), `largeCalls` calls timed (default 3). */
  largeMiB?: number;
  largeCalls?: number;
}

interface H2Result {
  rps: number;
  p50: number;
  p99: number;
  succeeded: number;
  failed: number;
}

function h2load(
  dir: string,
  name: string,
  target: string,
  headers: Record<string, string>,
  o: { clients: number; streams: number; seconds: number },
): Promise<H2Result> {
  const body = join(dir, "unary-1k.bin");
  const log = join(dir, `h2load-${name}.log`);
  const args = [
    "-c",
    String(o.clients),
    "-m",
    String(o.streams),
    "-D",
    String(o.seconds),
    "--warm-up-time=1",
    "-d",
    body,
    "--log-file",
    log,
    ...Object.entries({ "content-type": "application/grpc", te: "trailers", ...headers }).flatMap(
      ([k, v]) => ["-H", `${k}: ${v}`],
    ),
    `http://${target}/callplane.examples.Echo/Unary`,
  ];
  return new Promise((resolve, reject) => {
    const p = spawn("h2load", args, { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    p.stdout.on("data", (d: Buffer) => (out += d.toString()));
    p.stderr.on("data", (d: Buffer) => (out += d.toString()));
    p.on("error", reject);
    p.on("close", () => {
      const rps = Number(/finished in [\d.]+\w+, ([\d.]+) req\/s/.exec(out)?.[1] ?? NaN);
      const m = /requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed/.exec(out);
      const times = readFileSync(log, "utf8")
        .split("\n")
        .filter(Boolean)
        .map((l) => Number(l.split("\t")[2]) / 1000)
        .sort((a, b) => a - b);
      const q = (x: number) =>
        Math.round(times[Math.min(times.length - 1, Math.floor(times.length * x))] * 1000) / 1000;
      if (!m || !times.length) {
        reject(new Error(`h2load ${name} gave no figures:\n${out}`));
        return;
      }
      resolve({ rps, p50: q(0.5), p99: q(0.99), succeeded: Number(m[1]), failed: Number(m[2]) });
    });
  });
}

const EchoClient = makeGenericClientConstructor(grpcDefinition(Echo), "Echo");

/** MB/s of `mib` 1 MiB messages up (ClientStream) and down (ServerStream), on one connection. */
async function streaming(
  target: string,
  md: Record<string, string>,
  mib: number,
): Promise<{ up: number; down: number }> {
  const client = new EchoClient(
    target,
    credentials.createInsecure(),
    UNLIMITED_MESSAGES,
  ) as unknown as Record<
    string,
    (...a: unknown[]) => {
      write(m: EchoMessage): boolean;
      end(): void;
      once(e: string, f: () => void): void;
      on(e: string, f: (x: unknown) => void): void;
    }
  > & { close(): void };
  const meta = new Metadata();
  for (const [k, v] of Object.entries(md)) meta.set(k, v);
  const chunk = create(EchoMessageSchema, { payload: Buffer.alloc(1 << 20, 7) });
  try {
    // (the first call also brings the session up; it is not timed)
    await new Promise<void>((resolve, reject) =>
      client.Unary(create(EchoMessageSchema, { payload: Buffer.from("x") }), meta, (err: Error | null) =>
        err ? reject(err) : resolve(),
      ),
    );
    let t0 = performance.now();
    await new Promise<void>((resolve, reject) => {
      const call = client.ClientStream(meta, (err: Error | null) => (err ? reject(err) : resolve()));
      void (async () => {
        for (let i = 0; i < mib; i++)
          if (!call.write(chunk)) await new Promise<void>((r) => call.once("drain", r));
        call.end();
      })();
    });
    const up = (mib * 1.048576) / ((performance.now() - t0) / 1000);
    t0 = performance.now();
    await new Promise<void>((resolve, reject) => {
      const call = client.ServerStream(
        create(EchoMessageSchema, { payload: chunk.payload, repeat: mib }),
        meta,
      );
      call.on("data", () => undefined);
      call.on("error", (e) => reject(e instanceof Error ? e : new Error(String(e))));
      call.on("end", () => resolve());
    });
    const down = (mib * 1.048576) / ((performance.now() - t0) / 1000);
    return { up: Math.round(up), down: Math.round(down) };
  } finally {
    client.close();
  }
}

const LARGE_CLIENT_WINDOW = 4 * 1024 * 1024;

/**
 * Seconds per unary call carrying one `mib` MiB message each way (the median of `calls` calls, one
 * at a time, on one connection), and the CPU milliseconds each process spent per call: a large
 * message shows the HTTP/2 windows of every hop (a window smaller than the path's bandwidth-delay
 * product stalls each hop in turn) and any per-frame copy.
 */
export async function largeUnary(
  target: string,
  md: Record<string, string>,
  mib: number,
  calls: number,
  pids: Record<string, number>,
): Promise<{ seconds: number; MBps: number; cpuMsPerCall: Record<string, number> }> {
  const client = new EchoClient(target, credentials.createInsecure(), {
    ...UNLIMITED_MESSAGES,
    // grpc-js's own 64 KiB windows would make this client the bottleneck on every path (a direct
    // 32 MiB call took 1.1 s with them, 0.5 s with 4 MiB); grpcio and grpc-go widen theirs to the
    // path's bandwidth-delay product, so the client here is given a window of that order
    "grpc-node.flow_control_window": LARGE_CLIENT_WINDOW,
  }) as unknown as {
    Unary(m: EchoMessage, md: Metadata, cb: (err: Error | null, r?: EchoMessage) => void): void;
    close(): void;
  };
  const meta = new Metadata();
  for (const [k, v] of Object.entries(md)) meta.set(k, v);
  const call = (payload: Uint8Array) =>
    new Promise<number>((resolve, reject) =>
      client.Unary(create(EchoMessageSchema, { payload }), meta, (err, r) =>
        err ? reject(err) : resolve(r?.payload.length ?? 0),
      ),
    );
  try {
    // a small call brings the session up and one large call warms every hop; neither is timed
    await call(Buffer.from("x"));
    const big = Buffer.alloc(mib << 20, 7);
    await call(big);
    const times: number[] = [];
    const before = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, cpuMs(pid)]));
    for (let i = 0; i < calls; i++) {
      const t0 = performance.now();
      const n = await call(big);
      times.push((performance.now() - t0) / 1000);
      if (n !== big.length) throw new Error(`the ${mib} MiB call to ${target} came back with ${n} bytes`);
    }
    const seconds = median(times);
    return {
      seconds: Math.round(seconds * 1000) / 1000,
      // bytes each way per second
      MBps: Math.round((mib * 1.048576) / seconds),
      cpuMsPerCall: Object.fromEntries(
        Object.entries(pids).map(([k, pid]) => [k, Math.round((cpuMs(pid) - before[k]) / calls)]),
      ),
    };
  } finally {
    client.close();
  }
}

export async function benchGrpc(o: GrpcBenchOptions): Promise<Record<string, unknown>> {
  requireTools("h2load");
  // every connection is a session holding a worker slot until it has been idle for 30 s: room for
  // all of them, over the three targets
  const sessions = 3 * (o.connections + 2);
  const chain = await startChain({ workers: 1, concurrency: 8, grpc: { workers: 1, concurrency: sessions } });
  try {
    const g = chain.grpc!;
    const md = { authorization: `Bearer ${chain.key}`, "function-id": g.functionId };
    writeFileSync(
      join(chain.dir, "unary-1k.bin"),
      frameGrpcMessage(
        toBinary(EchoMessageSchema, create(EchoMessageSchema, { payload: Buffer.alloc(1024, 1) })),
      ),
    );
    // a first call each way shows the path works (h2load sees HTTP statuses, not grpc-status)
    for (const target of [g.direct, g.target, g.inCluster]) {
      const r = await rawUnary(
        target,
        "/callplane.examples.Echo/Unary",
        Buffer.from([0x0a, 2, 0x68, 0x69]),
        md,
        30_000,
      );
      if (r.response.toString("latin1") !== "\n\x02hi")
        throw new Error(`the check call to ${target} came back wrong`);
    }
    const pids = {
      "grpc-proxy": g.proc.pid!,
      proxy: chain.proxy.pid!,
      worker: g.workers[0].pid!,
      server: g.server.pid!,
    };
    type Runs = Record<string, Record<string, H2Result & { cpuMsPer1k?: Record<string, number> }>>;
    type Large = Awaited<ReturnType<typeof largeUnary>>;
    const rounds: Array<{
      unary: Runs;
      streamingMBps: Record<string, { up: number; down: number }>;
      largeUnary: Record<string, Large>;
    }> = [];
    const shapes = {
      oneAtATime: { clients: 1, streams: 1 },
      oneConnection: { clients: 1, streams: o.streams },
      manyConnections: { clients: o.connections, streams: o.perConnection },
    };
    for (let round = 0; round < Math.max(1, o.rounds); round++) {
      const runs: Runs = {};
      for (const [shape, s] of Object.entries(shapes)) {
        runs[shape] = {};
        for (const [path, target] of [
          ["direct", g.direct],
          ["callplane", g.target],
          ["inCluster", g.inCluster],
        ] as const) {
          const before = Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, cpuMs(pid)]));
          const r = await h2load(chain.dir, `${shape}-${path}`, target, md, { ...s, seconds: o.seconds });
          const calls = r.succeeded + r.failed;
          runs[shape][path] = {
            ...r,
            ...(path === "callplane"
              ? {
                  cpuMsPer1k: Object.fromEntries(
                    Object.entries(pids).map(([k, pid]) => [
                      k,
                      Math.round(((cpuMs(pid) - before[k]) / calls) * 1000 * 10) / 10,
                    ]),
                  ),
                }
              : {}),
          };
        }
      }
      const stream = {
        direct: await streaming(g.direct, md, o.streamMiB),
        callplane: await streaming(g.target, md, o.streamMiB),
        inCluster: await streaming(g.inCluster, md, o.streamMiB),
      };
      const mib = o.largeMiB ?? 32;
      const n = o.largeCalls ?? 3;
      // (the in-cluster path has a grpc-proxy of its own)
      const largePids = { ...pids, "grpc-proxy-in-cluster": g.inClusterProc.pid! };
      const large = {
        direct: await largeUnary(g.direct, md, mib, n, largePids),
        callplane: await largeUnary(g.target, md, mib, n, largePids),
        inCluster: await largeUnary(g.inCluster, md, mib, n, largePids),
      };
      rounds.push({ unary: runs, streamingMBps: stream, largeUnary: large });
    }
    // the median of each figure over the rounds; each ratio is the median of the rounds' ratios
    const runs = medianOf(rounds.map((r) => r.unary));
    const per = (f: (r: (typeof rounds)[number]) => number, digits = 100) =>
      Math.round(median(rounds.map(f)) * digits) / digits;
    const ratio = (shape: string, path = "callplane") =>
      per((r) => r.unary[shape][path].rps / r.unary[shape].direct.rps);
    const streamRatio = (way: "up" | "down", path = "callplane") =>
      per((r) => r.streamingMBps[path][way] / r.streamingMBps.direct[way]);
    return {
      benchmark: "grpc",
      machine: machine(),
      options: o,
      command: `npm run bench -- grpc --seconds ${o.seconds} --streams ${o.streams} --connections ${o.connections} --per-connection ${o.perConnection} --stream-mib ${o.streamMiB} --rounds ${o.rounds}`,
      unary: runs,
      ratio: {
        oneAtATime: ratio("oneAtATime"),
        oneConnection: ratio("oneConnection"),
        manyConnections: ratio("manyConnections"),
        streamingUp: streamRatio("up"),
        streamingDown: streamRatio("down"),
      },
      ratioInCluster: {
        oneAtATime: ratio("oneAtATime", "inCluster"),
        oneConnection: ratio("oneConnection", "inCluster"),
        manyConnections: ratio("manyConnections", "inCluster"),
        streamingUp: streamRatio("up", "inCluster"),
        streamingDown: streamRatio("down", "inCluster"),
      },
      p99Ratio: {
        oneAtATime: per((r) => r.unary.oneAtATime.callplane.p99 / r.unary.oneAtATime.direct.p99),
        oneConnection: per((r) => r.unary.oneConnection.callplane.p99 / r.unary.oneConnection.direct.p99),
        manyConnections: per(
          (r) => r.unary.manyConnections.callplane.p99 / r.unary.manyConnections.direct.p99,
        ),
      },
      addedP50ms: per((r) => r.unary.oneAtATime.callplane.p50 - r.unary.oneAtATime.direct.p50, 1000),
      streamingMBps: medianOf(rounds.map((r) => r.streamingMBps)),
      largeUnary: {
        mib: o.largeMiB ?? 32,
        calls: o.largeCalls ?? 3,
        ...medianOf(rounds.map((r) => r.largeUnary)),
        ratio: per((r) => r.largeUnary.direct.seconds / r.largeUnary.callplane.seconds),
        ratioInCluster: per((r) => r.largeUnary.direct.seconds / r.largeUnary.inCluster.seconds),
      },
      rounds,
    };
  } finally {
    chain.close();
  }
}
