// A client's invocation (POST /v2/nvcf/pexec/functions/{id}[/versions/{vid}], contract §2), from
// its arrival to the work message queued for a worker through JetStream (§3.2). The client's
// connection stays open here: the worker calls back to this replica (attach.ts) to fetch the rest
// of the body and to stream the answer. Also the parts a status poll (poll.ts) shares: the poll
// window, the headers and message handed to the worker, and the window that ends in a 504.
import type { IncomingMessage, ServerResponse } from "node:http";
import { CallplaneError, toCallplaneError } from "../../lib/errors.js";
import {
  bearerToken,
  endToEndPairs,
  rawPairs,
  type Prefix,
  readPrefix,
  type RequestContext,
  sendProblem,
} from "../../lib/http/index.js";
import { isUuid, newRequestId } from "../../lib/ids.js";
import type { Grant } from "../../plane/auth-cache.js";
import { watchBody } from "./body-watch.js";
import type { Pending, ReplicaState } from "./state.js";
import { encodeWorkMessage } from "./work-message.js";
import { NVCF_HEADERS } from "../../lib/contract.js";

const MAX_DIRECT_RESPONSE = 5 * 1024 * 1024;
// Expect: this replica already answered it; the worker has the whole body to send
const DROP_TO_WORKER = new Set([
  "authorization",
  "host",
  NVCF_HEADERS.pollSeconds,
  "nvcf-invocation-region",
  "expect",
]);

/** POST /v2/nvcf/pexec/functions/:fid[/versions/:vid]: the request is queued for a worker. */
export async function invoke(
  replica: ReplicaState,
  ctx: RequestContext,
  functionId: string,
  functionVersionId: string | undefined,
): Promise<void> {
  const { req, res } = ctx;
  const started = Date.now();
  const windowSeconds = pollWindow(replica, req);
  const apiKey = bearerToken(req);
  if (!isUuid(functionId))
    throw new CallplaneError("FUNCTION_NOT_FOUND", `function id "${functionId}" is not a UUID`);
  if (functionVersionId !== undefined && !isUuid(functionVersionId))
    throw new CallplaneError("VERSION_NOT_FOUND", `version id "${functionVersionId}" is not a UUID`);
  const grant = await replica.auth.authorize(apiKey, functionId, functionVersionId);
  const versions = grant.functionVersions;
  const version = versions.length === 1 ? versions[0] : versions[Math.floor(Math.random() * versions.length)];
  // In flight from here (the key is accepted) until the client's answer (a 202 included) is out or
  // the request ends some other way: the slot goes back in replica.release(), or below if the
  // request ends before it is held.
  const fn = replica.metrics.of(functionId, version.functionVersionId);
  let slot;
  try {
    slot = replica.inFlightPerKey.acquire(grant.keyId);
  } catch (err) {
    fn.refused(res, started);
    throw err;
  }
  let body;
  try {
    body = await readInline(replica, req, res, windowSeconds);
  } catch (err) {
    slot.release();
    fn.refused(res, started);
    throw err;
  }
  if (res.destroyed) {
    slot.release();
    return;
  }
  // readPrefix stops at the limit before it can see the end, so a body of exactly inlineLimit
  // bytes reads as unfinished; its Content-Length says nothing is left for GET request-attach.
  const complete =
    body.ended || (body.rest === undefined && req.headers["content-length"] === String(body.head.length));
  const q = req.url!.indexOf("?");
  const p: Pending = {
    requestId: newRequestId(replica.holderId),
    functionId,
    version,
    clientReq: req,
    clientRes: res,
    leftover: body.rest,
    requestToken: undefined,
    responseToken: "",
    state: "queued",
    poll: false,
    started,
    clientNcaId: grant.clientNcaId,
    slot,
    fn,
    outcome: undefined,
  };
  // The worker may call back as soon as the message is out, so the tokens are live before publishing.
  p.responseToken = replica.attachToken(p, "response");
  if (!complete) p.requestToken = replica.attachToken(p, "request");
  const path = q === -1 ? version.defaultInvocationPath : version.defaultInvocationPath + req.url!.slice(q);
  const data = workMessage(
    replica,
    p,
    req.method!,
    path,
    forwardHeaders(replica, req, windowSeconds),
    body.head,
    grant,
  );
  track(replica, p, windowSeconds);
  ctx.span?.identify(p.requestId, functionId, version.functionVersionId);
  try {
    p.seq = await replica.publisher!.publish(version.functionVersionId, p.requestId, data, ctx.span);
  } catch (err) {
    replica.metrics.mark(p, "rejected");
    p.problem = toCallplaneError(err);
    replica.release(p);
    throw err;
  }
  ctx.log.debug(
    { requestId: p.requestId, functionId, functionVersionId: version.functionVersionId },
    "queued",
  );
}

/**
 * The inline part of the body. It must arrive within invocation.inlineBodySeconds (and the poll
 * window, if shorter), with no pause of invocation.bodyIdleSeconds: a client that stops or trickles
 * gets 408 and its connection is closed, instead of holding it (and its key's slot) for the window.
 */
