// The NVCF contract's names that more than one part of callplane speaks (reference/nvcf-contract.md):
// the worker's callback path and the headers a client, a replica and a worker exchange. Each is
// written once here, so a replica, the worker, the relay and the callback proxy cannot drift apart.

/** The worker's callback to the replica that holds a request: GET the rest of the body, POST the answer (§3.6). */
export const ATTACH_PATH = "/v2/nvcf/worker/request-attach";

/** Header names, lower-case as node:http gives them. */
export const NVCF_HEADERS = {
  /** The request id, on every answer and on a resumed gRPC session's metadata. */
  reqId: "nvcf-reqid",
  /** fulfilled, pending-evaluation, in-progress, errored (§2.3). */
  status: "nvcf-status",
  /** The client's poll window in seconds (§2.2). */
  pollSeconds: "nvcf-poll-seconds",
} as const;

/**
 * callplane's own, not NVCF's: the instance id a callplane worker names itself by on its callbacks
 * and status-poll acks, which the operator console shows as the worker that holds a request. It
 * authorizes nothing (the attach token does); an NVCF worker does not send it.
 */
export const WORKER_INSTANCE_HEADER = "x-callplane-worker-instance";
