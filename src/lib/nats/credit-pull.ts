// Pulling from a JetStream pull consumer by credit, on one standing subscription. The holder says
// how many messages it can take (its free slots); this keeps exactly that many requested, no more,
// so a busy worker leaves messages to the others. nats.js's fetch() made every pull a new inbox
// subscription (SUB, pull, UNSUB): at saturation a worker with a slot free pulls one message at a
// time, and each SUB/UNSUB also empties nats-server's subject cache for the whole account. Here a
// pull is one publish: `$JS.API.CONSUMER.MSG.NEXT` with a reply subject naming the pull, under a
// wildcard subscription of the connection's own inbox. Each pull asks for idle heartbeats: a pull
// the server lost without a word (a consumer leader killed) goes silent, and is asked for again
// within a few heartbeats instead of after its expiry.
import {
  createInbox,
  type Msg,
  type MsgHdrs,
  type NatsConnection,
  type Subscription,
} from "@nats-io/transport-node";
import type { Logger } from "../log.js";

/** A message taken from the consumer: its bytes, its ack subject, and the in-progress signal. */
export interface PulledMessage {
  readonly data: Uint8Array;
  /** The message's NATS headers, if it has any (the trace context of its publish). */
  readonly headers: MsgHdrs | undefined;
  /** The ack subject (`$JS.ACK.<stream>.<consumer>...`). */
  readonly reply: string;
  /** Tells JetStream the message is still being worked on (restarts its ack wait). */
  working(): void;
}

export interface CreditPullOptions {
  stream: string;
  consumer: string;
  /** The connection's own inbox prefix (its grant covers `<prefix>.>`). */
  inboxPrefix: string;
  logger: Logger;
  /** How long one pull request waits at the server for messages. */
  expiresMs?: number;
  /** How often the server says a waiting pull is alive (at most half of `expiresMs`). */
  heartbeatMs?: number;
  onMessage(m: PulledMessage): void;
}

interface Pull {
  /** Messages not yet delivered (an estimate: a message is counted against the oldest pull). */
  remaining: number;
  /** When the server has surely ended it (its expiry, plus a margin). */
  endsAt: number;
}

const WORKING = new TextEncoder().encode("+WPI");
const encoder = new TextEncoder();
/** After a refusal (a status other than the end of a pull), the next pull waits this long. */
const REFUSED_PAUSE_MS = 1000;
/** Pulls heard from for this many heartbeats (plus a second) are taken for lost. */
const SILENT_HEARTBEATS = 2;

export class CreditPull {
  private readonly subject: string;
  private readonly expiresMs: number;
  private readonly heartbeatMs: number;
  private base = "";
  private sub: Subscription | undefined;
  private readonly pulls = new Map<string, Pull>();
  /** When the server last said anything to this holder's pulls (a message, a heartbeat, a status), or a pull was sent. */
  private heardAt = 0;
  private wanted = 0;
  private seq = 0;
  private scheduled = false;
  private pausedUntil = 0;
  private stopped = false;
  private readonly sweep: NodeJS.Timeout;

  constructor(
    private readonly nc: NatsConnection,
    private readonly opts: CreditPullOptions,
  ) {
    this.subject = `$JS.API.CONSUMER.MSG.NEXT.${opts.stream}.${opts.consumer}`;
    this.expiresMs = opts.expiresMs ?? 30_000;
    this.heartbeatMs = Math.min(opts.heartbeatMs ?? 2000, Math.floor(this.expiresMs / 2));
    this.resubscribe();
    // A pull the server lost (it restarted, the consumer's leader died) never reports its end:
    // dropped here once its heartbeats stop or its expiry has surely passed, and asked for again.
    this.sweep = setInterval(() => this.dropEnded(Date.now()), this.heartbeatMs).unref();
    void this.watchReconnects();
  }

