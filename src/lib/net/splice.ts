// One splice of two sockets: the client that came to us and the upstream connection we opened for
// it, passed through as bytes. Every tunnel the plane pipes (the callback proxy's CONNECT tunnels
// and gRPC tunnels, a grpc-proxy relaying a worker's tunnel to the replica that holds its session)
// needs the same steps, and each step has a way to get it wrong (a leaked socket, an error without
// a listener, bytes read before the other side can take them), so they live here once:
//
//   - until upstream is ready the client's bytes wait (paused), then a preamble may go either way
//     (a 200, a CONNECT request, the bytes read with the client's request) and bytes flow both ways
//     through pipe() (backpressure), counted in each direction;
//   - an optional idle timeout on both sockets once ready, an optional connect timeout before;
//   - when upstream fails before it is of use, the caller may give the client one answer (it
//     decides from what happened: connected or not, bytes so far), which is flushed before the
//     client is closed;
//   - whatever ends it, both sockets are closed, and the caller hears once, after both closed, how
//     it ended (what came first, the error, the byte counts).
import type { Socket } from "node:net";
import { TLSSocket } from "node:tls";

/** What ended a splice first: a side closed without error, an error on one side, or a timeout. */
export type SpliceCause = "closed" | "client-error" | "upstream-error" | "connect-timeout" | "idle-timeout";

export interface SpliceState {
  cause: SpliceCause;
  /** The error, with "client-error" and "upstream-error". */
  error?: Error;
  /** Whether upstream became ready (for a TLS socket: its handshake was done). */
  connected: boolean;
  /** Bytes from the client to upstream since upstream was ready (`head` and preambles not counted). */
  bytesUp: number;
  /** Bytes from upstream to the client. */
  bytesDown: number;
}

export interface SpliceOptions {
  /** Upstream gives up if not ready within this long ("connect-timeout"). */
  connectTimeoutMs?: number;
  /** Once ready, either socket with no bytes for this long ends the splice ("idle-timeout"). */
  idleMs?: number;
  /** Runs once upstream is ready, before any byte flows: write a preamble either way here. */
  onReady?(): void;
  /** Bytes already read from the client (the head of its CONNECT): sent upstream right after onReady. */
  head?: Buffer;
  /**
   * Upstream failed ("upstream-error" or "connect-timeout"): what to answer the client before it is
   * closed, or undefined to close it with no answer. Called once, even if the client is gone.
   */
  failureAnswer?(failure: Readonly<SpliceState>): string | Buffer | undefined;
  /**
   * When upstream closes first without an error: end the client gracefully (its pending bytes are
   * flushed; the default), or cut it at once.
   */
  afterUpstreamClose?: "end-client" | "destroy-client";
  /** Called once, when both sockets have closed. */
  onEnd?(end: Readonly<SpliceState>): void;
}

/**
 * Splices `client` to `upstream`, a socket still connecting (net.connect: ready on "connect";
 * tls.connect: on "secureConnect"). Takes over both sockets' errors, timeouts and closing.
 */
export function splice(client: Socket, upstream: Socket, opts: SpliceOptions = {}): void {
  new Splice(client, upstream, opts).start();
}

class Splice {
  private readonly state: SpliceState = { cause: "closed", connected: false, bytesUp: 0, bytesDown: 0 };
  /** A cause has been recorded: the splice is ending. */
  private ending = false;
  private open = 2;

  constructor(
    private readonly client: Socket,
    private readonly upstream: Socket,
    private readonly opts: SpliceOptions,
  ) {}

  start(): void {
    const { client, upstream } = this;
    client.pause();
    if (this.opts.connectTimeoutMs) upstream.setTimeout(this.opts.connectTimeoutMs);
    upstream.once(upstream instanceof TLSSocket ? "secureConnect" : "connect", () => this.ready());
    upstream.on("timeout", () => this.fail(this.state.connected ? "idle-timeout" : "connect-timeout"));
    upstream.on("error", (err: Error) => this.fail("upstream-error", err));
    client.on("error", (err: Error) => this.fail("client-error", err));
    this.onClose(upstream, () => this.upstreamClosed());
    this.onClose(client, () => this.clientClosed());
  }

  private ready(): void {
    const { client, upstream, opts } = this;
    if (this.ending) return;
    this.state.connected = true;
    // the connect timeout ends here; the idle timeout (if any) starts
    upstream.setTimeout(opts.idleMs ?? 0);
    if (opts.idleMs) {
      client.setTimeout(opts.idleMs);
      client.on("timeout", () => this.fail("idle-timeout"));
    }
    opts.onReady?.();
    if (opts.head?.length) upstream.write(opts.head);
    upstream.on("data", (d: Buffer) => (this.state.bytesDown += d.length));
    client.on("data", (d: Buffer) => (this.state.bytesUp += d.length));
    upstream.pipe(client);
    // resumes the client (it was paused until now), unless upstream already needs a drain
    client.pipe(upstream);
  }

  private fail(cause: SpliceCause, error?: Error): void {
    if (this.ending) {
      // already ending (an answer being flushed, a side half-closed): nothing waits any more
      this.upstream.destroy();
      this.client.destroy();
      return;
    }
    this.ending = true;
    this.state.cause = cause;
    if (error) this.state.error = error;
    const answer =
      cause === "upstream-error" || cause === "connect-timeout"
        ? this.opts.failureAnswer?.(this.state)
        : undefined;
    this.upstream.destroy();
    const { client } = this;
    if (answer === undefined || client.destroyed || client.writableEnded) {
      client.destroy();
      return;
    }
    client.end(answer);
    if (client.writableFinished) client.destroy();
    else client.once("finish", () => client.destroy());
  }

  private upstreamClosed(): void {
    if (!this.ending) {
      this.ending = true;
      if (this.opts.afterUpstreamClose === "destroy-client") this.client.destroy();
      else this.client.end();
    }
    this.closedOne();
  }

  private clientClosed(): void {
    this.ending = true;
    this.upstream.destroy();
    this.closedOne();
  }

  private closedOne(): void {
    if (--this.open === 0) this.opts.onEnd?.(this.state);
  }

  /** `f` once `s` has closed (at once, on the next tick, if it had before the splice began). */
  private onClose(s: Socket, f: () => void): void {
    if (s.closed) process.nextTick(f);
    else s.once("close", f);
  }
}
