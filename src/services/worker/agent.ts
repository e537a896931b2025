// The worker agent: the sidecar beside an inference server. It waits for the server's health,
// pulls work for its function version by credit (never more messages than free slots), keeps each
// message alive with in-progress acks while it works, answers cancels, and acks when done.
import { jetstream, type Consumer, type JsMsg } from "@nats-io/jetstream";
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { join } from "node:path";
import { createSecureContext, rootCertificates } from "node:tls";
import { setTimeout as sleep } from "node:timers/promises";
import { Pool, request } from "undici";
import { grpcHealthCheck } from "./grpc-health.js";
import { Router, createHttpService, sendJson } from "../../lib/http/index.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import {
  Counter,
  Gauge,
  Histogram,
  LATENCY_BUCKETS,
  createRegistry,
  type Registry,
} from "../../lib/metrics.js";
import { readFileSync } from "node:fs";
import { INBOX, workerAuthToken, type NatsAccess } from "../../lib/nats/index.js";
import { podAwareLookup } from "../../lib/net/index.js";
import { connectNats, subjects } from "../../lib/nats/index.js";
import { CallbackClient } from "./callback.js";
import type { WorkerConfig } from "./config.js";
import { OutputSlot } from "./output-slot.js";
import { StatefulSession } from "./stateful.js";
import { WorkItem, type WorkOutcome } from "./work.js";
import { formatHostPort } from "../../lib/net/index.js";

export interface WorkerAgent {
  /** Starts health endpoints, waits for the inference server, then starts pulling work. */
  start(): Promise<{ health: URL }>;
  close(graceMs?: number): Promise<void>;
  destroy(): void;
  readonly registry: Registry;
}

/** How the worker connects: the shared nkey, or the identity token in its file, read at every (re)connect. */
/**
 * How long one ack waits for JetStream's confirmation, and for how long it is sent again: long
 * enough for a NATS cluster to elect a new consumer leader and for a worker whose node went to
 * reconnect to another (seconds each).
 */
const ACK_TIMEOUT_MS = 2000;
const ACK_RETRY_MS = 60_000;
const ACK_BODY = new TextEncoder().encode("+ACK");

export function workerNatsAccess(cfg: WorkerConfig): NatsAccess {
  const a = cfg.natsAuth;
  if (a.kind === "nkey") {
    return {
      url: cfg.natsUrl,
      caPem: cfg.natsCaPem,
      auth: { nkeySeed: a.seed },
      inboxPrefix: INBOX.nkeyWorker(cfg.instanceId || String(process.pid)),
    };
  }
  return {
    url: cfg.natsUrl,
    caPem: cfg.natsCaPem,
    auth: { token: () => workerAuthToken(a.account, readFileSync(a.tokenFile, "utf8").trim()) },
    inboxPrefix: INBOX.tokenWorker(cfg.instanceId),
  };
}

