// The worker's callbacks to the replica that holds a request (contract §3.6), each carrying one of
// the request's single-use attach tokens: GET request-attach fetches the rest of the client's body,
// POST request-attach streams the framed answer, which is relayed to the waiting client. A token
// minted by another replica is relayed there (plane/relay.ts).
import type { OutgoingHttpHeaders } from "node:http";
import { CallplaneError } from "../../lib/errors.js";
import {
  bearerToken,
  endToEndPairs,
  foldPairs,
  FramingError,
  H1_CONTENT_TYPE,
  type ParsedHead,
  pump,
  PumpLimitError,
  readFramedHead,
  type RequestContext,
  sendProblem,
} from "../../lib/http/index.js";
import { RELAYED_HEADER } from "../../plane/relay.js";
import { tokenHolder } from "../../plane/tokens.js";
import { watchBody } from "./body-watch.js";
import { callbackContact } from "./worker-seen.js";
import { purgePollRecord, writePollRecord } from "./poll.js";
import type { AttachKind, Pending, ReplicaState } from "./state.js";
import { NVCF_HEADERS } from "../../lib/contract.js";

/** The replica sets these on the client's answer itself; the worker's copies are dropped. */
const OWN_RESPONSE_HEADERS = new Set([NVCF_HEADERS.reqId, NVCF_HEADERS.status]);

function nvcfStatus(status: number): string {
  if (status === 202) return "in-progress";
  if (status >= 200 && status < 400) return "fulfilled";
  return "errored";
}

/** GET /v2/nvcf/worker/request-attach: the worker fetches the body beyond the inline part. */
export async function attachRequest(replica: ReplicaState, ctx: RequestContext): Promise<void> {
  const { res } = ctx;
  const { attaches } = replica.metrics;
  const p = await claim(replica, ctx, "request");
  if (!p) return;
  if (p.state === "done" || p.clientRes.destroyed) {
    attaches.inc({ kind: "request", result: "client_gone" });
    throw new CallplaneError("CLIENT_GONE", `the client of request ${p.requestId} went away`);
  }
  attaches.inc({ kind: "request", result: "ok" });
  res.writeHead(200, { "content-type": "application/octet-stream", [NVCF_HEADERS.reqId]: p.requestId });
  if (p.leftover) res.write(p.leftover);
  p.leftover = undefined;
  p.bodyStreaming = true;
  // The rest of the body must keep coming while the worker reads it (a worker whose side is full
  // is not waiting on the client): a trickle would hold the worker's slot for the whole window.
  const stop = watchBody(
    p.clientReq,
    { idleMs: replica.bodyIdleMs, waiting: () => !res.writableNeedDrain },
    () => bodyStalled(replica, p),
  );
  try {
    await pump(p.clientReq, res);
    p.bodyStreaming = false;
    res.end();
  } catch (err) {
    ctx.log.debug({ requestId: p.requestId, err }, "request body stream to the worker broke");
    res.destroy();
  } finally {
    stop();
  }
}

/**
 * The client stopped sending the rest of its body: it gets 408 and the request is cancelled; once
 * the answer has begun (an echo streams back while the body comes in) no 408 can be sent, and its
 * connection is cut instead (clientClosed cancels the request).
 */
function bodyStalled(replica: ReplicaState, p: Pending): void {
  if (p.state === "done") return;
  if (p.state === "responding") {
    replica.logger.info(
      { requestId: p.requestId },
      "request body stalled during the response; connection cut",
    );
    p.clientReq.destroy();
    return;
  }
  sendProblem(
    p.clientRes,
    (p.problem = new CallplaneError(
      "REQUEST_TIMEOUT",
      `the request body paused for more than ${replica.bodyIdleMs / 1000} s (invocation.bodyIdleSeconds) while a worker was reading it; the request was cancelled. Send the body without pausing`,
      { extra: { requestId: p.requestId } },
    )),
    replica.logger,
    { [NVCF_HEADERS.reqId]: p.requestId, connection: "close" },
  );
  replica.cancel(p, "request body stalled");
  replica.release(p);
  // the worker's read of the body ends (cut) with the client's connection, once the 408 is out
  const cut = () => p.clientReq.destroy();
  if (p.clientRes.writableFinished) cut();
  else p.clientRes.once("finish", cut).once("close", cut);
}

/**
 * The pending request an attach token belongs to. A token this replica did not mint, naming
 * another live replica, is relayed there (and undefined returned); anything else is refused.
 */
