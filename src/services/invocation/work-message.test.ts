import assert from "node:assert/strict";
import { test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { WorkerInvokeFunctionRequestSchema } from "../../gen/nvcf/worker_pb.js";
import { encodeWorkMessage, type WorkMessageFields } from "./work-message.js";

/** The same message through protobuf-es, as the invocation service built it before. */
function reference(f: WorkMessageFields): Uint8Array {
  return toBinary(
    WorkerInvokeFunctionRequestSchema,
    create(WorkerInvokeFunctionRequestSchema, {
      requestId: f.requestId,
      ncaId: f.ncaId,
      subject: f.subject,
      maxDirectResponseSizeBytes: f.maxDirectResponseSizeBytes,
      requestTime: timestampFromMs(f.requestTimeMs),
      ...(f.requestBody && f.requestBody.length ? { requestBody: f.requestBody } : {}),
      requestHeaders: f.requestHeaders.map((h) => ({ key: h.key, value: h.value })),
      requestMethod: f.requestMethod,
      requestPath: f.requestPath,
      statelessConfig: {
        connectionConfigs: [
          {
            config: {
              case: "http1Config",
              value: {
                targetURI: f.http1.targetURI,
                ...(f.http1.proxyURI !== undefined ? { proxyURI: f.http1.proxyURI } : {}),
                responseAuthorizationToken: f.http1.responseAuthorizationToken,
                ...(f.http1.requestAuthorizationToken !== undefined
                  ? { requestAuthorizationToken: f.http1.requestAuthorizationToken }
                  : {}),
              },
            },
          },
        ],
      },
    }),
  );
}

const base: WorkMessageFields = {
  requestId: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
  ncaId: "nca-1",
  subject: "key-subject",
  maxDirectResponseSizeBytes: 5 * 1024 * 1024,
  requestTimeMs: 1_764_666_000_123,
  requestBody: Buffer.alloc(1024, "x"),
  requestHeaders: [
    { key: "Content-Type", value: "application/octet-stream" },
    { key: "NVCF-POLL-SECONDS", value: "60" },
  ],
  requestMethod: "POST",
  requestPath: "/echo?x=1",
  http1: {
    targetURI: "http://127-0-1-2.invocation.nvcf.svc.cluster.local:8080",
    proxyURI: undefined,
    responseAuthorizationToken: "tok-response",
    requestAuthorizationToken: undefined,
  },
};

const cases: Array<[string, Partial<WorkMessageFields>]> = [
  ["a 1 KiB body, no proxy, no request token", {}],
  [
    "through the proxy, with a request token",
    {
      http1: {
        ...base.http1,
        proxyURI: "https://invocation.worker.callplane.test:10084",
        requestAuthorizationToken: "tok-request",
      },
    },
  ],
  ["no body (a status poll)", { requestBody: undefined, requestMethod: "GET" }],
  ["an empty body", { requestBody: Buffer.alloc(0) }],
  ["a body past two varint bytes", { requestBody: Buffer.alloc(40_000, 7) }],
  ["a body of 127 and 128 bytes", { requestBody: Buffer.alloc(128, 1) }],
  ["a time on a whole second", { requestTimeMs: 1_764_666_000_000 }],
  ["empty strings and an empty header", { ncaId: "", subject: "", requestHeaders: [{ key: "", value: "" }] }],
  ["an empty header value", { requestHeaders: [{ key: "X-Empty", value: "" }] }],
  [
    "non-ASCII header values and path",
    { requestHeaders: [{ key: "X-Name", value: "Zoë 🚀" }], requestPath: "/é" },
  ],
  ["no headers", { requestHeaders: [] }],
  [
    "an empty optional proxy and token",
    { http1: { ...base.http1, proxyURI: "", requestAuthorizationToken: "" } },
  ],
  [
    "many headers",
    { requestHeaders: Array.from({ length: 300 }, (_, i) => ({ key: `X-H${i}`, value: "v".repeat(i) })) },
  ],
];

for (const [name, change] of cases) {
  test(`the hand-encoded work message is byte for byte protobuf-es's: ${name}`, () => {
    const f = { ...base, ...change };
    const mine = encodeWorkMessage(f);
    assert.deepEqual(Buffer.from(mine), Buffer.from(reference(f)));
    // and it decodes to the fields given
    const back = fromBinary(WorkerInvokeFunctionRequestSchema, mine);
    assert.equal(back.requestId, f.requestId);
    assert.equal(back.requestPath, f.requestPath);
    assert.deepEqual(
      back.requestHeaders.map((h) => ({ key: h.key, value: h.value })),
      f.requestHeaders.map((h) => ({ key: h.key, value: h.value })),
    );
  });
}
