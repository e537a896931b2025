// A @grpc/grpc-js service definition built from a protobuf-es service descriptor (src/gen/), so
// that the example server, the CLI, tests and benchmarks share the messages generated from proto/
// without a second code generator. (callplane's own gRPC path never parses messages.)
import {
  fromBinary,
  toBinary,
  type DescMessage,
  type DescService,
  type MessageShape,
} from "@bufbuild/protobuf";
import {
  Client,
  Metadata,
  credentials,
  type MethodDefinition,
  type ServiceDefinition,
  type ServiceError,
} from "@grpc/grpc-js";

function codec<M extends DescMessage>(schema: M) {
  return {
    serialize: (value: MessageShape<M>) => Buffer.from(toBinary(schema, value)),
    deserialize: (bytes: Buffer) => fromBinary(schema, bytes),
  };
}

/** The service's methods by their proto names (Unary, ServerStream, ...). */
export function grpcDefinition(service: DescService): ServiceDefinition {
  const def: Record<string, MethodDefinition<unknown, unknown>> = {};
  for (const m of service.methods) {
    const req = codec(m.input);
    const res = codec(m.output);
    def[m.name] = {
      path: `/${service.typeName}/${m.name}`,
      requestStream: m.methodKind === "client_streaming" || m.methodKind === "bidi_streaming",
      responseStream: m.methodKind === "server_streaming" || m.methodKind === "bidi_streaming",
      requestSerialize: req.serialize as (v: unknown) => Buffer,
      requestDeserialize: req.deserialize,
      responseSerialize: res.serialize as (v: unknown) => Buffer,
      responseDeserialize: res.deserialize,
      originalName: m.name,
    };
  }
  return def;
}

/** Channel options for messages of any size (grpc-js refuses messages over 4 MiB by default). */
export const UNLIMITED_MESSAGES = {
  "grpc.max_receive_message_length": -1,
  "grpc.max_send_message_length": -1,
} as const;

export interface RawUnaryResult {
  response: Buffer;
  headers: Metadata;
  trailers: Metadata;
}

/**
 * One unary call of any method with the message as bytes (no .proto needed): what the demo and the
 * CLI do. Rejects with grpc-js's ServiceError (code, details, metadata).
 */
export function rawUnary(
  target: string,
  path: string,
  request: Uint8Array,
  metadata: Record<string, string>,
  deadlineMs: number,
): Promise<RawUnaryResult> {
  const client = new Client(target, credentials.createInsecure(), UNLIMITED_MESSAGES);
  const md = new Metadata();
  for (const [k, v] of Object.entries(metadata)) md.set(k, v);
  return new Promise<RawUnaryResult>((resolve, reject) => {
    let headers = new Metadata();
    let trailers = new Metadata();
    let response: Buffer | undefined;
    let failure: ServiceError | undefined;
    const call = client.makeUnaryRequest(
      path,
      (b: Uint8Array) => Buffer.from(b),
      (b: Buffer) => b,
      request,
      md,
      { deadline: Date.now() + deadlineMs },
      (err: ServiceError | null, value?: Buffer) => {
        failure = err ?? undefined;
        response = value;
      },
    );
    call.on("metadata", (m: Metadata) => (headers = m));
    call.on("status", (st: { metadata: Metadata }) => {
      trailers = st.metadata;
      // the callback has run by now (grpc-js calls it before 'status')
      setImmediate(() => (failure ? reject(failure) : resolve({ response: response!, headers, trailers })));
    });
  }).finally(() => client.close());
}