async function claim(
  replica: ReplicaState,
  ctx: RequestContext,
  kind: AttachKind,
): Promise<Pending | undefined> {
  const { req, res } = ctx;
  const { attaches } = replica.metrics;
  const { tokens, relay } = replica;
  let token: string;
  try {
    token = bearerToken(req);
  } catch {
    attaches.inc({ kind, result: "bad_token" });
    throw new CallplaneError(
      "ATTACH_TOKEN_INVALID",
      "The provided authorization token is invalid or has expired",
    );
  }
  const entry = tokens.peek(token);
  if (entry && entry.kind === kind) {
    tokens.delete(token);
    const p = entry.pending;
    ctx.span?.identify(p.requestId, p.functionId, p.version.functionVersionId);
    p.worker = callbackContact(req);
    return p;
  }
  const holder = tokenHolder(token);
  if (
    !entry &&
    relay &&
    holder !== undefined &&
    !tokens.isOwn(token) &&
    req.headers[RELAYED_HEADER] === undefined
  ) {
    attaches.inc({ kind, result: "relayed" });
    await relay.forward(req, res, holder, ctx.span);
    return undefined;
  }
  attaches.inc({ kind, result: "bad_token" });
  throw new CallplaneError(
    "ATTACH_TOKEN_INVALID",
    "The provided authorization token is invalid or has expired",
  );
}

/** POST /v2/nvcf/worker/request-attach: the worker streams the framed answer to the waiting client. */
export async function attachResponse(replica: ReplicaState, ctx: RequestContext): Promise<void> {
  const { req, res } = ctx;
  const { attaches } = replica.metrics;
  const p = await claim(replica, ctx, "response");
  if (!p) return;
  if (p.state === "done" || p.clientRes.destroyed) {
    attaches.inc({ kind: "response", result: "client_gone" });
    throw new CallplaneError(
      "CLIENT_GONE",
      `the client of request ${p.requestId} went away; stop working on it`,
    );
  }
  const type = req.headers["content-type"];
  if (type !== H1_CONTENT_TYPE) {
    attaches.inc({ kind: "response", result: "bad_framing" });
    failClient(replica, p, `the worker sent content type ${type ?? "(none)"}`);
    throw new CallplaneError(
      "ATTACH_FRAMING_INVALID",
      `send the response as ${H1_CONTENT_TYPE} (an HTTP/1.1 message), not ${type ?? "no content type"}`,
    );
  }
  p.state = "responding";
  replica.pendings.stopWindow(p);
  let framed;
  try {
    framed = await readFramedHead(req);
  } catch (err) {
    attaches.inc({ kind: "response", result: "bad_framing" });
    const detail =
      err instanceof FramingError ? err.message : `the framed response broke off: ${(err as Error).message}`;
    failClient(replica, p, detail);
    throw new CallplaneError("ATTACH_FRAMING_INVALID", detail);
  }
  const { head, rest } = framed;
  const client = p.clientRes;
  const bodyless = await beginAnswer(replica, p, head, rest, () => req.resume());
  let delivered: Delivery = { ok: true, framingError: undefined };
  if (bodyless) req.resume();
  else delivered = await relayBody(ctx, p, head, rest);
  const { ok, framingError } = delivered;
  if (!ok || client.destroyed) {
    replica.metrics.mark(p, client.destroyed ? "client_gone" : "failed");
    client.destroy();
    replica.release(p);
    if (!res.headersSent) {
      // The worker is told why: its framing was wrong (400), or the client went away (410).
      const err = framingError
        ? new CallplaneError("ATTACH_FRAMING_INVALID", framingError)
        : new CallplaneError("CLIENT_GONE", `the response to ${p.requestId} could not be delivered in full`);
      if (framingError) attaches.inc({ kind: "response", result: "bad_framing" });
      sendProblem(res, err, ctx.log, { connection: "close" });
    }
    return;
  }
  await endAnswer(replica, p);
  // the request named on the answer, as on the GET's: the callback proxy's access line carries it
  res.writeHead(200, {
    "content-type": "application/json",
    "content-length": 2,
    [NVCF_HEADERS.reqId]: p.requestId,
  });
  res.end("{}");
}

/**
 * The framed answer's head goes to the client (whichever way the answer came: POST request-attach
 * or a NATS answer, answer-message.ts), once the body bytes that came with it fit its length and
 * the poll record is kept. Whether the answer has no body (204, 304, a HEAD request).
 * `discard` drops the rest of the worker's body when the answer cannot go out.
 */
export async function beginAnswer(
  replica: ReplicaState,
  p: Pending,
  head: ParsedHead,
  rest: Buffer,
  discard: () => void,
): Promise<boolean> {
  const { attaches } = replica.metrics;
  if (head.contentLength !== undefined && rest.length > head.contentLength) {
    // Bytes past the declared length would reach the client's keep-alive connection as the start
    // of a next response. The head is not out yet, so the client can still get a clean 502.
    attaches.inc({ kind: "response", result: "bad_framing" });
    const detail = `the framed body is longer than its Content-Length (${head.contentLength} bytes)`;
    failClient(replica, p, detail);
    throw new CallplaneError("ATTACH_FRAMING_INVALID", detail);
  }
  const headers: OutgoingHttpHeaders = foldPairs(endToEndPairs(head.headers, { drop: OWN_RESPONSE_HEADERS }));
  headers[NVCF_HEADERS.reqId] = p.requestId;
  headers[NVCF_HEADERS.status] = nvcfStatus(head.status);
  headers["access-control-expose-headers"] = NVCF_HEADERS.reqId;
  await keepPollRecord(replica, p, discard, head.status);
  replica.metrics.answered(p);
  attaches.inc({ kind: "response", result: "ok" });
  p.clientRes.writeHead(head.status, headers);
  return head.status === 204 || head.status === 304 || p.clientReq.method === "HEAD";
}

