// The example gRPC inference server used by the demo (demo-grpc), the tests and the benchmark,
// on @grpc/grpc-js: grpc.health.v1.Health and callplane.examples.Echo (proto/callplane/examples):
//   Unary         the message back (after delay_ms)
//   ServerStream  `repeat` messages (default 1), `delay_ms` apart
//   ClientStream  one message whose payload is every payload received, concatenated
//   Bidi          each message back as it comes (after delay_ms)
// Metadata: `x-echo-status: <code>` ends the call with that gRPC status (message "x-echo-status
// asked for <code>", trailing metadata x-echo-error: yes); `x-echo-meta: v` comes back as initial
// metadata `x-echo-meta-received: v`, and the W3C `traceparent` the server got (the worker's span,
// with tracing on) as `x-echo-traceparent`; every answer ends with trailing metadata `x-echo-trailer: done`.
// It counts calls that their client cancelled (stats.cancelled). Listens on --listen host:port or
// INFERENCE_HOST:INFERENCE_PORT (default 127.0.0.1:8000).
import { create } from "@bufbuild/protobuf";
import {
  Metadata,
  Server,
  ServerCredentials,
  status,
  type ServerDuplexStream,
  type ServerReadableStream,
  type ServerUnaryCall,
  type ServerWritableStream,
  type sendUnaryData,
} from "@grpc/grpc-js";
import { Echo, EchoMessageSchema, type EchoMessage } from "../src/gen/callplane/examples/echo_pb.js";
import {
  Health,
  HealthCheckResponseSchema,
  HealthCheckResponse_ServingStatus as Serving,
  type HealthCheckRequest,
  type HealthCheckResponse,
} from "../src/gen/grpc/health/v1/health_pb.js";
import { UNLIMITED_MESSAGES, grpcDefinition } from "../src/lib/grpc/index.js";

/** calls, cancelled calls, and ServerStream messages handed to grpc-js (flow-control tests watch it). */
export const stats = { calls: 0, cancelled: 0, streamed: 0 };

const SERVICES = new Set(["", "callplane.examples.Echo"]);

type AnyCall = { metadata: Metadata; sendMetadata(m: Metadata): void; on(e: string, f: () => void): unknown };

/** The asked-for error, or undefined. */
function askedError(call: AnyCall): { code: number; details: string; metadata: Metadata } | undefined {
  const raw = call.metadata.get("x-echo-status")[0];
  if (raw === undefined) return undefined;
  const code = Number(raw);
  const metadata = new Metadata();
  metadata.set("x-echo-error", "yes");
  return {
    code: Number.isInteger(code) && code > 0 && code <= 16 ? code : status.UNKNOWN,
    details: `x-echo-status asked for ${String(raw)}`,
    metadata,
  };
}

function begin(call: AnyCall): void {
  stats.calls++;
  // grpc-js emits 'cancelled' for a call its client reset (or whose deadline passed) before the end
  call.on("cancelled", () => void stats.cancelled++);
  const m = new Metadata();
  const echo = call.metadata.get("x-echo-meta")[0];
  if (echo !== undefined) m.set("x-echo-meta-received", String(echo));
  const traceparent = call.metadata.get("traceparent")[0];
  if (traceparent !== undefined) m.set("x-echo-traceparent", String(traceparent));
  call.sendMetadata(m);
}

