// A grpc.health.v1.Health/Check call over node:http2, for the worker's readiness check of an
// inference server whose function's health protocol is gRPC.
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { connect, constants as h2, type IncomingHttpHeaders } from "node:http2";
import {
  HealthCheckRequestSchema,
  HealthCheckResponseSchema,
  HealthCheckResponse_ServingStatus as Serving,
} from "../../gen/grpc/health/v1/health_pb.js";
import { decodeGrpcMessage, frameGrpcMessage } from "../../lib/grpc/index.js";
import { formatHostPort } from "../../lib/net/index.js";

/** Resolves when the server says SERVING; rejects with what it said (or why it could not be asked). */
export function grpcHealthCheck(
  host: string,
  port: number,
  opts: { service?: string; timeoutMs: number; signal?: AbortSignal },
): Promise<void> {
  return new Promise((resolve, reject) => {
    const authority = formatHostPort({ host, port });
    const session = connect(`http://${authority}`);
    const done = (err?: Error) => {
      clearTimeout(timer);
      session.destroy();
      if (err) reject(err);
      else resolve();
    };
    const timer = setTimeout(() => done(new Error(`no answer within ${opts.timeoutMs} ms`)), opts.timeoutMs);
    opts.signal?.addEventListener("abort", () => done(new Error("aborted")), { once: true });
    session.on("error", (err: Error) => done(err));
    const req = session.request({
      [h2.HTTP2_HEADER_METHOD]: "POST",
      [h2.HTTP2_HEADER_PATH]: "/grpc.health.v1.Health/Check",
      "content-type": "application/grpc",
      te: "trailers",
    });
    req.on("error", (err: Error) => done(err));
    const chunks: Buffer[] = [];
    let status: string | undefined;
    let message = "";
    const read = (h: IncomingHttpHeaders) => {
      const s = h["grpc-status"];
      const m = h["grpc-message"];
      if (typeof s === "string") status = s;
      if (typeof m === "string") message = decodeGrpcMessage(m);
    };
    req.on("response", read);
    req.on("trailers", read);
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (status !== "0") {
        done(new Error(`grpc-status ${status ?? "(none)"}${message ? `: ${message}` : ""}`));
        return;
      }
      const body = Buffer.concat(chunks);
      try {
        const r = fromBinary(HealthCheckResponseSchema, body.subarray(5, 5 + body.readUInt32BE(1)));
        if (r.status === Serving.SERVING) done();
        else done(new Error(`status ${Serving[r.status] ?? r.status}, not SERVING`));
      } catch (err) {
        done(new Error(`an unreadable health answer: ${(err as Error).message}`));
      }
    });
    req.end(
      frameGrpcMessage(
        toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, { service: opts.service ?? "" })),
      ),
    );
  });
}
