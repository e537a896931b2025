// The call to the inference server for one work message: the client's end-to-end headers with the
// worker's own NVCF-* headers set over them, and the request body (inline bytes first, then the
// rest streamed from the replica).
import type { MessageShape } from "@bufbuild/protobuf";
import type { Readable } from "node:stream";
import type { Dispatcher, Pool } from "undici";
import type { WorkerInvokeFunctionRequestSchema } from "../../gen/nvcf/worker_pb.js";
import { endToEnd, foldPairs, prepend } from "../../lib/http/index.js";
import { traceInference, type TraceSpan } from "../../lib/tracing/index.js";
import type { CallbackClient } from "./callback.js";
import type { WorkerConfig } from "./config.js";
import type { OutputSlot } from "./output-slot.js";
import { NVCF_HEADERS } from "../../lib/contract.js";

export type WorkRequest = MessageShape<typeof WorkerInvokeFunctionRequestSchema>;

/** Headers the worker sets itself; a client's copies are dropped (contract §3.5). */
const WORKER_OWNED = new Set(
  [
    NVCF_HEADERS.reqId,
    "nvcf-sub",
    "nvcf-ncaid",
    "nvcf-function-name",
    "nvcf-function-id",
    "nvcf-function-version-id",
    "nvcf-asset-dir",
    "nvcf-large-output-dir",
    "nvcf-max-response-size-bytes",
    "nvcf-nspectid",
    "nvcf-backend",
    "nvcf-instancetype",
    "nvcf-region",
    "nvcf-env",
    "nvcf-function-asset-ids",
    NVCF_HEADERS.pollSeconds,
    "host",
  ].map((h) => h),
);

/**
 * Client headers that end at the replica. `Expect: 100-continue` was met there (the replica's HTTP
 * server sent the 100 before reading the body), and the worker already has the body in hand; undici
 * also refuses any Expect header (NotSupportedError), which made every `curl --data-binary` upload
 * over 1 MiB (curl adds the header above that size) a 502.
 */
const ENDS_AT_REPLICA = new Set(["expect"]);
const DROPPED_TO_INFERENCE = new Set([...WORKER_OWNED, ...ENDS_AT_REPLICA]);

export class WorkerError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = "WorkerError";
  }
}

/** What the inference call of one work message is made from. */
export interface InferenceCall {
  cfg: WorkerConfig;
  inference: Pool;
  callbacks: CallbackClient;
  req: WorkRequest;
  /** When the client's poll window ends (NVCF-POLL-SECONDS tells the server what is left of it). */
  deadline: number;
  /** An empty folder for NVCF-LARGE-OUTPUT-DIR, in compatibility mode only. */
  slot: OutputSlot | undefined;
  /** NVCF's compatibility mode: every request but SSE. */
  compat: boolean;
  signal: AbortSignal;
  /** The work item's span: the call is a span under it, and the server gets its traceparent. */
  trace?: TraceSpan | undefined;
}

export function inferenceHeaders(call: InferenceCall): Record<string, string | string[]> {
  const { cfg, req } = call;
  const out: Record<string, string | string[]> = foldPairs(
    endToEnd(
      req.requestHeaders,
      (h) => h.key,
      (h) => h.value,
      { drop: DROPPED_TO_INFERENCE },
    ).map((h) => [h.key, h.value] as const),
  );
  const remaining = Math.max(0, Math.floor((call.deadline - Date.now()) / 1000));
  out[NVCF_HEADERS.reqId] = req.requestId;
  out["nvcf-sub"] = req.subject;
  out["nvcf-ncaid"] = req.ncaId || cfg.ncaId;
  out["nvcf-function-name"] = cfg.functionName;
  out["nvcf-function-id"] = cfg.functionId;
  out["nvcf-function-version-id"] = cfg.functionVersionId;
  out["nvcf-instancetype"] = cfg.instanceType;
  out["nvcf-region"] = cfg.region;
  out["nvcf-backend"] = "callplane-local";
  out["nvcf-max-response-size-bytes"] = String(req.maxDirectResponseSizeBytes);
  out[NVCF_HEADERS.pollSeconds] = String(remaining);
  if (call.slot && call.compat) out["nvcf-large-output-dir"] = call.slot.dir;
  if (call.compat && out["content-type"] === undefined) out["content-type"] = "application/json";
  return out;
}

export function callInference(
  call: InferenceCall,
  targetUri: string,
  requestToken: string | undefined,
  proxyUri: string | undefined,
): Promise<Dispatcher.ResponseData> {
  const { inference, callbacks, req } = call;
  if (!req.requestMethod) {
    return Promise.reject(
      new WorkerError(
        501,
        "the request asks for full-request streaming (no method in the work message), which this worker does not support",
      ),
    );
  }
  const headers = inferenceHeaders(call);
  const inline = req.requestBody
    ? Buffer.from(req.requestBody.buffer, req.requestBody.byteOffset, req.requestBody.byteLength)
    : undefined;
  let body: Buffer | Readable | undefined;
  if (requestToken) {
    const signal = call.signal;
    body = prepend(inline, async () => {
      const r = await callbacks.fetchBody({ targetUri, token: requestToken, proxyUri }, signal, call.trace);
      if (r.statusCode !== 200) {
        const text = await r.body.text().catch(() => "");
        throw new WorkerError(
          502,
          `the replica refused to hand over the request body (${r.statusCode} ${text.slice(0, 200)})`,
        );
      }
      return r.body;
    });
  } else if (inline?.length) {
    body = inline;
    headers["content-length"] = String(inline.length);
  } else {
    delete headers["content-length"];
  }
  const span =
    call.trace &&
    traceInference(call.trace, req.requestMethod, req.requestPath || "/", call.cfg.inference, headers);
  const response = inference.request({
    method: req.requestMethod,
    path: req.requestPath || "/",
    headers,
    body: body ?? null,
    signal: call.signal,
    // a long inference may take its time to answer (the poll window covers that); once it has,
    // a body that stops for inferenceIdleMs is cut, so its client gets an error, not a hang
    headersTimeout: 0,
    bodyTimeout: call.cfg.inferenceIdleMs,
  });
  // the span lasts until the answer's body has been read (an SSE stream: all of it)
  return span ? span.settle(response, true) : response;
}
