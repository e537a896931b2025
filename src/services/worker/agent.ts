// The worker agent: the sidecar beside an inference server. It waits for the server's health,
// pulls work for its function version by credit (never more messages than free slots), keeps each
// message alive with in-progress acks while it works, answers cancels, and acks when done.
//
// This module is the lifecycle shell: start, close, destroy and the wiring. The health wait is
// inference-health.ts, the queue (pull loop, acks) queue-consumer.ts, one message dispatch.ts.
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { createSecureContext, rootCertificates } from "node:tls";
import { Pool } from "undici";
import { Router, createHttpService, sendJson } from "../../lib/http/index.js";
import { silentLogger, type Logger } from "../../lib/log.js";
import type { Registry } from "../../lib/metrics.js";
import {
  INBOX,
  Replies,
  connectNats,
  subjects,
  workerAuthToken,
  type NatsAccess,
} from "../../lib/nats/index.js";
import { formatHostPort, podAwareLookup } from "../../lib/net/index.js";
import type { Tracing } from "../../lib/tracing/index.js";
import { CallbackClient } from "./callback.js";
import { NatsAnswers } from "./nats-answer.js";
import type { WorkerConfig } from "./config.js";
import { WorkDispatcher, type InflightWork } from "./dispatch.js";
import { waitForInference } from "./inference-health.js";
import { workerMetrics, workerRegistry } from "./metrics.js";
import { OutputSlot } from "./output-slot.js";
import { ConfirmedAcks, QueueConsumer, waitForConsumer } from "./queue-consumer.js";

export interface WorkerAgent {
  /** Starts health endpoints, waits for the inference server, then starts pulling work. */
  start(): Promise<{ health: URL }>;
  close(graceMs?: number): Promise<void>;
  destroy(): void;
  readonly registry: Registry;
}

/** How the worker connects: the shared nkey, or the identity token in its file, read at every (re)connect. */
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

/** What start() brings up, in order, and close() and destroy() take down: the agent's mutable state. */
class AgentState {
  ready = false;
  stopping = false;
  nc: NatsConnection | undefined;
  cancelSub: Subscription | undefined;
  acks: ConfirmedAcks | undefined;
  queue: QueueConsumer | undefined;

  /** The requests in progress. */
  get active(): number {
    return this.queue?.active ?? 0;
  }

  /** GET /v1/health/ready: 200 while pulling work, 503 while starting or stopping. */
  readiness(concurrency: number): { code: number; body: object } {
    const up = this.ready && !this.stopping;
    return {
      code: up ? 200 : 503,
      body: {
        status: up ? "ready" : this.stopping ? "stopping" : "starting",
        busy: this.active,
        concurrency,
      },
    };
  }
}

export function createWorkerAgent(
  cfg: WorkerConfig,
  opts: { logger?: Logger; registry?: Registry; tracing?: Tracing | undefined } = {},
): WorkerAgent {
  const logger = opts.logger ?? silentLogger();
  const registry = opts.registry ?? workerRegistry(cfg);
  const { items, busy, duration } = workerMetrics(registry, cfg.concurrency);
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
  const callbacks = new CallbackClient({ lookup, secureContext, instanceId: cfg.instanceId });
  const inflight: InflightWork = new Map();
  const freeSlots: OutputSlot[] = [];
  const state = new AgentState();
  const stopController = new AbortController();
  const signal = stopController.signal;

  const router = new Router()
    .add("GET", "/v1/health/live", ({ res }) => sendJson(res, 200, { status: "live" }))
    .add("GET", "/v1/health/ready", ({ res }) => {
      const { code, body } = state.readiness(cfg.concurrency);
      sendJson(res, code, body);
    });
  const http = createHttpService({
    name: "worker",
    listen: cfg.healthListen,
    logger,
    registry,
    router,
    ready: () => state.ready,
  });

  return {
    registry,
    async start() {
      const health = await http.listen();
      for (let k = 0; k < cfg.concurrency; k++)
        freeSlots.push(await OutputSlot.create(join(cfg.responseDir, `slot-${k}`)));
      await waitForInference({ cfg, logger, signal });
      const access = workerNatsAccess(cfg);
      const nc = await connectNats(
        access,
        `worker_${cfg.functionVersionId}_${cfg.instanceId || process.pid}`,
        logger,
        registry,
      );
      state.nc = nc;
      const replies = new Replies(nc, access.inboxPrefix);
      const acks = (state.acks = new ConfirmedAcks(nc, logger, replies));
      const dispatcher = new WorkDispatcher({
        cfg,
        logger,
        nc,
        callbacks,
        answers: cfg.answerOverNats ? new NatsAnswers(replies) : undefined,
        inference,
        lookup,
        secureContext,
        acks,
        inflight,
        freeSlots,
        items,
        duration,
        tracing: opts.tracing,
      });
      state.cancelSub = nc.subscribe(subjects.cancel(cfg.functionVersionId), {
        callback: (err, m) => {
          if (!err) dispatcher.cancel(m.string());
        },
      });
      await waitForConsumer(nc, { cfg, logger, signal });
      state.ready = true;
      state.queue = new QueueConsumer(
        { cfg, logger, busy, handle: (m) => dispatcher.handle(m), lifecycle: state },
        nc,
        access.inboxPrefix,
      );
      state.queue.start();
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
      state.stopping = true;
      state.ready = false;
      stopController.abort();
      state.queue?.stop();
      const deadline = Date.now() + graceMs;
      while ((state.active > 0 || (state.acks?.size ?? 0) > 0) && Date.now() < deadline) await sleep(100);
      for (const item of inflight.values()) item.abort.abort();
      state.cancelSub?.unsubscribe();
      for (const s of freeSlots) s.close();
      await state.nc?.drain().catch(() => undefined);
      await http.close(1000);
      await Promise.all([inference.close(), callbacks.close()]);
    },
    destroy() {
      state.stopping = true;
      stopController.abort();
      for (const item of inflight.values()) item.abort.abort();
      http.destroy();
      // closed after the work just aborted has run its last steps (acks, unsubscribes): a publish
      // made while nats.js closes is flushed after its socket ended, an uncaught "write after end"
      setImmediate(() => void state.nc?.close());
      void inference.destroy();
      void callbacks.agent.destroy();
    },
  };
}
