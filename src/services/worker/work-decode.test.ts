import assert from "node:assert/strict";
import { test } from "node:test";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { WorkerInvokeFunctionRequestSchema } from "../../gen/nvcf/worker_pb.js";
import { decodeWorkMessage } from "./work-decode.js";

const http1 = (value: Record<string, string>) => ({
  connectionConfigs: [{ config: { case: "http1Config" as const, value } }],
});

const messages: Array<[string, Parameters<typeof create<typeof WorkerInvokeFunctionRequestSchema>>[1]]> = [
  [
    "an HTTP request with a body, through the proxy",
    {
      requestId: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
      ncaId: "nca",
      subject: "sub",
      maxDirectResponseSizeBytes: 5 * 1024 * 1024,
      requestTime: timestampFromMs(1_764_666_000_123),
      requestBody: Buffer.alloc(40_000, 3),
      requestHeaders: [
        { key: "Content-Type", value: "application/json" },
        { key: "X-Name", value: "Zoë 🚀" },
        { key: "X-Empty", value: "" },
      ],
      requestMethod: "POST",
      requestPath: "/echo?x=1",
      statelessConfig: http1({
        targetURI: "http://127-0-1-2.invocation.nvcf.svc.cluster.local:8080",
        proxyURI: "https://invocation.worker.callplane.test:10084",
        responseAuthorizationToken: "r",
        requestAuthorizationToken: "q",
      }),
    },
  ],
  [
    "a status poll (no body, no request token, empty optional proxy)",
    {
      requestId: "id",
      requestTime: timestampFromMs(1_764_666_000_000),
      requestMethod: "GET",
      statelessConfig: http1({ targetURI: "http://t:1", responseAuthorizationToken: "r", proxyURI: "" }),
    },
  ],
  ["an empty message", {}],
  ["an empty body", { requestBody: new Uint8Array(0), statelessConfig: { connectionConfigs: [] } }],
  [
    "a gRPC session (statefulConfig: read by fromBinary)",
    {
      requestId: "g",
      statefulConfig: {
        nvcfRegionOfInvoker: "r",
        connectionConfigs: [{ config: { case: "http1Config", value: { proxyAuthorizationToken: "t" } } }],
      },
    },
  ],
  ["fields the fast reader does not know", { largeResponseUrl: "u", directResponseUrl: "d", requestId: "x" }],
  ["a time before 1970", { requestTime: timestampFromMs(-1500) }],
];

for (const [name, init] of messages) {
  test(`a work message reads as fromBinary() reads it: ${name}`, () => {
    const bytes = toBinary(
      WorkerInvokeFunctionRequestSchema,
      create(WorkerInvokeFunctionRequestSchema, init),
    );
    assert.deepEqual(decodeWorkMessage(bytes), fromBinary(WorkerInvokeFunctionRequestSchema, bytes));
  });
}

test("a message cut short fails as fromBinary() fails", () => {
  const bytes = toBinary(
    WorkerInvokeFunctionRequestSchema,
    create(WorkerInvokeFunctionRequestSchema, { requestId: "abcdef", requestPath: "/p" }),
  );
  const cut = bytes.subarray(0, bytes.length - 1);
  assert.throws(() => fromBinary(WorkerInvokeFunctionRequestSchema, cut));
  assert.throws(() => decodeWorkMessage(cut));
});
