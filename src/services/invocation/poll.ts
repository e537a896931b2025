// Status polling (GET /v2/nvcf/pexec/status/{id}, contract §2), for keys of the account that made
// the request only (its poll record names it; any other key gets the unknown id's 404): a request
// whose worker answered 202 is found again through its record in the poll bucket (written here when
// the 202 passes through attach.ts), and the worker holding it is asked over NATS for its next
// answer, which it sends to this replica (the polling one) with a fresh response token.
import { RequestError } from "@nats-io/transport-node";
import { CallplaneError } from "../../lib/errors.js";
import { bearerToken, type RequestContext } from "../../lib/http/index.js";
import { isUuid } from "../../lib/ids.js";
import { subjects } from "../../lib/nats/index.js";
import { forwardHeaders, pollWindow, track, workMessage } from "./invoke.js";
import type { Grant } from "../../plane/auth-cache.js";
import type { Pending, PollRecord, ReplicaState } from "./state.js";

const NIL_UUID = "00000000-0000-0000-0000-000000000000";

/** GET /v2/nvcf/pexec/status/:requestId: asks the worker holding the request for its next answer. */
export async function pollStatus(replica: ReplicaState, ctx: RequestContext): Promise<void> {
  const { req, res, params } = ctx;
  const requestId = params.requestId;
  const windowSeconds = pollWindow(replica, req);
  const apiKey = bearerToken(req);
  if (!isUuid(requestId))
    throw new CallplaneError(
      "REQUEST_NOT_FOUND",
      `"${requestId}" is not a request id (a UUID from the NVCF-REQID header)`,
    );
  const entry = await (await replica.pollKvBucket()).get(requestId).catch((err: unknown) => {
    throw new CallplaneError(
      "UNAVAILABLE",
      `the record of request ${requestId} could not be read (NATS did not answer in time); poll again shortly`,
      { cause: err },
    );
  });
  if (!entry || entry.operation !== "PUT") return notFound(replica, apiKey, requestId);
  const rec = entry.json<PollRecord>();
  let grant: Grant;
  try {
    grant = await replica.auth.authorize(apiKey, rec.functionId, rec.functionVersionId);
  } catch (err) {
    // A key that cannot reach the request's function (another account's, or a policy naming
    // other functions) is answered as for an unknown id, so the answer says nothing of the
    // request; only a failure to check the key at all is told as such.
    if (err instanceof CallplaneError && err.status >= 500) throw err;
    return notFound(replica, apiKey, requestId);
  }
  // Requests belong to the account of the key that made them (NVCF's clientNcaId): its keys share
  // them, and a key of any other account is told the id does not exist, before anything is asked
  // of the worker (which would hand that key the answers).
  if (typeof rec.clientNcaId !== "string" || rec.clientNcaId !== grant.clientNcaId)
    return notFound(replica, apiKey, requestId);
  ctx.span?.identify(requestId, rec.functionId, rec.functionVersionId);
  const slot = replica.inFlightPerKey.acquire(grant.keyId);
  const p: Pending = {
    requestId,
    functionId: rec.functionId,
    version: {
      functionVersionId: rec.functionVersionId,
      defaultInvocationPath: rec.defaultInvocationPath,
      functionType: rec.functionType,
    },
    clientReq: req,
    clientRes: res,
    leftover: undefined,
    requestToken: undefined,
    responseToken: "",
    state: "queued",
    poll: true,
    started: Date.now(),
    clientNcaId: rec.clientNcaId,
    slot,
  };
  p.responseToken = replica.attachToken(p, "response");
  const data = workMessage(
    replica,
    p,
    "GET",
    rec.defaultInvocationPath,
    forwardHeaders(replica, req, windowSeconds),
    undefined,
    grant,
  );
  track(replica, p, windowSeconds);
  try {
    const ack = await replica.nc!.request(subjects.polling(rec.functionVersionId, requestId), data, {
      timeout: replica.statusTimeoutMs,
    });
    // a callplane worker acks with its instance id (worker-seen.ts); the answer may have come first
    if (ack.data.length > 0 && ack.data.length <= 128) p.worker ??= { named: ack.string() };
  } catch (err) {
    replica.release(p);
    // Nobody listens for this request's polls any more: the worker finished it, gave up on it
    // (no poll came in time) or is gone. It can never answer, so the record goes and the client
    // gets a final 404 rather than "poll again" forever.
    if (err instanceof RequestError && err.isNoResponders()) {
      await (await replica.pollKvBucket()).purge(requestId).catch(() => undefined);
      throw new CallplaneError(
        "REQUEST_NOT_FOUND",
        `no worker holds request ${requestId} any more: it finished, was cancelled because no status poll came in time, or its worker stopped; invoke anew`,
      );
    }
    throw new CallplaneError(
      "WORKER_NOT_ACKNOWLEDGED",
      `worker did not acknowledge the status request for ${requestId}; it may have stopped. Poll again, or invoke anew`,
      { cause: err },
    );
  }
}

/**
 * The answer to a poll of a request this caller may not see (unknown, finished, expired, or
 * another account's): the key is checked first all the same (against no function: the API checks
 * the key and its scope before the function), so that whether a request id is live is not told to
 * a caller without a valid key; then 404, the same words whatever the reason.
 */
async function notFound(replica: ReplicaState, apiKey: string, requestId: string): Promise<never> {
  await replica.auth.authorize(apiKey, NIL_UUID).catch((err: unknown) => {
    if (!(err instanceof CallplaneError && err.code === "FUNCTION_NOT_FOUND")) throw err;
  });
  throw new CallplaneError(
    "REQUEST_NOT_FOUND",
    `no request ${requestId} is in progress: it is unknown, finished (a final answer is delivered once), or older than 1 h`,
  );
}

/** The worker answered 202: the request is recorded so that a status poll on any replica finds it. */
export async function writePollRecord(replica: ReplicaState, p: Pending): Promise<void> {
  await (
    await replica.pollKvBucket()
  ).put(
    p.requestId,
    JSON.stringify({
      clientNcaId: p.clientNcaId,
      functionId: p.functionId,
      functionVersionId: p.version.functionVersionId,
      defaultInvocationPath: p.version.defaultInvocationPath,
      functionType: p.version.functionType,
    } satisfies PollRecord),
  );
}

/** A poll got the final answer: its record goes (a failure is only logged). */
export async function purgePollRecord(replica: ReplicaState, p: Pending): Promise<void> {
  await replica
    .pollKvBucket()
    .then((kv) => kv.purge(p.requestId))
    .catch((err: unknown) =>
      replica.logger.warn({ requestId: p.requestId, err }, "purge of the poll record failed"),
    );
}
