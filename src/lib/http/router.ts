// Method and path to handler, with path parameters; the request context every handler gets.
import { type IncomingMessage, type ServerResponse } from "node:http";
import type { Logger } from "../log.js";
import type { TraceSpan } from "../tracing/index.js";

const UUID_ANY_CASE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

export interface RequestContext {
  req: IncomingMessage;
  res: ServerResponse;
  params: Record<string, string>;
  query: URLSearchParams;
  log: Logger;
  /** The request's span, when the service traces (HttpServiceOptions.tracing). */
  span?: TraceSpan | undefined;
}

export type Handler = (ctx: RequestContext) => Promise<void> | void;

interface Route {
  method: string;
  segments: string[];
  pattern: string;
  handler: Handler;
  /** Still served while the service drains (for example worker callbacks of in-flight requests). */
  duringDrain: boolean;
}

export class Router {
  private readonly routes: Route[] = [];

  add(method: string, pattern: string, handler: Handler, opts: { duringDrain?: boolean } = {}): this {
    this.routes.push({
      method,
      segments: pattern.split("/").slice(1),
      pattern,
      handler,
      duringDrain: opts.duringDrain ?? false,
    });
    return this;
  }

  match(
    method: string,
    path: string,
  ): { route: Route; params: Record<string, string> } | { allowed: string[] } | undefined {
    const parts = path.split("/").slice(1);
    const allowed: string[] = [];
    for (const route of this.routes) {
      if (route.segments.length !== parts.length) continue;
      const params: Record<string, string> = {};
      let ok = true;
      for (let i = 0; i < parts.length; i++) {
        const seg = route.segments[i];
        if (seg.startsWith(":")) {
          if (parts[i] === "") {
            ok = false;
            break;
          }
          try {
            const value = decodeURIComponent(parts[i]);
            // ids are UUIDs, stored in lower case; RFC 9562 has them compared regardless of case
            params[seg.slice(1)] = UUID_ANY_CASE.test(value) ? value.toLowerCase() : value;
          } catch {
            ok = false;
            break;
          }
        } else if (seg !== parts[i]) {
          ok = false;
          break;
        }
      }
      if (!ok) continue;
      if (route.method === method) return { route, params };
      allowed.push(route.method);
    }
    return allowed.length ? { allowed } : undefined;
  }
}
