// The operator console's Logs question, on the wire and as a service answers it. The API asks
// `callplane.console.logs` (services/api/replica-reports.ts) and every service that keeps recent
// lines (lib/log-ring.ts) answers with those that match: the invocation and grpc-proxy replicas,
// and the callback proxy's keeper with HAProxy's access-log ring
// (services/callback-proxy/access-log-answers.ts). Lines travel as the service wrote them (JSON
// objects); the API parses and merges them by time.
//
// callplane.console.logs   body ConsoleLogsQuery, every service replies a LogsReply
import type { NatsConnection, Subscription } from "@nats-io/transport-node";
import { recentLogLines, type Logger } from "../lib/log.js";
import { subjects } from "../lib/nats/index.js";
import { parseConsoleQuery } from "./console-wire.js";

export interface ConsoleLogsQuery {
  /** Only lines whose `requestId` is this one (lower case). */
  requestId?: string;
  /** Only lines whose `functionId` is this one. */
  functionId?: string;
  /** Newest lines at most (LOG_ROWS). */
  limit?: number;
}

export interface LogsReply {
  kind: "logs";
  service: string;
  /** Which one of the service's replicas (a holder id in hex, or the host and pid). */
  replica: string;
  /** Matching lines, newest first, each one JSON object as written. */
  lines: string[];
  /** A message for the console instead of lines (the source could not be read). */
  problem?: string;
}

/** Lines a reply carries unless asked otherwise, and at most. */
export const LOG_ROWS = { default: 200, max: 1000 } as const;

/** Where a service's lines come from: newest first, as written (each a JSON object). */
export type LineSource = () => Iterable<string> | Promise<Iterable<string>>;

function rowLimit(limit: unknown): number {
  if (typeof limit !== "number" || !Number.isFinite(limit)) return LOG_ROWS.default;
  return Math.max(0, Math.min(LOG_ROWS.max, Math.floor(limit)));
}

/**
 * The lines that match, newest first. A line is parsed only when its text contains the ids asked
 * for (a plain substring test first), so a filtered question over a full ring parses a handful.
 */
export function matchingLines(lines: Iterable<string>, q: ConsoleLogsQuery): string[] {
  const limit = rowLimit(q.limit);
  const requestId = typeof q.requestId === "string" ? q.requestId : undefined;
  const functionId = typeof q.functionId === "string" ? q.functionId : undefined;
  const out: string[] = [];
  if (limit === 0) return out;
  for (const raw of lines) {
    const line = raw.endsWith("\n") ? raw.slice(0, -1) : raw;
    if (requestId !== undefined || functionId !== undefined) {
      if (requestId !== undefined && !line.includes(requestId)) continue;
      if (functionId !== undefined && !line.includes(functionId)) continue;
      let o: { requestId?: unknown; functionId?: unknown };
      try {
        o = JSON.parse(line) as typeof o;
      } catch {
        continue;
      }
      if (requestId !== undefined && o.requestId !== requestId) continue;
      if (functionId !== undefined && o.functionId !== functionId) continue;
    }
    out.push(line);
    if (out.length >= limit) break;
  }
  return out;
}

/**
 * Answers the console's logs question on `nc` until it closes. The reply stays below the server's
 * max_payload: the oldest lines are dropped until it fits.
 */
export function answerLogQuestions(
  nc: NatsConnection,
  who: { service: string; replica: string },
  source: LineSource,
  logger: Logger,
): Subscription {
  return nc.subscribe(subjects.consoleLogs, {
    callback: (err, m) => {
      if (err) return;
      void (async () => {
        let reply: LogsReply;
        try {
          reply = {
            kind: "logs",
            ...who,
            lines: matchingLines(await source(), parseConsoleQuery<ConsoleLogsQuery>(m)),
          };
        } catch (e) {
          reply = { kind: "logs", ...who, lines: [], problem: (e as Error).message };
        }
        const max = (nc.info?.max_payload ?? 1024 * 1024) * 0.9;
        let text = JSON.stringify(reply);
        while (Buffer.byteLength(text) > max && reply.lines.length > 0) {
          reply.lines = reply.lines.slice(0, reply.lines.length >> 1);
          text = JSON.stringify(reply);
        }
        m.respond(text);
      })().catch((e: unknown) =>
        logger.error({ err: e }, "the console's logs question could not be answered"),
      );
    },
  });
}

/** Answers with the lines of `logger`'s ring (createLogger's); nothing when it keeps none. */
export function answerOwnLogs(
  nc: NatsConnection,
  who: { service: string; replica: string },
  logger: Logger,
): Subscription | undefined {
  const ring = recentLogLines(logger);
  return ring ? answerLogQuestions(nc, who, () => ring.newestFirst(), logger) : undefined;
}
