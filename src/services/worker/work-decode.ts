// Reading a work message (nvcf.WorkerInvokeFunctionRequest) by hand. protobuf-es's fromBinary()
// builds the message by reflection over its schema (a zero message first, then each field through
// the reflection layer): profiled under load, a twentieth of the worker's CPU per request. The
// messages the invocation service sends (an HTTP request: statelessConfig) are read here in one
// pass into the same shape fromBinary() returns (work-decode.test.ts checks that); anything else
// (a gRPC session's statefulConfig, fields this reader does not know, a field repeated that
// protobuf would merge) is handed to fromBinary(), which stays the reference.
import { fromBinary } from "@bufbuild/protobuf";
import {
  StatelessConfigSchema,
  StatelessConnectionConfigSchema,
  StatelessHTTP1ConfigSchema,
  StringKVSchema,
  WorkerInvokeFunctionRequestSchema,
  type StatelessHTTP1Config,
  type StringKV,
} from "../../gen/nvcf/worker_pb.js";
import { TimestampSchema } from "@bufbuild/protobuf/wkt";
import type { WorkRequest } from "./inference-call.js";

/** The reader met something only fromBinary() handles. */
class Fallback extends Error {}
const FALLBACK = new Fallback();

class Reader {
  pos: number;
  constructor(
    readonly buf: Buffer,
    start: number,
    readonly end: number,
  ) {
    this.pos = start;
  }

  varint(): number {
    let n = 0;
    let mul = 1;
    for (let i = 0; i < 8; i++) {
      if (this.pos >= this.end) throw FALLBACK;
      const b = this.buf[this.pos++];
      n += (b & 0x7f) * mul;
      if (b < 0x80) return n;
      mul *= 128;
    }
    // past 2^56: nothing this reader expects
    throw FALLBACK;
  }

  /** The bounds of a length-delimited field's payload; the reader moves past it. */
  span(): [number, number] {
    const len = this.varint();
    const start = this.pos;
    const end = start + len;
    if (end > this.end) throw FALLBACK;
    this.pos = end;
    return [start, end];
  }

  string(): string {
    const [s, e] = this.span();
    return this.buf.toString("utf8", s, e);
  }

  sub(): Reader {
    const [s, e] = this.span();
    return new Reader(this.buf, s, e);
  }
}

const LEN = 2;
const VARINT = 0;

function stringKV(r: Reader): StringKV {
  let key = "";
  let value = "";
  while (r.pos < r.end) {
    const tag = r.varint();
    if (tag === ((1 << 3) | LEN)) key = r.string();
    else if (tag === ((2 << 3) | LEN)) value = r.string();
    else throw FALLBACK;
  }
  return { $typeName: StringKVSchema.typeName, key, value };
}

function http1Config(r: Reader): StatelessHTTP1Config {
  const out: StatelessHTTP1Config = {
    $typeName: StatelessHTTP1ConfigSchema.typeName,
    targetURI: "",
    responseAuthorizationToken: "",
  };
  while (r.pos < r.end) {
    const tag = r.varint();
    if (tag === ((1 << 3) | LEN)) out.proxyURI = r.string();
    else if (tag === ((2 << 3) | LEN)) out.targetURI = r.string();
    else if (tag === ((3 << 3) | LEN)) out.responseAuthorizationToken = r.string();
    else if (tag === ((4 << 3) | LEN)) out.requestAuthorizationToken = r.string();
    else throw FALLBACK;
  }
  return out;
}

function statelessConfig(r: Reader): NonNullable<WorkRequest["statelessConfig"]> {
  const out: NonNullable<WorkRequest["statelessConfig"]> = {
    $typeName: StatelessConfigSchema.typeName,
    connectionConfigs: [],
  };
  while (r.pos < r.end) {
    if (r.varint() !== ((1 << 3) | LEN)) throw FALLBACK;
    const c = r.sub();
    // one http1Config (a oneof given twice would be merged by protobuf: left to fromBinary)
    if (c.varint() !== ((1 << 3) | LEN)) throw FALLBACK;
    const value = http1Config(c.sub());
    if (c.pos !== c.end) throw FALLBACK;
    out.connectionConfigs.push({
      $typeName: StatelessConnectionConfigSchema.typeName,
      config: { case: "http1Config", value },
    });
  }
  return out;
}

function timestamp(r: Reader): NonNullable<WorkRequest["requestTime"]> {
  let seconds = 0;
  let nanos = 0;
  while (r.pos < r.end) {
    const tag = r.varint();
    if (tag === ((1 << 3) | VARINT)) seconds = r.varint();
    else if (tag === ((2 << 3) | VARINT)) nanos = r.varint();
    else throw FALLBACK;
  }
  // (negative values are ten-byte varints: the reader hands those to fromBinary)
  return { $typeName: TimestampSchema.typeName, seconds: BigInt(seconds), nanos };
}

function fastDecode(data: Uint8Array): WorkRequest {
  const buf = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  const r = new Reader(buf, 0, buf.length);
  const out: WorkRequest = {
    $typeName: WorkerInvokeFunctionRequestSchema.typeName,
    requestId: "",
    ncaId: "",
    subject: "",
    largeResponseUrl: "",
    maxDirectResponseSizeBytes: 0,
    inputAssetReference: [],
    directResponseUrl: "",
    requestHeaders: [],
    requestMethod: "",
    requestPath: "",
  };
  while (r.pos < r.end) {
    const tag = r.varint();
    switch (tag) {
      case (1 << 3) | LEN:
        out.requestId = r.string();
        break;
      case (2 << 3) | LEN:
        out.ncaId = r.string();
        break;
      case (3 << 3) | LEN:
        out.subject = r.string();
        break;
      case (5 << 3) | VARINT: {
        const n = r.varint();
        if (n > 0xffffffff) throw FALLBACK;
        out.maxDirectResponseSizeBytes = n;
        break;
      }
      case (8 << 3) | LEN:
        if (out.requestTime) throw FALLBACK;
        out.requestTime = timestamp(r.sub());
        break;
      case (10 << 3) | LEN: {
        const [s, e] = r.span();
        // a view of the message, as fromBinary() returns it
        out.requestBody = data.subarray(s, e);
        break;
      }
      case (13 << 3) | LEN:
        out.requestHeaders.push(stringKV(r.sub()));
        break;
      case (14 << 3) | LEN:
        out.requestMethod = r.string();
        break;
      case (15 << 3) | LEN:
        out.requestPath = r.string();
        break;
      case (18 << 3) | LEN:
        if (out.statelessConfig) throw FALLBACK;
        out.statelessConfig = statelessConfig(r.sub());
        break;
      default:
        throw FALLBACK;
    }
  }
  return out;
}

/** The work message in `data`, as fromBinary() reads it. */
export function decodeWorkMessage(data: Uint8Array): WorkRequest {
  try {
    return fastDecode(data);
  } catch (err) {
    if (err !== FALLBACK) throw err;
    return fromBinary(WorkerInvokeFunctionRequestSchema, data);
  }
}
