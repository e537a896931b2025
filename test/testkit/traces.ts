// One invocation's spans written to a span file by real tracers (two services' worth, as two
// processes of a stack would write them): for the tests of what reads span files (`callplane
// trace`, the console's request page).
import {
  KIND,
  startTracing,
  tracePublish,
  traceWork,
  type TracingSettings,
} from "../../src/lib/tracing/index.js";

export const TRACE_FID = "5f0e7c39-3f4a-4c43-9b39-6a5f1b1d2a10";
export const TRACE_FVID = "0b8d9a52-8e3c-4d57-a8d2-3d3f5f6b9e21";

/** Writes one invocation's spans (replica, publish, worker, inference call, callback, attach) to `file`. */
export async function writeTrace(
  file: string,
  requestId: string,
  clientTraceparent?: string,
): Promise<string> {
  const settings: TracingSettings = { endpoint: "", sampleRatio: 1, file };
  const invocation = await startTracing({ service: "invocation", settings });
  const worker = await startTracing({ service: "worker", settings });
  const server = invocation
    .continueFrom(
      clientTraceparent ? { traceparent: clientTraceparent } : {},
      "POST /v2/nvcf/pexec/functions/:fid",
      KIND.SERVER,
    )
    .identify(requestId, TRACE_FID, TRACE_FVID);
  const { span: publish, headers } = tracePublish(server, "local", TRACE_FVID, requestId, 120);
  publish.end();
  const work = traceWork(
    worker,
    headers,
    { region: "local", functionId: TRACE_FID, functionVersionId: TRACE_FVID },
    "c",
  ).identify(requestId);
  const call = work.child("POST /echo", KIND.CLIENT);
  await new Promise((r) => setTimeout(r, 5));
  call.end();
  const out: Record<string, string> = {};
  const cb = work.child("POST request-attach", KIND.CLIENT);
  cb.inject(out);
  const attach = invocation
    .continueFrom(out, "POST /v2/nvcf/worker/request-attach", KIND.SERVER)
    .identify(requestId);
  attach.end();
  cb.end();
  work.end();
  server.end();
  await Promise.all([invocation.shutdown(), worker.shutdown()]);
  return server.traceId;
}
