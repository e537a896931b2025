// The live page's server-sent events: one shared poll, however many pages watch. The loop runs once
// per interval only while at least one client listens, renders one update and hands it to every
// client. A client whose socket has not taken the last update yet (a slow reader) gets no new one
// queued behind it: that update is dropped for that client, which gets the next one it can take, so
// nothing is ever buffered beyond one update per client. A client that leaves is removed at once.
import type { ServerResponse } from "node:http";
import type { Logger } from "../../../lib/log.js";

export interface LiveHubOptions {
  /** Renders one update (the event's data). */
  render: () => Promise<string>;
  /** The event's name. */
  event: string;
  intervalMs?: number;
  logger: Logger;
}

export class LiveHub {
  private readonly clients = new Set<ServerResponse>();
  private timer: NodeJS.Timeout | undefined;
  private running = false;
  private closed = false;
  /** Updates rendered so far (tests read it: no clients, no polls). */
  polls = 0;
  /** Updates not sent to a client because it had not taken the previous one. */
  dropped = 0;

  constructor(private readonly opts: LiveHubOptions) {}

  get listeners(): number {
    return this.clients.size;
  }

  /** Starts the stream on `res` and keeps it until the client leaves or the hub closes. */
  add(res: ServerResponse): void {
    res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-store",
      "x-content-type-options": "nosniff",
      // proxies (nginx) would otherwise hold the events back
      "x-accel-buffering": "no",
    });
    res.write(": callplane console\n\n");
    this.clients.add(res);
    res.once("close", () => this.clients.delete(res));
    if (!this.running) {
      this.running = true;
      this.schedule(0);
    }
  }

  private schedule(ms: number): void {
    this.timer = setTimeout(() => void this.tick(), ms);
  }

  private async tick(): Promise<void> {
    this.timer = undefined;
    if (this.clients.size === 0 || this.closed) {
      this.running = false;
      return;
    }
    const started = Date.now();
    let data: string | undefined;
    try {
      this.polls++;
      data = await this.opts.render();
    } catch (err) {
      this.opts.logger.warn({ err: (err as Error).message }, "the console's live update failed");
    }
    if (data !== undefined) {
      const frame = `event: ${this.opts.event}\n${data
        .split("\n")
        .map((l) => `data: ${l}`)
        .join("\n")}\n\n`;
      for (const res of this.clients) {
        if (res.writableNeedDrain) {
          this.dropped++;
          continue;
        }
        res.write(frame);
      }
    }
    if (this.closed) return;
    if (this.clients.size === 0) {
      this.running = false;
      return;
    }
    this.schedule(Math.max(0, (this.opts.intervalMs ?? 1000) - (Date.now() - started)));
  }

  /** Ends every stream and takes no more (the API is stopping). */
  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.running = false;
    for (const res of this.clients) res.end();
    this.clients.clear();
  }

  get isClosed(): boolean {
    return this.closed;
  }
}