/** Ends the client's answer (with `last` bytes) and lets the request go once the client has it all. */
export async function endAnswer(replica: ReplicaState, p: Pending, last?: Buffer): Promise<void> {
  const client = p.clientRes;
  if (last?.length) client.end(last);
  else client.end();
  await new Promise<void>((resolve) => {
    if (client.writableFinished) resolve();
    else client.once("close", () => resolve());
  });
  replica.release(p);
}

/**
 * A 202 (in progress) is recorded for the client's status polls before it goes out; a final
 * answer to a poll removes the record first.
 */
async function keepPollRecord(
  replica: ReplicaState,
  p: Pending,
  discard: () => void,
  status: number,
): Promise<void> {
  if (status === 202) {
    try {
      await writePollRecord(replica, p);
    } catch (err) {
      // Without its record no status poll can find the request: a 202 now would be followed by
      // 404s. The client hears why instead; a new request is cancelled (nobody can wait for it),
      // a poll's record is the one already written, so its client may poll again.
      replica.logger.error(
        { requestId: p.requestId, err },
        "could not record the in-progress request for polling",
      );
      discard();
      sendProblem(
        p.clientRes,
        (p.problem = new CallplaneError(
          "UNAVAILABLE",
          p.poll
            ? `request ${p.requestId} is still in progress, but its poll record could not be refreshed (NATS did not answer in time); poll again shortly`
            : `request ${p.requestId} went in progress, but the record status polls find it by could not be written (NATS did not answer in time), so it was cancelled; invoke again shortly`,
          { cause: err, extra: { requestId: p.requestId } },
        )),
        replica.logger,
        { [NVCF_HEADERS.reqId]: p.requestId },
      );
      replica.cancel(p, "poll record not written");
      replica.release(p);
      throw new CallplaneError(
        "CLIENT_GONE",
        `the 202 for ${p.requestId} was not delivered: its poll record could not be written`,
      );
    }
  } else if (p.poll) {
    // Purged before the client sees the final answer: a poll sent right after it must find no
    // record (404), not reach a worker that has finished with the request (and would acknowledge
    // the poll but never answer it, leaving the client to wait for the window).
    await purgePollRecord(replica, p);
  }
}

/** How the body got to the client: not ok when it broke; framingError says how it broke its framing. */
interface Delivery {
  ok: boolean;
  framingError: string | undefined;
}

/**
 * Streams the worker's framed body to the client, whose response head is out; the bytes read with
 * the head go first.
 */
async function relayBody(ctx: RequestContext, p: Pending, head: ParsedHead, rest: Buffer): Promise<Delivery> {
  const client = p.clientRes;
  if (rest.length) client.write(rest);
  const limit = head.contentLength === undefined ? undefined : head.contentLength - rest.length;
  try {
    const { bytes } = await pump(ctx.req, client, limit === undefined ? {} : { limit });
    // The worker's body ended short of its Content-Length. The client's head (with that
    // length) is out: ending the response normally would leave the client waiting on a
    // keep-alive connection for bytes that never come. Cut it instead.
    if (limit !== undefined && bytes < limit) {
      return {
        ok: false,
        framingError: `the framed body ended after ${rest.length + bytes} of its ${head.contentLength} bytes (Content-Length)`,
      };
    }
    return { ok: true, framingError: undefined };
  } catch (err) {
    ctx.log.debug(
      { requestId: p.requestId, err: (err as Error).message },
      err instanceof PumpLimitError ? "the worker sent more than Content-Length" : "response stream broke",
    );
    return {
      ok: false,
      framingError:
        err instanceof PumpLimitError
          ? `the framed body is longer than its Content-Length (${head.contentLength} bytes)`
          : undefined,
    };
  }
}

/** The worker produced no valid answer: the client gets a 502 rather than waiting for the window. */
export function failClient(replica: ReplicaState, p: Pending, why: string): void {
  if (p.state === "done") return;
  sendProblem(
    p.clientRes,
    (p.problem = new CallplaneError(
      "WORKER_RESPONSE_INVALID",
      `the worker's answer to request ${p.requestId} was malformed (${why})`,
      { extra: { requestId: p.requestId } },
    )),
    replica.logger,
    { [NVCF_HEADERS.reqId]: p.requestId },
  );
  replica.release(p);
}
