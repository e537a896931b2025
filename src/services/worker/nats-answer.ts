// A small answer held whole goes to its replica over NATS, not as POST request-attach through the
// callback proxy: one request to `callplane.answer.<holder>` (the replica that minted the token,
// as the token begins), the token on the first line and the framed response after it, answered
// once the client has it all (services/invocation/answer-message.ts). It saves, per answer, a TLS
// request to the proxy and the proxy's TLS request to the replica. When the replica does not take
// answers this way (no one listens: an older replica, or one that is gone) or no reply comes, the
// answer is posted as before: the token is single-use, so it can never be delivered twice.
import { RequestError, TimeoutError } from "@nats-io/transport-node";
import { tokenHolderHex } from "../../lib/ids.js";
import { subjects, type Replies } from "../../lib/nats/index.js";
import { traceNatsAnswer, type TraceSpan } from "../../lib/tracing/index.js";
import type { CallbackTarget } from "./callback.js";

/** The largest answer body the worker holds whole (of known length); larger ones stream. */
export const SMALL_ANSWER_BYTES = 64 * 1024;
/** The largest framed answer sent over NATS (a small body and its head; the rest go by POST). */
export const NATS_ANSWER_MAX_BYTES = SMALL_ANSWER_BYTES + 8 * 1024;
/** How long the replica has to deliver the answer to its client before the POST is tried. */
const ANSWER_TIMEOUT_MS = 10_000;

/** The replica's reply: 200 when the client has the answer, else the POST's status and problem. */
export interface ReplicaReply {
  status: number;
  text: string;
}

export class NatsAnswers {
  constructor(private readonly replies: Replies) {}

  /** Sends the answer; undefined when it must be posted instead (see the top of this file). */
  async send(target: CallbackTarget, framed: Buffer, trace?: TraceSpan): Promise<ReplicaReply | undefined> {
    const holder = tokenHolderHex(target.token);
    if (holder === undefined || framed.length > NATS_ANSWER_MAX_BYTES) return undefined;
    const tokenBytes = Buffer.byteLength(target.token, "latin1");
    const payload = Buffer.allocUnsafe(tokenBytes + 1 + framed.length);
    payload.write(target.token, 0, "latin1");
    payload[tokenBytes] = 10;
    framed.copy(payload, tokenBytes + 1);
    const subject = subjects.answer(holder);
    const span = trace && traceNatsAnswer(trace, subject);
    let reply;
    try {
      reply = await this.replies.request(subject, payload, ANSWER_TIMEOUT_MS);
    } catch (err) {
      span?.end(err);
      if ((err instanceof RequestError && err.isNoResponders()) || err instanceof TimeoutError)
        return undefined;
      throw err;
    }
    const text = reply.string();
    let status = 200;
    if (text !== "{}") {
      status = 502;
      try {
        const problem = JSON.parse(text) as { status?: unknown };
        if (typeof problem.status === "number") status = problem.status;
      } catch {
        // not a problem document: reported as it came
      }
    }
    span?.set("http.response.status_code", status).end(status >= 500 ? `HTTP ${status}` : undefined);
    return { status, text };
  }
}