  /** How many messages the holder can take now; pulls are topped up to it (never beyond). */
  credit(free: number): void {
    this.wanted = free;
    if (this.scheduled || this.stopped) return;
    // slots freed in the same turn are asked for in one pull
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      this.topUp();
    });
  }

  /** Ends pulling: no new pull is sent; messages of pulls in flight are not taken. */
  stop(): void {
    this.stopped = true;
    clearInterval(this.sweep);
    this.sub?.unsubscribe();
    this.sub = undefined;
    this.pulls.clear();
  }

  /** Messages asked for and not yet delivered. */
  private get outstanding(): number {
    let n = 0;
    for (const p of this.pulls.values()) n += p.remaining;
    return n;
  }

  private topUp(): void {
    const want = this.wanted - this.outstanding;
    if (want <= 0 || this.stopped || this.nc.isClosed()) return;
    const now = Date.now();
    if (now < this.pausedUntil) {
      setTimeout(() => this.credit(this.wanted), this.pausedUntil - now).unref();
      return;
    }
    const id = (this.seq = (this.seq + 1) % Number.MAX_SAFE_INTEGER).toString(36);
    if (this.pulls.size === 0) this.heardAt = now;
    this.pulls.set(id, { remaining: want, endsAt: now + this.expiresMs + 2000 });
    this.opts.logger.debug({ pull: id, batch: want }, "pull sent");
    try {
      this.nc.publish(
        this.subject,
        encoder.encode(
          `{"batch":${want},"expires":${this.expiresMs * 1_000_000},"idle_heartbeat":${this.heartbeatMs * 1_000_000}}`,
        ),
        { reply: this.base + id },
      );
    } catch (err) {
      this.pulls.delete(id);
      this.opts.logger.warn({ err: (err as Error).message }, "cannot send a pull request; retrying");
      this.pausedUntil = now + REFUSED_PAUSE_MS;
      this.credit(this.wanted);
    }
  }

  private onMsg(m: Msg): void {
    this.heardAt = Date.now();
    const status = m.data.length === 0 ? m.headers?.code : undefined;
    if (status !== undefined && status !== 0) {
      // A status comes on the pull's own reply subject. 100: a heartbeat; 404/408: the pull ended
      // short; 409: the server ended it (consumer deleted, leadership change, too many waiting pulls)
      if (status === 100) return;
      const id = m.subject.slice(this.base.length);
      this.opts.logger.debug({ pull: id, status }, "pull ended");
      this.pulls.delete(id);
      if (status !== 404 && status !== 408) {
        this.opts.logger.warn(
          { status, description: m.headers?.description, consumer: this.opts.consumer },
          "JetStream ended a pull request; pulling again shortly",
        );
        this.pausedUntil = Date.now() + REFUSED_PAUSE_MS;
      }
      this.credit(this.wanted);
      return;
    }
    if (!m.reply) return;
    // A message keeps its own subject (the pull is known by the subscription only): it is counted
    // against the oldest pull, as JetStream fills a client's waiting pulls in order.
    for (const [id, pull] of this.pulls) {
      if (--pull.remaining <= 0) this.pulls.delete(id);
      break;
    }
    const reply = m.reply;
    const nc = this.nc;
    this.opts.onMessage({
      data: m.data,
      headers: m.headers,
      reply,
      working: () => nc.publish(reply, WORKING),
    });
  }

  private dropEnded(now: number): void {
    if (this.pulls.size === 0) return;
    if (now - this.heardAt > SILENT_HEARTBEATS * this.heartbeatMs + 1000) {
      // every pull goes to the same consumer: silence from one is silence from its leader
      this.opts.logger.info(
        { consumer: this.opts.consumer, pulls: this.pulls.size, silentMs: now - this.heardAt },
        "JetStream stopped answering the pull requests (a consumer leader lost?); pulling again",
      );
      this.pulls.clear();
      this.credit(this.wanted);
      return;
    }
    let dropped = false;
    for (const [id, p] of this.pulls)
      if (p.endsAt <= now) {
        this.pulls.delete(id);
        dropped = true;
      }
    if (dropped) this.credit(this.wanted);
  }

  /**
   * A new inbox subscription, every pull forgotten: after a reconnect the server may have lost the
   * pulls (a restart) or may still hold them (a short cut); under a new inbox, deliveries for the
   * old pulls find no interest and stay in the stream for the next pull, so credit is never exceeded.
   */
  private resubscribe(): void {
    this.sub?.unsubscribe();
    this.pulls.clear();
    this.base = `${createInbox(this.opts.inboxPrefix)}.`;
    this.sub = this.nc.subscribe(`${this.base}*`, {
      callback: (err, m) => {
        if (!err) this.onMsg(m);
      },
    });
  }

  private async watchReconnects(): Promise<void> {
    for await (const s of this.nc.status()) {
      if (this.stopped) return;
      if (s.type === "reconnect") {
        this.resubscribe();
        this.credit(this.wanted);
      }
    }
  }
}