export function createWorkerAgent(
  cfg: WorkerConfig,
  opts: { logger?: Logger; registry?: Registry } = {},
): WorkerAgent {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? createRegistry("worker");
  const items = new Counter({
    name: "callplane_worker_requests_total",
    help: "Work messages handled, by outcome",
    labelNames: ["outcome"],
    registers: [registry],
  });
  const busy = new Gauge({
    name: "callplane_worker_busy_slots",
    help: "Requests in progress (of MAX_REQUEST_CONCURRENCY)",
    registers: [registry],
  });
  const duration = new Histogram({
    name: "callplane_worker_request_seconds",
    help: "From pull to ack",
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  const inference = new Pool(
    `http://${formatHostPort({ host: cfg.inference.host, port: cfg.inference.port })}`,
    {
      connections: cfg.concurrency + 2,
      // undici's default: inference servers often close idle connections after 5 s without saying
      // so in a Keep-Alive header (uvicorn), and a request sent on a closing connection would fail
      keepAliveTimeout: 4_000,
    },
  );
  const lookup = podAwareLookup(cfg.hostMap, cfg.serviceDomain);
  // NVCF_PROXY_CA_PEM extends the system's roots rather than replacing them, so a proxy with a
  // public certificate still verifies. The context is built once: given as `ca`, the ~140 system
  // roots were parsed again for every new connection (10-20 ms of blocked event loop each; a burst
  // of new connections under load stalled every request for up to 800 ms).
  const secureContext = cfg.proxyCaPem
    ? createSecureContext({ ca: [...rootCertificates, cfg.proxyCaPem] })
    : undefined;
  const callbacks = new CallbackClient({ lookup, secureContext });
  const inflight = new Map<string, WorkItem | StatefulSession>();
  const freeSlots: OutputSlot[] = [];
  let nc: NatsConnection | undefined;
  let cancelSub: Subscription | undefined;
  let ready = false;
  let stopping = false;
  let active = 0;
  /** Acks on their way to JetStream (ackConfirmed); a graceful stop waits for them. */
  const acks = new Set<Promise<void>>();
  let slotFreed: (() => void) | undefined;
  let currentFetch: { stop(): void } | undefined;
  let loop: Promise<void> | undefined;
  const stopController = new AbortController();

  const router = new Router()
    .add("GET", "/v1/health/live", ({ res }) => sendJson(res, 200, { status: "live" }))
    .add("GET", "/v1/health/ready", ({ res }) =>
      sendJson(res, ready && !stopping ? 200 : 503, {
        status: ready && !stopping ? "ready" : stopping ? "stopping" : "starting",
        busy: active,
        concurrency: cfg.concurrency,
      }),
    );
  const http = createHttpService({
    name: "worker",
    listen: cfg.healthListen,
    logger,
    registry,
    router,
    ready: () => ready,
  });

  /** One health check: the HTTP endpoint's status, or grpc.health.v1 when the protocol is gRPC. */
  async function checkHealth(url: string): Promise<void> {
    if (cfg.health.protocol === "gRPC") {
      await grpcHealthCheck(cfg.inference.host, cfg.health.port, {
        timeoutMs: cfg.health.timeoutMs,
        signal: stopController.signal,
      });
      return;
    }
    const res = await request(url, {
      headersTimeout: cfg.health.timeoutMs,
      bodyTimeout: cfg.health.timeoutMs,
      signal: stopController.signal,
    });
    await res.body.dump();
    if (res.statusCode !== cfg.health.expectedStatus)
      throw new Error(`status ${res.statusCode}, expected ${cfg.health.expectedStatus}`);
  }

  async function waitForInference(): Promise<void> {
    const deadline = Date.now() + cfg.health.readyTimeoutMs;
    const hostPort = formatHostPort({ host: cfg.inference.host, port: cfg.health.port });
    const url =
      cfg.health.protocol === "gRPC"
        ? `grpc://${hostPort} (grpc.health.v1.Health/Check)`
        : `http://${hostPort}${cfg.health.path}`;
    let last = "";
    let delay = 100;
    while (!stopController.signal.aborted) {
      try {
        await checkHealth(url);
        logger.info({ url }, "inference server is healthy");
        return;
      } catch (err) {
        last = (err as Error).message;
      }
      if (Date.now() > deadline)
        throw new Error(
          `the inference server at ${url} did not become healthy within ${cfg.health.readyTimeoutMs / 1000} s (last: ${last})`,
        );
      await sleep(delay, undefined, { signal: stopController.signal }).catch(() => undefined);
      delay = Math.min(delay * 2, 1000);
    }
  }

  /**
   * The control plane creates the version's queue (workers may not); until it exists, wait.
   */
  async function waitForConsumer(conn: NatsConnection): Promise<Consumer> {
    const stream = subjects.stream(cfg.region, cfg.functionVersionId);
    const name = subjects.consumer(cfg.region, cfg.functionVersionId);
    for (let said = false; ;) {
      try {
        return await jetstream(conn).consumers.get(stream, name);
      } catch (err) {
        if (!/not found/i.test(String(err)) || stopController.signal.aborted) throw err;
        if (!said)
          logger.info({ stream, consumer: name }, "waiting for the control plane to create the work queue");
        said = true;
        await sleep(1000, undefined, { signal: stopController.signal });
      }
    }
  }

  async function handle(m: JsMsg): Promise<void> {
    const started = performance.now();
    // in progress until the ack is confirmed (ackConfirmed stops it): a message whose ack is still
    // on its way must not be redelivered meanwhile
    const keepAlive = setInterval(() => {
      try {
        if (nc && !nc.isClosed()) m.working();
      } catch {
        // the connection is closing: nothing to keep alive
      }
    }, cfg.keepAliveMs);
    let acking = false;
    let outcome: WorkOutcome = "failed";
    let item: WorkItem | StatefulSession | undefined;
    const slot = freeSlots.pop();
    try {
      // the kind of work: a gRPC session (statefulConfig) or one HTTP request (statelessConfig)
      const req = WorkItem.decode(m.data);
      item = req.statefulConfig
        ? new StatefulSession({ cfg, logger, nc: nc!, lookup, secureContext }, req)
        : new WorkItem({ cfg, logger, callbacks, inference, nc: nc! }, req, slot);
      inflight.set(item.requestId, item);
      outcome = await item.run();
    } catch (err) {
      if (item?.abort.signal.aborted) {
        // a cancel (the client left, or its window ended) cut the work short: expected, not a fault
        outcome = "cancelled";
        logger.info({ requestId: item.requestId, err: (err as Error).message }, "work cancelled");
      } else logger.error({ err, requestId: item?.requestId }, "work failed");
    } finally {
      if (item) inflight.delete(item.requestId);
      // acked even on failure (contract §3.2): a redelivery would find the tokens used, and run the
      // inference again; not after destroy() closed the connection (the ack could only fail)
      if (nc && !nc.isClosed()) {
        acking = true;
        ackConfirmed(m, item?.requestId, keepAlive);
      }
      if (!acking) clearInterval(keepAlive);
      items.inc({ outcome });
      duration.observe((performance.now() - started) / 1000);
      if (slot) {
        await slot.reset().then(
          () => freeSlots.push(slot),
          (err: unknown) => logger.warn({ dir: slot.dir, err }, "cannot empty an output folder; dropping it"),
        );
      }
    }
  }

  /**
   * Acknowledges a message and waits for JetStream to confirm it, asking again when no answer
   * comes. A plain ack is one publish that nobody confirms: on a NATS cluster, one sent while the
   * consumer's leader is lost (a node killed, its leader moving) is dropped, and the message is
   * redelivered after the ack wait and run a second time. The ack goes on in the background (the
   * slot is free at once); `keepAlive` keeps the message in progress until it is confirmed.
   */
  function ackConfirmed(m: JsMsg, requestId: string | undefined, keepAlive: NodeJS.Timeout): void {
    // the ack subject ($JS.ACK...): JsMsg's own ackAck() sends once only, so it is asked by hand
    const subject = (m as JsMsg & { reply: string }).reply;
    const until = Date.now() + ACK_RETRY_MS;
    const p = (async () => {
      try {
        for (let attempt = 1; ; attempt++) {
          const conn = nc;
          if (!conn || conn.isClosed()) return;
          try {
            await conn.request(subject, ACK_BODY, { timeout: ACK_TIMEOUT_MS });
            if (attempt > 1) logger.info({ requestId, attempts: attempt }, "ack confirmed");
            return;
          } catch (err) {
            if (Date.now() > until || conn.isClosed()) {
              logger.warn(
                { requestId, attempts: attempt, err: (err as Error).message },
                "JetStream did not confirm the ack; the message may be delivered again",
              );
              return;
            }
            logger.debug(
              { requestId, attempt, err: (err as Error).message },
              "ack unconfirmed; sending it again",
            );
            await sleep(Math.min(250 * attempt, 1000));
          }
        }
      } finally {
        clearInterval(keepAlive);
      }
    })();
    acks.add(p);
    void p.finally(() => acks.delete(p));
  }

  async function pullLoop(consumer: Consumer): Promise<void> {
    while (!stopping) {
      const free = cfg.concurrency - active;
      if (free <= 0) {
        await new Promise<void>((resolve) => (slotFreed = resolve));
        continue;
      }
      let batch;
      try {
        batch = await consumer.fetch({ max_messages: free, expires: 30_000 });
      } catch (err) {
        if (stopping) return;
        logger.warn({ err: (err as Error).message }, "pulling work failed; retrying");
        await sleep(1000);
        continue;
      }
      currentFetch = batch;
      try {
        for await (const m of batch) {
          active++;
          busy.set(active);
          void handle(m).finally(() => {
            active--;
            busy.set(active);
            const f = slotFreed;
            slotFreed = undefined;
            f?.();
          });
        }
      } catch (err) {
        if (stopping) return;
        logger.warn({ err: (err as Error).message }, "the pull was interrupted; pulling again");
        await sleep(500);
      } finally {
        currentFetch = undefined;
      }
    }
  }

  return {
    registry,
    async start() {
      const health = await http.listen();
      for (let k = 0; k < cfg.concurrency; k++)
        freeSlots.push(await OutputSlot.create(join(cfg.responseDir, `slot-${k}`)));
      await waitForInference();
      nc = await connectNats(
        workerNatsAccess(cfg),
        `worker_${cfg.functionVersionId}_${cfg.instanceId || process.pid}`,
        logger,
      );
      cancelSub = nc.subscribe(subjects.cancel(cfg.functionVersionId), {
        callback: (err, m) => {
          if (err) return;
          const id = m.string();
          const item = inflight.get(id);
          if (item) {
            logger.info({ requestId: id }, "cancel received: stopping the inference call");
            item.abort.abort();
          }
        },
      });
      const consumer = await waitForConsumer(nc);
      ready = true;
      loop = pullLoop(consumer);
      loop.catch((err: unknown) => logger.error({ err }, "pull loop stopped"));
      logger.info(
        {
          functionId: cfg.functionId,
          functionVersionId: cfg.functionVersionId,
          concurrency: cfg.concurrency,
        },
        "worker is pulling work",
      );
      return { health };
    },
    async close(graceMs = 30_000) {
      stopping = true;
      ready = false;
      stopController.abort();
      currentFetch?.stop();
      slotFreed?.();
      const deadline = Date.now() + graceMs;
      while ((active > 0 || acks.size > 0) && Date.now() < deadline) await sleep(100);
      for (const item of inflight.values()) item.abort.abort();
      cancelSub?.unsubscribe();
      for (const s of freeSlots) s.close();
      await nc?.drain().catch(() => undefined);
      await http.close(1000);
      await Promise.all([inference.close(), callbacks.close()]);
    },
    destroy() {
      stopping = true;
      stopController.abort();
      for (const item of inflight.values()) item.abort.abort();
      http.destroy();
      // closed after the work just aborted has run its last steps (acks, unsubscribes): a publish
      // made while nats.js closes is flushed after its socket ended, an uncaught "write after end"
      setImmediate(() => void nc?.close());
      void inference.destroy();
      void callbacks.agent.destroy();
    },
  };
}
