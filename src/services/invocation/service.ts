// The invocation service: clients invoke functions over HTTP (contract §2), the request is queued
// to a worker through JetStream (§3.2), and the worker calls back to this replica, the one that
// holds the client's connection, to fetch the rest of the body and to stream the answer (§3.6).
//
// Everything a request needs lives in this process's memory: the client's request and response,
// the two single-use attach tokens, the window timer. The request id names this replica (ids.ts),
// so later a callback that lands elsewhere can be relayed here.
import { create, toBinary } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Kvm, type KV } from "@nats-io/kv";
import { RequestError, type NatsConnection } from "@nats-io/transport-node";
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from "node:http";
import type { Server as HttpsServer } from "node:https";
import { WorkerInvokeFunctionRequestSchema, type StringKV } from "../../gen/nvcf/worker_pb.js";
import { CallplaneError } from "../../lib/errors.js";
import { H1_CONTENT_TYPE, FramingError } from "../../lib/h1.js";
import { endToEndPairs, foldPairs, rawPairs } from "../../lib/headers.js";
import { Router, bearerToken, createHttpService, sendProblem, type RequestContext } from "../../lib/http.js";
import { holderHex, isUuid, newHolderId, newRequestId } from "../../lib/ids.js";
import { TlsReloader } from "../../lib/tls-reload.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import {
  Counter,
  Gauge,
  Histogram,
  LATENCY_BUCKETS,
  createRegistry,
  type Registry,
} from "../../lib/metrics.js";
import { dashIp, type HostPort } from "../../lib/net.js";
import { connectNats, subjects, type QueueLimits } from "../../lib/queue.js";
import { PumpLimitError, pump, readFramedHead, readPrefix } from "../../lib/stream.js";
import {
  createAuthCache,
  type AuthCacheSettings,
  type Grant,
  type GrantVersion,
} from "../../plane/auth-cache.js";
import { PendingTable } from "../../plane/pending.js";
import { ReplicaRegistry } from "../../plane/registry.js";
import { RELAYED_HEADER, Relay } from "../../plane/relay.js";
import { TokenTable, tokenHolder } from "../../plane/tokens.js";
import { WorkPublisher, askApiForQueue } from "../../plane/work-queue.js";
import { isIPv4 } from "node:net";
import { REGISTRY_BUCKETS, pollBucket, type NatsAccess } from "../../lib/nats-auth.js";

export interface InvocationServiceOptions {
  listen: HostPort;
  region: string;
  serviceDomain: string;
  /** Overrides the pod address handed to workers (WORKER_STREAM_PROPERTIES__SELF_ADDRESS upstream). */
  selfAddress?: string;
  /** How this replica reaches NATS (natsAccess(config, "invocation")). */
  nats: NatsAccess;
  apiUrl: string;
  serviceToken: string;
  inlineBodyBytes?: number;
  poll?: {
    defaultSeconds: number;
    streamingDefaultSeconds: number;
    maxSeconds: number;
    graceSeconds: number;
  };
  statusRequestTimeoutMs?: number;
  authCache?: AuthCacheSettings;
  queue: QueueLimits;
  logger?: Logger;
  registry?: Registry;
  holderId?: number;
  /**
   * Worker callbacks through the callback proxy: a TLS listener for the attach routes, with the
   * pod certificate (reloaded when its files change); its port goes into the pod address.
   */
  workerTls?: { port: number; certFile: string; keyFile: string } | undefined;
  /** The port named in the pod address when it is not the TLS listener's or the plain one's. */
  callbackPort?: number | undefined;
  /** Handed to workers as proxyURI: the callback proxy's address. */
  proxyUri?: string | undefined;
  /** Relay callbacks for requests held elsewhere (found through the replica registry). */
  relay?: { enabled: boolean; registryTtlMs?: number; idleMs?: number };
}

type PendingState = "queued" | "responding" | "done";

interface Pending {
  requestId: string;
  functionId: string;
  version: GrantVersion;
  clientReq: IncomingMessage;
  clientRes: ServerResponse;
  /** Body bytes already read past the inline part, served first on GET request-attach. */
  leftover: Buffer | undefined;
  requestToken: string | undefined;
  /** A worker is reading the rest of the client's body (GET request-attach), which has not ended. */
  bodyStreaming?: boolean;
  responseToken: string;
  state: PendingState;
  /** True for a status poll (GET /v2/nvcf/pexec/status/{id}): its message is not in the queue. */
  poll: boolean;
  /** The work message's stream sequence once its publish was confirmed (a cancel removes it by it). */
  seq?: number;
  started: number;
}

