// A small answer that comes over NATS instead of POST request-attach: callplane's workers send a
// final or in-progress answer they hold whole (at most SMALL_ANSWER bytes, framed as the POST body
// would be) as a NATS request to the replica that minted its token (`callplane.answer.<holder>`),
// with the token on the first line. The replica checks the token as the callback would, sends the
// answer to the client, and replies once the client has it all, as the POST's 200 does; a refusal
// is the POST's problem+json. Nothing of the contract changes: an NVCF worker posts its answers, and
// so do callplane's for bodies that are large, streamed or of unknown length. What it saves per
// small answer is the callback's two TLS legs and the proxy between them (docs/architecture.md).
import type { Msg, NatsConnection, Subscription } from "@nats-io/transport-node";
import { CallplaneError, toCallplaneError } from "../../lib/errors.js";
import { FramingError, HeadReader } from "../../lib/http/index.js";
import { holderHex } from "../../lib/ids.js";
import { subjects } from "../../lib/nats/index.js";
import { beginAnswer, endAnswer, failClient } from "./attach.js";
import type { ReplicaState } from "./state.js";

const OK = new TextEncoder().encode("{}");

/** Listens for the answers of the requests this replica holds. */
export function listenForAnswers(replica: ReplicaState, nc: NatsConnection): Subscription {
  return nc.subscribe(subjects.answer(holderHex(replica.holderId)), {
    callback: (err, m) => {
      if (err) return;
      answerMessage(replica, m).then(
        () => m.respond(OK),
        (e: unknown) => {
          const problem = toCallplaneError(e);
          if (problem.code === "INTERNAL") replica.logger.error({ err: e }, "an answer over NATS failed");
          else replica.logger.debug({ code: problem.code, detail: problem.message }, "answer refused");
          m.respond(JSON.stringify(problem.toProblem()));
        },
      );
    },
  });
}

/** One answer: `<token>\n<framed HTTP/1.1 response>`. */
async function answerMessage(replica: ReplicaState, m: Msg): Promise<void> {
  const { attaches } = replica.metrics;
  const data = Buffer.from(m.data.buffer, m.data.byteOffset, m.data.byteLength);
  const nl = data.indexOf(10);
  const token = nl > 0 ? data.toString("latin1", 0, nl) : "";
  const entry = replica.tokens.peek(token);
  if (!entry || entry.kind !== "response") {
    attaches.inc({ kind: "response", result: "bad_token" });
    throw new CallplaneError(
      "ATTACH_TOKEN_INVALID",
      "The provided authorization token is invalid or has expired",
    );
  }
  replica.tokens.delete(token);
  const p = entry.pending;
  p.worker = { inbox: m.reply };
  if (p.state === "done" || p.clientRes.destroyed) {
    attaches.inc({ kind: "response", result: "client_gone" });
    throw new CallplaneError(
      "CLIENT_GONE",
      `the client of request ${p.requestId} went away; stop working on it`,
    );
  }
  p.state = "responding";
  replica.pendings.stopWindow(p);
  let framed;
  try {
    framed = new HeadReader().push(data.subarray(nl + 1));
    if (!framed) throw new FramingError("the answer ends before its framed response head does");
    const { head, rest } = framed;
    if (head.contentLength !== undefined && rest.length < head.contentLength)
      throw new FramingError(
        `the framed body ended after ${rest.length} of its ${head.contentLength} bytes (Content-Length)`,
      );
  } catch (err) {
    attaches.inc({ kind: "response", result: "bad_framing" });
    failClient(replica, p, (err as Error).message);
    throw new CallplaneError("ATTACH_FRAMING_INVALID", (err as Error).message);
  }
  const { head, rest } = framed;
  const bodyless = await beginAnswer(replica, p, head, rest, () => undefined);
  await endAnswer(replica, p, bodyless ? undefined : rest);
  if (p.clientRes.destroyed && !p.clientRes.writableFinished)
    throw new CallplaneError("CLIENT_GONE", `the response to ${p.requestId} could not be delivered in full`);
}