async function readInline(
  replica: ReplicaState,
  req: IncomingMessage,
  res: ServerResponse,
  windowSeconds: number,
): Promise<Prefix> {
  const totalMs = Math.min(replica.inlineBodyMs, windowSeconds * 1000);
  let stop: (() => void) | undefined;
  try {
    return await Promise.race([
      readPrefix(req, replica.inlineLimit),
      new Promise<never>((_, reject) => {
        stop = watchBody(req, { idleMs: replica.bodyIdleMs, totalMs }, (why) => {
          res.setHeader("connection", "close");
          reject(
            new CallplaneError(
              "REQUEST_TIMEOUT",
              why === "idle"
                ? `the request body paused for more than ${replica.bodyIdleMs / 1000} s (invocation.bodyIdleSeconds); send it without pausing`
                : `the first ${replica.inlineLimit} bytes of the request body did not arrive within ${totalMs / 1000} s (invocation.inlineBodySeconds, or the poll window if shorter); send the body without pausing`,
            ),
          );
        });
      }),
    ]);
  } finally {
    stop?.();
  }
}

/** The poll window (NVCF-POLL-SECONDS, or the default for the kind of request), in seconds. */
export function pollWindow(replica: ReplicaState, req: IncomingMessage): number {
  const poll = replica.poll;
  const raw = req.headers[NVCF_HEADERS.pollSeconds];
  const streaming = req.headers.accept === "text/event-stream";
  if (raw === undefined) return streaming ? poll.streamingDefaultSeconds : poll.defaultSeconds;
  const text = Array.isArray(raw) ? raw[0] : raw;
  if (!/^\s*\d+\s*$/.test(text)) {
    throw new CallplaneError(
      "BAD_POLL_SECONDS",
      `NVCF-POLL-SECONDS must be a whole number of seconds from 0 to ${poll.maxSeconds} (0 counts as 1), not ${JSON.stringify(text.slice(0, 40))}`,
    );
  }
  const n = Number(text);
  if (n > poll.maxSeconds)
    throw new CallplaneError("BAD_POLL_SECONDS", `NVCF-POLL-SECONDS must be <= ${poll.maxSeconds}`);
  return Math.max(1, n);
}

/** A header as the work message carries it (nvcf.StringKV). */
export interface HeaderKV {
  key: string;
  value: string;
}

/** The client's headers as the worker gets them, with the window and region this replica chose. */
export function forwardHeaders(replica: ReplicaState, req: IncomingMessage, pollSeconds: number): HeaderKV[] {
  const out = endToEndPairs(rawPairs(req.rawHeaders), { drop: DROP_TO_WORKER }).map(
    ([key, value]): HeaderKV => ({ key, value }),
  );
  out.push(
    { key: "NVCF-POLL-SECONDS", value: String(pollSeconds) },
    { key: "NVCF-INVOCATION-REGION", value: replica.region },
  );
  return out;
}

/** The work message: the request, and where and with which tokens the worker calls back. */
export function workMessage(
  replica: ReplicaState,
  p: Pending,
  method: string,
  path: string,
  headers: HeaderKV[],
  body: Buffer | undefined,
  grant: Pick<Grant, "clientNcaId" | "subject">,
): Uint8Array {
  return encodeWorkMessage({
    requestId: p.requestId,
    ncaId: grant.clientNcaId,
    subject: grant.subject,
    maxDirectResponseSizeBytes: MAX_DIRECT_RESPONSE,
    requestTimeMs: p.started,
    requestBody: body,
    requestHeaders: headers,
    requestMethod: method,
    requestPath: path,
    http1: {
      targetURI: replica.targetUri,
      proxyURI: replica.proxyUri || undefined,
      responseAuthorizationToken: p.responseToken,
      requestAuthorizationToken: p.requestToken || undefined,
    },
  });
}

/**
 * Holds the request until a worker answers: a client that leaves cancels it, and a window that
 * ends with no worker's answer begun gives the client a 504 and cancels it.
 */
export function track(replica: ReplicaState, p: Pending, windowSeconds: number): void {
  p.clientRes.once("close", () => clientClosed(replica, p));
  replica.metrics.held(p);
  replica.pendings.add(p, (windowSeconds + replica.poll.graceSeconds) * 1000, () =>
    windowEnded(replica, p, windowSeconds),
  );
}

/** The client's connection closed: before its answer was out in full, the request is cancelled. */
function clientClosed(replica: ReplicaState, p: Pending): void {
  replica.metrics.closed(p);
  if (p.state === "done") return;
  const wasQueued = p.state === "queued";
  if (!p.clientRes.writableFinished) {
    replica.cancel(p, wasQueued ? "client left while queued" : "client left during the response");
  }
  replica.release(p);
}

/** No worker's answer began within the window: the client gets a 504 and the request is cancelled. */
function windowEnded(replica: ReplicaState, p: Pending, windowSeconds: number): void {
  if (p.state !== "queued") return;
  replica.metrics.mark(p, "timeout");
  replica.logger.info(
    { requestId: p.requestId, functionId: p.functionId, windowSeconds },
    "no worker answered within the window",
  );
  sendProblem(
    p.clientRes,
    (p.problem = new CallplaneError(
      "INVOCATION_TIMEOUT",
      p.poll
        ? `the worker did not answer the status request within ${windowSeconds} s; poll again`
        : p.bodyStreaming
          ? `a worker took request ${p.requestId}, but the request body did not finish arriving within ${windowSeconds} s, so no answer could come; the request was cancelled. Send the body without pausing`
          : `no worker answered function ${p.functionId} (version ${p.version.functionVersionId}) within ${windowSeconds} s; the request was cancelled and removed from the queue. Check that the function is deployed and its instances are ACTIVE (callplane deploy get)`,
      { extra: { requestId: p.requestId } },
    )),
    replica.logger,
    { [NVCF_HEADERS.reqId]: p.requestId },
  );
  replica.cancel(p, "window ended");
  replica.release(p);
}