interface PollRecord {
  functionId: string;
  functionVersionId: string;
  defaultInvocationPath: string;
  functionType: string;
}

const MAX_DIRECT_RESPONSE = 5 * 1024 * 1024;
// Expect: this replica already answered it; the worker has the whole body to send
const DROP_TO_WORKER = new Set([
  "authorization",
  "host",
  "nvcf-poll-seconds",
  "nvcf-invocation-region",
  "expect",
]);

/** The replica sets these on the client's answer itself; the worker's copies are dropped. */
const OWN_RESPONSE_HEADERS = new Set(["nvcf-reqid", "nvcf-status"]);

function nvcfStatus(status: number): string {
  if (status === 202) return "in-progress";
  if (status >= 200 && status < 400) return "fulfilled";
  return "errored";
}

export interface InvocationService {
  listen(): Promise<URL>;
  close(graceMs?: number, drainDelayMs?: number): Promise<void>;
  destroy(): void;
  /** The callback target handed to workers (the pod address). */
  readonly targetUri: string;
  readonly holderId: number;
  readonly registry: Registry;
}

export function createInvocationService(opts: InvocationServiceOptions): InvocationService {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("invocation");
  const holderId = opts.holderId ?? newHolderId();
  const inlineLimit = opts.inlineBodyBytes ?? 32 * 1024;
  const poll = opts.poll ?? {
    defaultSeconds: 60,
    streamingDefaultSeconds: 1200,
    maxSeconds: 3600,
    graceSeconds: 2,
  };
  const statusTimeoutMs = opts.statusRequestTimeoutMs ?? 5000;
  const auth = createAuthCache(opts, logger, registry);

  const invocations = new Counter({
    name: "callplane_invocations_total",
    help: "Client invocations by outcome (answered: a worker answered; timeout: no worker within the window; client_gone; rejected: refused before queueing)",
    labelNames: ["outcome"],
    registers: [registry],
  });
  const firstByte = new Histogram({
    name: "callplane_invocation_first_byte_seconds",
    help: "From the client's request to the worker's response head",
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  const inFlight = new Gauge({
    name: "callplane_invocations_in_flight",
    help: "Requests this replica holds",
    registers: [registry],
  });
  const attaches = new Counter({
    name: "callplane_attach_requests_total",
    help: "Worker request-attach calls by kind and result",
    labelNames: ["kind", "result"],
    registers: [registry],
  });

  let nc: NatsConnection | undefined;
  let publisher: WorkPublisher | undefined;
  let pollKv: Promise<KV> | undefined;
  let targetUri = "";
  // An attach token names the replica that holds it (the one that minted it: for a status poll,
  // the polling replica, not the request's first holder), so a callback that lands elsewhere can be
  // relayed to it.
  const tokens = new TokenTable<{ kind: "request" | "response"; pending: Pending }>(holderId);
  const attachToken = (pending: Pending, kind: "request" | "response") => tokens.mint({ kind, pending });
  let replicas: ReplicaRegistry | undefined;
  let relay: Relay | undefined;
  let tlsReloader: TlsReloader | undefined;
  const pendings = new PendingTable<Pending>(inFlight);

  function pollWindow(req: IncomingMessage): number {
    const raw = req.headers["nvcf-poll-seconds"];
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

  function pollKvBucket(): Promise<KV> {
    pollKv ??= new Kvm(nc!).create(pollBucket(opts.region), {
      history: 1,
      ttl: 3600_000,
      storage: "memory" as never,
      // as many copies as the work queues: on a cluster, polls survive the loss of a node
      replicas: opts.queue.replicas,
    });
    return pollKv;
  }

  function forwardHeaders(req: IncomingMessage, pollSeconds: number): StringKV[] {
    const out = endToEndPairs(rawPairs(req.rawHeaders), { drop: DROP_TO_WORKER }).map(
      ([key, value]) => ({ key, value }) as StringKV,
    );
    out.push(
      { key: "NVCF-POLL-SECONDS", value: String(pollSeconds) } as StringKV,
      { key: "NVCF-INVOCATION-REGION", value: opts.region } as StringKV,
    );
    return out;
  }

  function release(p: Pending): void {
    if (p.state === "done") return;
    p.state = "done";
    pendings.release(p);
    tokens.delete(p.responseToken);
    tokens.delete(p.requestToken);
  }

  /** Tells the worker to stop and removes the message if no worker took it yet. */
  function cancel(p: Pending, why: string): void {
    // A status poll that ends (client left, window over) does not end the request: the client may
    // poll again, and the worker gives up on its own when polls stop coming.
    if (p.poll) return;
    publisher?.cancel(p.version.functionVersionId, p.requestId, why, p.seq);
  }

  function track(p: Pending, windowSeconds: number): void {
    p.clientRes.once("close", () => {
      if (p.state === "done") return;
      const wasQueued = p.state === "queued";
      if (!p.clientRes.writableFinished) {
        invocations.inc({ outcome: "client_gone" });
        cancel(p, wasQueued ? "client left while queued" : "client left during the response");
      }
      release(p);
    });
    pendings.add(p, (windowSeconds + poll.graceSeconds) * 1000, () => {
      if (p.state !== "queued") return;
      invocations.inc({ outcome: "timeout" });
      logger.info(
        { requestId: p.requestId, functionId: p.functionId, windowSeconds },
        "no worker answered within the window",
      );
      sendProblem(
        p.clientRes,
        new CallplaneError(
          "INVOCATION_TIMEOUT",
          p.poll
            ? `the worker did not answer the status request within ${windowSeconds} s; poll again`
            : p.bodyStreaming
              ? `a worker took request ${p.requestId}, but the request body did not finish arriving within ${windowSeconds} s, so no answer could come; the request was cancelled. Send the body without pausing`
              : `no worker answered function ${p.functionId} (version ${p.version.functionVersionId}) within ${windowSeconds} s; the request was cancelled and removed from the queue. Check that the function is deployed and its instances are ACTIVE (callplane deploy get)`,
          { extra: { requestId: p.requestId } },
        ),
        logger,
        { "nvcf-reqid": p.requestId },
      );
      cancel(p, "window ended");
      release(p);
    });
  }

  function workMessage(
    p: Pending,
    method: string,
    path: string,
    headers: StringKV[],
    body: Buffer | undefined,
    grant: Pick<Grant, "ncaId" | "subject">,
  ): Uint8Array {
    return toBinary(
      WorkerInvokeFunctionRequestSchema,
      create(WorkerInvokeFunctionRequestSchema, {
        requestId: p.requestId,
        ncaId: grant.ncaId,
        subject: grant.subject,
        maxDirectResponseSizeBytes: MAX_DIRECT_RESPONSE,
        requestTime: timestampFromMs(p.started),
        ...(body && body.length ? { requestBody: body } : {}),
        requestHeaders: headers,
        requestMethod: method,
        requestPath: path,
        statelessConfig: {
          connectionConfigs: [
            {
              config: {
                case: "http1Config",
                value: {
                  targetURI: targetUri,
                  ...(opts.proxyUri ? { proxyURI: opts.proxyUri } : {}),
                  responseAuthorizationToken: p.responseToken,
                  ...(p.requestToken ? { requestAuthorizationToken: p.requestToken } : {}),
                },
              },
            },
          ],
        },
      }),
    );
  }

  async function invoke(
    ctx: RequestContext,
    functionId: string,
    functionVersionId: string | undefined,
  ): Promise<void> {
    const { req, res } = ctx;
    const started = Date.now();
    const windowSeconds = pollWindow(req);
    const apiKey = bearerToken(req);
    if (!isUuid(functionId))
      throw new CallplaneError("FUNCTION_NOT_FOUND", `function id "${functionId}" is not a UUID`);
    if (functionVersionId !== undefined && !isUuid(functionVersionId))
      throw new CallplaneError("VERSION_NOT_FOUND", `version id "${functionVersionId}" is not a UUID`);
    const grant = await auth.authorize(apiKey, functionId, functionVersionId);
    const versions = grant.functionVersions;
    const version =
      versions.length === 1 ? versions[0] : versions[Math.floor(Math.random() * versions.length)];
    // The inline part of the body must arrive within the poll window: a client that stops sending
    // before it would otherwise hold its connection with no window running.
    let stalled: NodeJS.Timeout | undefined;
    const body = await Promise.race([
      readPrefix(req, inlineLimit),
      new Promise<never>((_, reject) => {
        stalled = setTimeout(() => {
          res.setHeader("connection", "close");
          reject(
            new CallplaneError(
              "REQUEST_TIMEOUT",
              `the request body did not arrive within the poll window (${windowSeconds} s); send it without pausing`,
            ),
          );
        }, windowSeconds * 1000);
      }),
    ]).finally(() => clearTimeout(stalled));
    if (res.destroyed) return;
    // readPrefix stops at the limit before it can see the end, so a body of exactly inlineLimit
    // bytes reads as unfinished; its Content-Length says nothing is left for GET request-attach.
    const complete =
      body.ended || (body.rest === undefined && req.headers["content-length"] === String(body.head.length));
    const q = req.url!.indexOf("?");
    const p: Pending = {
      requestId: newRequestId(holderId),
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
    };
    // The worker may call back as soon as the message is out, so the tokens are live before publishing.
    p.responseToken = attachToken(p, "response");
    if (!complete) p.requestToken = attachToken(p, "request");
    const path = q === -1 ? version.defaultInvocationPath : version.defaultInvocationPath + req.url!.slice(q);
    const data = workMessage(p, req.method!, path, forwardHeaders(req, windowSeconds), body.head, grant);
    track(p, windowSeconds);
    try {
      p.seq = await publisher!.publish(version.functionVersionId, p.requestId, data);
    } catch (err) {
      release(p);
      invocations.inc({ outcome: "rejected" });
      throw err;
    }
    ctx.log.debug(
      { requestId: p.requestId, functionId, functionVersionId: version.functionVersionId },
      "queued",
    );
  }

  const NIL_UUID = "00000000-0000-0000-0000-000000000000";

  async function status(ctx: RequestContext): Promise<void> {
    const { req, res, params } = ctx;
    const requestId = params.requestId;
    const windowSeconds = pollWindow(req);
    const apiKey = bearerToken(req);
    if (!isUuid(requestId))
      throw new CallplaneError(
        "REQUEST_NOT_FOUND",
        `"${requestId}" is not a request id (a UUID from the NVCF-REQID header)`,
      );
    const entry = await (await pollKvBucket()).get(requestId).catch((err: unknown) => {
      throw new CallplaneError(
        "UNAVAILABLE",
        `the record of request ${requestId} could not be read (NATS did not answer in time); poll again shortly`,
        { cause: err },
      );
    });
    if (!entry || entry.operation !== "PUT") {
      // The key is checked first all the same (against no function: the API checks the key and its
      // scope before the function), so that whether a request id is live is not told to a caller
      // without a valid key.
      await auth.authorize(apiKey, NIL_UUID).catch((err: unknown) => {
        if (!(err instanceof CallplaneError && err.code === "FUNCTION_NOT_FOUND")) throw err;
      });
      throw new CallplaneError(
        "REQUEST_NOT_FOUND",
        `no request ${requestId} is in progress: it is unknown, finished (a final answer is delivered once), or older than 1 h`,
      );
    }
    const rec = entry.json<PollRecord>();
    const grant = await auth.authorize(apiKey, rec.functionId, rec.functionVersionId);
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
    };
    p.responseToken = attachToken(p, "response");
    const data = workMessage(
      p,
      "GET",
      rec.defaultInvocationPath,
      forwardHeaders(req, windowSeconds),
      undefined,
      grant,
    );
    track(p, windowSeconds);
    try {
      await nc!.request(subjects.polling(rec.functionVersionId, requestId), data, {
        timeout: statusTimeoutMs,
      });
    } catch (err) {
      release(p);
      // Nobody listens for this request's polls any more: the worker finished it, gave up on it
      // (no poll came in time) or is gone. It can never answer, so the record goes and the client
      // gets a final 404 rather than "poll again" forever.
      if (err instanceof RequestError && err.isNoResponders()) {
        await (await pollKvBucket()).purge(requestId).catch(() => undefined);
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

  /** GET /v2/nvcf/worker/request-attach: the worker fetches the body beyond the inline part. */
  async function attachRequest(ctx: RequestContext): Promise<void> {
    const { res } = ctx;
    const p = await claim(ctx, "request");
    if (!p) return;
    if (p.state === "done" || p.clientRes.destroyed) {
      attaches.inc({ kind: "request", result: "client_gone" });
      throw new CallplaneError("CLIENT_GONE", `the client of request ${p.requestId} went away`);
    }
    attaches.inc({ kind: "request", result: "ok" });
    res.writeHead(200, { "content-type": "application/octet-stream", "nvcf-reqid": p.requestId });
    if (p.leftover) res.write(p.leftover);
    p.leftover = undefined;
    p.bodyStreaming = true;
    try {
      await pump(p.clientReq, res);
      p.bodyStreaming = false;
      res.end();
    } catch (err) {
      ctx.log.debug({ requestId: p.requestId, err }, "request body stream to the worker broke");
      res.destroy();
    }
  }

  /**
   * The pending request an attach token belongs to. A token this replica did not mint, naming
   * another live replica, is relayed there (and undefined returned); anything else is refused.
   */
  async function claim(ctx: RequestContext, kind: "request" | "response"): Promise<Pending | undefined> {
    const { req, res } = ctx;
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
      return entry.pending;
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
      await relay.forward(req, res, holder);
      return undefined;
    }
    attaches.inc({ kind, result: "bad_token" });
    throw new CallplaneError(
      "ATTACH_TOKEN_INVALID",
      "The provided authorization token is invalid or has expired",
    );
  }

  /** POST /v2/nvcf/worker/request-attach: the worker streams the framed answer to the waiting client. */
  async function attachResponse(ctx: RequestContext): Promise<void> {
    const { req, res } = ctx;
    const p = await claim(ctx, "response");
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
      failClient(p, `the worker sent content type ${type ?? "(none)"}`);
      throw new CallplaneError(
        "ATTACH_FRAMING_INVALID",
        `send the response as ${H1_CONTENT_TYPE} (an HTTP/1.1 message), not ${type ?? "no content type"}`,
      );
    }
    p.state = "responding";
    pendings.stopWindow(p);
    let framed;
    try {
      framed = await readFramedHead(req);
    } catch (err) {
      attaches.inc({ kind: "response", result: "bad_framing" });
      const detail =
        err instanceof FramingError
          ? err.message
          : `the framed response broke off: ${(err as Error).message}`;
      failClient(p, detail);
      throw new CallplaneError("ATTACH_FRAMING_INVALID", detail);
    }
    const { head, rest } = framed;
    if (head.contentLength !== undefined && rest.length > head.contentLength) {
      // Bytes past the declared length would reach the client's keep-alive connection as the start
      // of a next response. The head is not out yet, so the client can still get a clean 502.
      attaches.inc({ kind: "response", result: "bad_framing" });
      const detail = `the framed body is longer than its Content-Length (${head.contentLength} bytes)`;
      failClient(p, detail);
      throw new CallplaneError("ATTACH_FRAMING_INVALID", detail);
    }
    const client = p.clientRes;
    const headers: OutgoingHttpHeaders = foldPairs(
      endToEndPairs(head.headers, { drop: OWN_RESPONSE_HEADERS }),
    );
    headers["nvcf-reqid"] = p.requestId;
    headers["nvcf-status"] = nvcfStatus(head.status);
    headers["access-control-expose-headers"] = "nvcf-reqid";
    if (head.status === 202) {
      try {
        await (
          await pollKvBucket()
        ).put(
          p.requestId,
          JSON.stringify({
            functionId: p.functionId,
            functionVersionId: p.version.functionVersionId,
            defaultInvocationPath: p.version.defaultInvocationPath,
            functionType: p.version.functionType,
          } satisfies PollRecord),
        );
      } catch (err) {
        // Without its record no status poll can find the request: a 202 now would be followed by
        // 404s. The client hears why instead; a new request is cancelled (nobody can wait for it),
        // a poll's record is the one already written, so its client may poll again.
        logger.error({ requestId: p.requestId, err }, "could not record the in-progress request for polling");
        req.resume();
        sendProblem(
          p.clientRes,
          new CallplaneError(
            "UNAVAILABLE",
            p.poll
              ? `request ${p.requestId} is still in progress, but its poll record could not be refreshed (NATS did not answer in time); poll again shortly`
              : `request ${p.requestId} went in progress, but the record status polls find it by could not be written (NATS did not answer in time), so it was cancelled; invoke again shortly`,
            { cause: err, extra: { requestId: p.requestId } },
          ),
          logger,
          { "nvcf-reqid": p.requestId },
        );
        cancel(p, "poll record not written");
        release(p);
        throw new CallplaneError(
          "CLIENT_GONE",
          `the 202 for ${p.requestId} was not delivered: its poll record could not be written`,
        );
      }
    } else if (p.poll) {
      // Purged before the client sees the final answer: a poll sent right after it must find no
      // record (404), not reach a worker that has finished with the request (and would acknowledge
      // the poll but never answer it, leaving the client to wait for the window).
      await pollKvBucket()
        .then((kv) => kv.purge(p.requestId))
        .catch((err: unknown) =>
          logger.warn({ requestId: p.requestId, err }, "purge of the poll record failed"),
        );
    }
    firstByte.observe((Date.now() - p.started) / 1000);
    invocations.inc({ outcome: "answered" });
    attaches.inc({ kind: "response", result: "ok" });
    client.writeHead(head.status, headers);
    const bodyless = head.status === 204 || head.status === 304 || p.clientReq.method === "HEAD";
    let ok = true;
    let framingError: string | undefined;
    if (!bodyless) {
      if (rest.length) client.write(rest);
      const limit = head.contentLength === undefined ? undefined : head.contentLength - rest.length;
      try {
        const { bytes } = await pump(req, client, limit === undefined ? {} : { limit });
        // The worker's body ended short of its Content-Length. The client's head (with that
        // length) is out: ending the response normally would leave the client waiting on a
        // keep-alive connection for bytes that never come. Cut it instead.
        if (limit !== undefined && bytes < limit) {
          ok = false;
          framingError = `the framed body ended after ${rest.length + bytes} of its ${head.contentLength} bytes (Content-Length)`;
        }
      } catch (err) {
        ok = false;
        if (err instanceof PumpLimitError)
          framingError = `the framed body is longer than its Content-Length (${head.contentLength} bytes)`;
        ctx.log.debug(
          { requestId: p.requestId, err: (err as Error).message },
          err instanceof PumpLimitError
            ? "the worker sent more than Content-Length"
            : "response stream broke",
        );
      }
    } else {
      req.resume();
    }
    if (!ok || client.destroyed) {
      client.destroy();
      release(p);
      if (!res.headersSent) {
        // The worker is told why: its framing was wrong (400), or the client went away (410).
        const err = framingError
          ? new CallplaneError("ATTACH_FRAMING_INVALID", framingError)
          : new CallplaneError(
              "CLIENT_GONE",
              `the response to ${p.requestId} could not be delivered in full`,
            );
        if (framingError) attaches.inc({ kind: "response", result: "bad_framing" });
        sendProblem(res, err, ctx.log, { connection: "close" });
      }
      return;
    }
    client.end();
    await new Promise<void>((resolve) => {
      if (client.writableFinished) resolve();
      else client.once("close", () => resolve());
    });
    release(p);
    res.writeHead(200, { "content-type": "application/json", "content-length": 2 });
    res.end("{}");
  }

  /** The worker produced no valid answer: the client gets a 502 rather than waiting for the window. */
  function failClient(p: Pending, why: string): void {
    if (p.state === "done") return;
    sendProblem(
      p.clientRes,
      new CallplaneError(
        "WORKER_RESPONSE_INVALID",
        `the worker's answer to request ${p.requestId} was malformed (${why})`,
        { extra: { requestId: p.requestId } },
      ),
      logger,
      { "nvcf-reqid": p.requestId },
    );
    release(p);
  }

  const router = new Router()
    .add("POST", "/v2/nvcf/pexec/functions/:fid", (ctx) => invoke(ctx, ctx.params.fid, undefined))
    .add("POST", "/v2/nvcf/pexec/functions/:fid/versions/:vid", (ctx) =>
      invoke(ctx, ctx.params.fid, ctx.params.vid),
    )
    .add("GET", "/v2/nvcf/pexec/status/:requestId", status)
    .add("GET", "/v2/nvcf/worker/request-attach", attachRequest, { duringDrain: true })
    .add("POST", "/v2/nvcf/worker/request-attach", attachResponse, { duringDrain: true });

  const ready = () => nc !== undefined && !nc.isClosed();
  const http = createHttpService({
    name: "invocation",
    listen: opts.listen,
    logger,
    registry,
    router,
    ready,
  });
  // With the callback proxy, workers' callbacks arrive on a TLS listener of their own, which serves
  // nothing but the attach routes (and /health).
  const workerRouter = new Router()
    .add("GET", "/v2/nvcf/worker/request-attach", attachRequest, { duringDrain: true })
    .add("POST", "/v2/nvcf/worker/request-attach", attachResponse, { duringDrain: true });
  let workerHttp: ReturnType<typeof createHttpService> | undefined;
  if (opts.workerTls) {
    tlsReloader = new TlsReloader(
      "invocation-worker-listener",
      { certFile: opts.workerTls.certFile, keyFile: opts.workerTls.keyFile },
      (m) =>
        (workerHttp?.server as HttpsServer | undefined)?.setSecureContext({
          cert: m.cert,
          key: m.key,
          minVersion: "TLSv1.2",
        }),
      logger,
      registry,
    );
    workerHttp = createHttpService({
      name: "invocation-worker-tls",
      listen: { host: opts.listen.host, port: opts.workerTls.port },
      logger,
      registry: createRegistry("invocation-worker-tls", { defaultMetrics: false }),
      metrics: false,
      router: workerRouter,
      tls: {
        cert: tlsReloader.material.cert,
        key: tlsReloader.material.key,
        minVersion: "TLSv1.2",
        ALPNProtocols: ["http/1.1"],
      },
      ready,
    });
  }

  return {
    get targetUri() {
      return targetUri;
    },
    holderId,
    registry,
    async listen() {
      nc = await connectNats(opts.nats, `invocation-${holderHex(holderId)}`, logger);
      publisher = new WorkPublisher(
        nc,
        opts.region,
        opts.queue,
        logger,
        askApiForQueue(opts.apiUrl, opts.serviceToken),
      );
      const url = await http.listen();
      const tlsUrl = await workerHttp?.listen();
      if (opts.selfAddress) {
        targetUri = opts.selfAddress.replace(/\/+$/, "");
      } else {
        if (!isIPv4(opts.listen.host) || opts.listen.host === "0.0.0.0") {
          throw new Error(
            `cannot build the pod address from listen host ${opts.listen.host}: listen on the pod's IPv4 address (POD_IP) or set invocation.selfAddress`,
          );
        }
        const port = opts.callbackPort ?? (tlsUrl ? tlsUrl.port : url.port);
        // the scheme stays http even with TLS to the pod: the worker never dials the pod itself, it
        // sends a forward-proxy request to the callback proxy, which opens TLS to the pod
        targetUri = `http://${dashIp(opts.listen.host)}.invocation.${opts.serviceDomain}:${port}`;
      }
      if (opts.relay?.enabled) {
        replicas = new ReplicaRegistry(
          nc,
          { holder: holderId, relayUrl: url.origin },
          logger,
          opts.relay.registryTtlMs,
          REGISTRY_BUCKETS.invocation,
          opts.queue.replicas,
        );
        await replicas.start();
        relay = new Relay(replicas, holderId, opts.relay.idleMs ?? 300_000, logger);
      }
      logger.info(
        { targetUri, proxyUri: opts.proxyUri, holder: holderHex(holderId), relay: !!relay },
        "workers call back at the pod address",
      );
      return url;
    },
    async close(graceMs = 30_000, drainDelayMs = 0) {
      // Drain first, then leave the registry: while draining, callbacks for the requests this
      // replica still holds may land on another replica and must be relayed here. (It takes no new
      // requests meanwhile, so nothing else is relayed to it.) The clients' listener drains first
      // (readiness fails, requests are still taken for the drain delay, then refused, and the
      // requests in flight finish); the workers' listener stays open all that time, since those
      // requests' callbacks arrive on it, and closes after.
      await http.close(graceMs, drainDelayMs);
      await workerHttp?.close(1000);
      await replicas?.close();
      for (const p of pendings.values()) {
        cancel(p, "replica stopping");
        p.clientRes.destroy();
        release(p);
      }
      tlsReloader?.close();
      tokens.close();
      await relay?.close();
      await auth.close();
      await nc?.drain().catch(() => undefined);
    },
    destroy() {
      http.destroy();
      workerHttp?.destroy();
      tlsReloader?.close();
      relay?.destroy();
      // destroy, not close: close() waits for lookups in flight; and it is safe after close()
      auth.destroy();
      void nc?.close();
    },
  };
}
