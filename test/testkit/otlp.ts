// A small OTLP/HTTP receiver for tests, on 127.0.0.1:0: it takes POST /v1/traces with an OTLP/JSON
// body (what @opentelemetry/exporter-trace-otlp-http sends), answers 200 {}, and keeps every span
// it got, decoded (lib/tracing's SpanRecord), for the test to read. Stopped when the test ends.
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import type { TestContext } from "node:test";
import { decodeTraces, type SpanRecord } from "../../src/lib/tracing/index.js";

export interface OtlpReceiver {
  /** The traces endpoint, http://127.0.0.1:<port>/v1/traces. */
  endpoint: string;
  /** Every span received so far. */
  spans(): SpanRecord[];
  /** Export requests that were not OTLP/JSON traces (a test expects none). */
  refused: number;
}

export async function startOtlpReceiver(t: Pick<TestContext, "after">): Promise<OtlpReceiver> {
  const spans: SpanRecord[] = [];
  const receiver: OtlpReceiver = { endpoint: "", spans: () => [...spans], refused: 0 };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const json =
        req.method === "POST" && req.url === "/v1/traces" && /json/.test(req.headers["content-type"] ?? "");
      if (!json) {
        receiver.refused++;
        res.writeHead(415, { "content-type": "application/json" }).end('{"error":"OTLP/JSON only"}');
        return;
      }
      try {
        spans.push(...decodeTraces(JSON.parse(Buffer.concat(chunks).toString("utf8"))));
      } catch {
        receiver.refused++;
        res.writeHead(400).end();
        return;
      }
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  receiver.endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/traces`;
  return receiver;
}
