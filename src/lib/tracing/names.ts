import type { SpanKind } from "@opentelemetry/api";

// The names callplane's spans and their attributes use, in one place (docs/operations.md lists
// them). Standard attributes follow the OpenTelemetry semantic conventions (HTTP, RPC, messaging);
// callplane's own are under `nvcf.`.

export const ATTR = {
  /** The request id (NVCF-REQID), on every span of an invocation. */
  requestId: "nvcf.request.id",
  functionId: "nvcf.function.id",
  functionVersionId: "nvcf.function.version.id",
  /** request or response: which request-attach call. */
  attachKind: "nvcf.attach.kind",
  /** The replica (holder id) a relayed callback or tunnel went to. */
  relayHolder: "nvcf.relay.holder",
  /** How the work item or call ended (answered, cancelled, failed, abandoned; ok, reset, ...). */
  outcome: "nvcf.outcome",
  /** The callback proxy a worker's callback went through. */
  callbackProxy: "nvcf.callback.proxy",
} as const;

/** messaging.system: the conventions define no value for NATS; nats is what NATS.Net uses. */
export const MESSAGING_SYSTEM = "nats";

/** The work queue's subject template (messaging.destination.template): the subject ends in the request id. */
export const WORK_SUBJECT_TEMPLATE = "rq.{region}.{functionVersionId}.{requestId}";

/**
 * The API's SpanKind values, without loading the API: code that only passes spans around must not
 * load OpenTelemetry in a service that does not trace (its modules take a few hundred ms to load).
 */
export const KIND = {
  INTERNAL: 0 as SpanKind.INTERNAL,
  SERVER: 1 as SpanKind.SERVER,
  CLIENT: 2 as SpanKind.CLIENT,
  PRODUCER: 3 as SpanKind.PRODUCER,
  CONSUMER: 4 as SpanKind.CONSUMER,
} as const;
