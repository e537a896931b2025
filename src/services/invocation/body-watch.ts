// A client's body that stalls: bytes must keep coming while this replica waits for them. A client
// that trickles its body (a slowloris that got past the key check) would otherwise hold its
// connection, its key's slot and, once a worker reads the body, a worker's slot for the whole poll
// window (up to an hour).
import type { IncomingMessage } from "node:http";

export type Stall = "idle" | "total";

/**
 * Calls `onStall` once when the body of `req` stalls: no byte read from its connection for
 * `idleMs` while `waiting()` says the reader wants bytes (a reader held back by its own
 * backpressure does not count against the client), or, with `totalMs`, not done within it. The
 * connection's byte count is read rather than the body's events, which the reader owns (adding a
 * listener would change how the body flows). Returns the function that stops watching.
 */
export function watchBody(
  req: IncomingMessage,
  opts: { idleMs: number; totalMs?: number; waiting?: () => boolean },
  onStall: (why: Stall) => void,
): () => void {
  const socket = req.socket;
  const started = Date.now();
  let last = socket.bytesRead;
  let idleSince = started;
  // checked a few times per idle period: a stall is seen between idleMs and 1.25 idleMs (or 1 s later)
  const tick = Math.max(50, Math.min(1000, opts.idleMs / 4));
  const timer = setInterval(() => {
    const now = Date.now();
    const read = socket.bytesRead;
    if (read !== last || !(opts.waiting?.() ?? true)) {
      last = read;
      idleSince = now;
    }
    const why: Stall | undefined =
      opts.totalMs !== undefined && now - started >= opts.totalMs
        ? "total"
        : now - idleSince >= opts.idleMs
          ? "idle"
          : undefined;
    if (why) {
      clearInterval(timer);
      onStall(why);
    }
  }, tick);
  return () => clearInterval(timer);
}