function trailer(): Metadata {
  const t = new Metadata();
  t.set("x-echo-trailer", "done");
  return t;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const echo = {
  Unary(call: ServerUnaryCall<EchoMessage, EchoMessage>, cb: sendUnaryData<EchoMessage>) {
    begin(call);
    const err = askedError(call);
    void (async () => {
      if (call.request.delayMs) await sleep(call.request.delayMs);
      // a call whose client left (or whose deadline passed) meanwhile is over: grpc-js would throw
      // "write after end" for its answer
      if (call.cancelled) return;
      if (err) cb(err);
      else cb(null, create(EchoMessageSchema, { payload: call.request.payload }), trailer());
    })();
  },
  ServerStream(call: ServerWritableStream<EchoMessage, EchoMessage>) {
    // an asked-for error goes out before any metadata: a trailers-only answer
    const err = askedError(call);
    if (err) {
      stats.calls++;
      call.emit("error", err);
      return;
    }
    begin(call);
    void (async () => {
      const n = call.request.repeat || 1;
      for (let i = 0; i < n && !call.cancelled; i++) {
        if (i > 0 && call.request.delayMs) await sleep(call.request.delayMs);
        if (call.cancelled) break;
        stats.streamed++;
        if (!call.write(create(EchoMessageSchema, { payload: call.request.payload }))) {
          await new Promise((r) => call.once("drain", r));
        }
      }
      if (!call.cancelled) call.end(trailer());
    })();
  },
  ClientStream(call: ServerReadableStream<EchoMessage, EchoMessage>, cb: sendUnaryData<EchoMessage>) {
    begin(call);
    const err = askedError(call);
    const parts: Uint8Array[] = [];
    call.on("data", (m: EchoMessage) => parts.push(m.payload));
    call.on("end", () => {
      if (call.cancelled) return;
      if (err) cb(err);
      else cb(null, create(EchoMessageSchema, { payload: Buffer.concat(parts) }), trailer());
    });
  },
  Bidi(call: ServerDuplexStream<EchoMessage, EchoMessage>) {
    // an asked-for error goes out before any metadata: a trailers-only answer
    const err = askedError(call);
    if (err) {
      stats.calls++;
      call.emit("error", err);
      return;
    }
    begin(call);
    let chain = Promise.resolve();
    call.on("data", (m: EchoMessage) => {
      chain = chain.then(async () => {
        if (m.delayMs) await sleep(m.delayMs);
        if (!call.cancelled) call.write(create(EchoMessageSchema, { payload: m.payload }));
      });
    });
    call.on("end", () => void chain.then(() => !call.cancelled && call.end(trailer())));
  },
};

const health = {
  Check(
    call: ServerUnaryCall<HealthCheckRequest, HealthCheckResponse>,
    cb: sendUnaryData<HealthCheckResponse>,
  ) {
    if (!SERVICES.has(call.request.service)) {
      cb({ code: status.NOT_FOUND, details: `unknown service ${call.request.service}` });
      return;
    }
    cb(null, create(HealthCheckResponseSchema, { status: Serving.SERVING }));
  },
  Watch(call: ServerWritableStream<HealthCheckRequest, HealthCheckResponse>) {
    call.write(
      create(HealthCheckResponseSchema, {
        status: SERVICES.has(call.request.service) ? Serving.SERVING : Serving.SERVICE_UNKNOWN,
      }),
    );
  },
};

/** Starts the server; resolves with its port. */
export async function startGrpcExample(
  host: string,
  port: number,
): Promise<{ server: Server; port: number }> {
  const server = new Server(UNLIMITED_MESSAGES);
  server.addService(grpcDefinition(Echo), echo);
  server.addService(grpcDefinition(Health), health);
  const bound = await new Promise<number>((resolve, reject) =>
    server.bindAsync(
      `${host.includes(":") ? `[${host}]` : host}:${port}`,
      ServerCredentials.createInsecure(),
      (err, p) => (err ? reject(err) : resolve(p)),
    ),
  );
  return { server, port: bound };
}

function listenAddress(): { host: string; port: number } {
  const i = process.argv.indexOf("--listen");
  if (i !== -1) {
    const [host, port] = process.argv[i + 1].split(":");
    return { host, port: Number(port) };
  }
  return {
    host: process.env.INFERENCE_HOST ?? "127.0.0.1",
    port: Number(process.env.INFERENCE_PORT ?? 8000),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { host, port } = listenAddress();
  startGrpcExample(host, port).then(
    ({ server, port: bound }) => {
      console.log(JSON.stringify({ msg: "example gRPC server listening", host, port: bound }));
      const stop = () => server.tryShutdown(() => process.exit(0));
      process.on("SIGTERM", stop);
      process.on("SIGINT", stop);
    },
    (err: unknown) => {
      console.error(JSON.stringify({ msg: "example gRPC server failed to start", err: String(err) }));
      process.exit(1);
    },
  );
}
