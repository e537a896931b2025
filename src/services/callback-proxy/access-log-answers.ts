// The callback proxy's answer to the operator console's logs question (callplane.console.logs,
// plane/console-logs.ts): the access-log lines HAProxy keeps in its ring (haproxy-access-log.ts),
// read over the runtime API only when the question comes, filtered and bounded like a replica's
// lines. The lines already have the shape the console reads (pino's: time, level, msg, and the
// callback's fields: method, path, target pod, status, bytes, duration, request id), so they
// travel as HAProxy wrote them.
//
// The access log is a convenience, never a dependency: without a NATS key, or while NATS cannot be
// reached, the keeper logs why and keeps retrying in the background; HAProxy carries callbacks
// the same either way.
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import type { Logger } from "../../lib/log.js";
import { connectNats, drainOrClose, type NatsAccess } from "../../lib/nats/index.js";
import { answerLogQuestions } from "../../plane/console-logs.js";
import { ACCESS_LOG_RING } from "./haproxy-access-log.js";
import { haproxyCommand } from "./haproxy.js";

/** The service name the console shows on these lines. */
export const ACCESS_LOG_SERVICE = "callback-proxy";

/**
 * The access-log lines HAProxy's ring holds now, newest first (its own notices, which share the
 * log, left out). At most the ring's size (1 MB) is read.
 */
export async function accessLogLines(adminSocket: string): Promise<string[]> {
  const out = await haproxyCommand(adminSocket, `show events ${ACCESS_LOG_RING.name}`);
  const lines = out.split("\n");
  const json = lines.filter((l) => l.startsWith("{"));
  // an HAProxy whose configuration predates the ring answers with a message, not lines
  if (json.length === 0 && /no such event sink|unknown command/i.test(out))
    throw new Error(
      `HAProxy has no ring ${ACCESS_LOG_RING.name} (${out.slice(0, 100)}): its configuration predates the access-log ring; restart the callback proxy with the current configuration`,
    );
  return json.reverse();
}

export interface AccessLogAnswersOptions {
  /** The keeper's NATS access; throws when it has none (no key), which leaves the console without the lines. */
  nats: () => NatsAccess;
  /** HAProxy's runtime API socket. */
  adminSocket: string;
  /** Which proxy this is on the console (the pod's name, or the host and pid). */
  replica: string;
  logger: Logger;
  /** Between attempts to reach NATS (default 5 s). */
  retryMs?: number;
}

/**
 * Answers the console's logs question from HAProxy's ring, over a NATS connection made in the
 * background (and made again until it succeeds). Questions that come while a read is under way
 * share it: a console watching many filters reads the ring once.
 */
export function answerAccessLogQuestions(o: AccessLogAnswersOptions): { close(): Promise<void> } {
  const { logger } = o;
  let closed = false;
  let nc: NatsConnection | undefined;
  let sub: Subscription | undefined;
  let retry: NodeJS.Timeout | undefined;
  let reading: Promise<string[]> | undefined;
  const source = () => {
    reading ??= accessLogLines(o.adminSocket).finally(() => (reading = undefined));
    return reading;
  };
  let access: NatsAccess;
  try {
    access = o.nats();
  } catch (err) {
    logger.warn(
      { err: (err as Error).message },
      "the console's logs page will not show the callback proxy's access log (no NATS access); callbacks are not affected",
    );
    return { close: () => Promise.resolve() };
  }
  const attempt = async () => {
    retry = undefined;
    try {
      const c = await connectNats(access, ACCESS_LOG_SERVICE, logger);
      if (closed) return void (await drainOrClose(c));
      nc = c;
      sub = answerLogQuestions(c, { service: ACCESS_LOG_SERVICE, replica: o.replica }, source, logger);
      logger.info({ replica: o.replica }, "answering the console's logs question with the access log");
    } catch (err) {
      if (closed) return;
      logger.warn(
        { err: (err as Error).message, retryInSeconds: (o.retryMs ?? 5000) / 1000 },
        "NATS not reached: the console's logs page does not show the access log for now; callbacks are not affected",
      );
      retry = setTimeout(() => void attempt(), o.retryMs ?? 5000);
      retry.unref();
    }
  };
  void attempt();
  return {
    async close() {
      closed = true;
      if (retry) clearTimeout(retry);
      sub?.unsubscribe();
      await drainOrClose(nc);
    },
  };
}
