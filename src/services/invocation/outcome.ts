// How an invocation ended, as the metrics and the console's record of ended requests name it.

/**
 * answered: the worker's answer reached the client in full (whatever its status: a 202 too);
 * timeout: no worker answered within the window (504); client_gone: the client left before its
 * answer was out in full; rejected: refused after its function was known, before a worker had it
 * (too many in flight, a body too slow, the queue refused it); failed: the plane answered with an
 * error after queueing (a malformed worker answer, a body that stalled, an answer cut short).
 */
export const INVOCATION_OUTCOMES = ["answered", "timeout", "client_gone", "rejected", "failed"] as const;
export type InvocationOutcome = (typeof INVOCATION_OUTCOMES)[number];
