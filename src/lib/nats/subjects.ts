// Every NATS name callplane uses, as the NVCF contract names them (§3.2): the work-queue streams
// and their subjects, poll, cancel and reconnect subjects, KV buckets and each service's inbox.

export const subjects = {
  stream: (region: string, fvid: string) => `rq_${region}_${fvid}`,
  consumer: (region: string, fvid: string) => `rq_${region}_${fvid}_workers`,
  work: (region: string, fvid: string, requestId: string) => `rq.${region}.${fvid}.${requestId}`,
  workFilter: (region: string, fvid: string) => `rq.${region}.${fvid}.>`,
  // callplane: the version is in the poll subject (upstream: rq_polling.{requestId}), so that a
  // worker can be allowed its own version's polls and no other's
  polling: (fvid: string, requestId: string) => `rq_polling.${fvid}.${requestId}`,
  pollingFilter: (fvid: string) => `rq_polling.${fvid}.*`,
  cancel: (fvid: string) => `nvcf.cancel.${fvid}`,
  /** A gRPC session's worker listens here for tunnels to more replicas (session resumption). */
  // callplane: the version is in the subject (as for polls), so a worker may hear only its own
  reconnect: (fvid: string, requestId: string) => `stateful_session.reconnect.${fvid}.${requestId}`,
  reconnectFilter: (fvid: string) => `stateful_session.reconnect.${fvid}.*`,
  // callplane: a worker's small answer, sent as a request to the invocation replica that minted
  // its token (the holder, in hex, as the token begins): services/invocation/answer-message.ts
  answer: (holderHex: string) => `callplane.answer.${holderHex}`,
  answerFilter: "callplane.answer.*",
  // callplane: the operator console's questions to the invocation replicas, asked by the API
  // (services/invocation/console-report.ts): every replica answers `inflight` (what it holds now),
  // only the one a request id names answers `request.<holder>` (how that request went)
  consoleInflight: "callplane.console.inflight",
  consoleRequest: (holderHex: string) => `callplane.console.request.${holderHex}`,
  consoleRequestFilter: "callplane.console.request.*",
  consoleAll: "callplane.console.>",
  // callplane: the console's Logs page: every service that keeps recent log lines answers with
  // those that match (plane/console-logs.ts)
  consoleLogs: "callplane.console.logs",
} as const;
/** The registries of live replicas, one per kind: each kind alone may write its own. */
export const REGISTRY_BUCKETS = {
  invocation: "callplane_replicas",
  grpcProxy: "callplane_grpc_replicas",
} as const;
export const REGISTRY_BUCKET = REGISTRY_BUCKETS.invocation;
export const pollBucket = (region: string) => `requestToFunctionVersion_${region}`;

/** The inbox prefix each kind of client uses; its grant covers that prefix and nothing else. */
export const INBOX = {
  service: (role: string) => `_INBOX_${role.replaceAll("-", "_")}`,
  /** Workers that share the worker nkey (one identity for all of them). */
  nkeyWorker: (instanceId: string) => `_INBOX_WK.${instanceId}`,
  /** A worker with its own identity: the prefix is bound to the instance its token names. */
  tokenWorker: (instanceId: string) => `_INBOX_WT.${instanceId}`,
} as const;
