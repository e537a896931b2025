// A gRPC session (contract §4.1): one work request, one worker, and the tunnel that worker opened
// back to this replica. All calls of a client connection for one function routing share it; calls
// wait for the tunnel while the worker is on its way. A session with no call in flight for idleMs
// closes its tunnel (GOAWAY: calls still on it finish), and a session that lost its tunnel fails
// the calls waiting for it. A session belongs to the account of the key that started it (NVCF's
// clientNcaId): keys of that account may resume it, no other key can tell it exists.
import type { ClientHttp2Session } from "node:http2";
import { CallplaneError } from "../../lib/errors.js";

export type SessionState = "waiting" | "open" | "closed";

interface Waiter {
  resolve(tunnel: ClientHttp2Session): void;
  reject(err: CallplaneError): void;
}

export class Session {
  state: SessionState = "waiting";
  tunnel: ClientHttp2Session | undefined;
  /** The CONNECT token minted for the worker (deleted once used or when the session ends). */
  token: string | undefined;
  /** Whether a response has carried the session cookie yet. */
  cookieSent = false;
  /** Started by a resumption (nvcf-reqid): its work was queued elsewhere, so it is never cancelled from here. */
  resumed = false;
  /** The work message's stream sequence once its publish was confirmed (a cancel removes it by it). */
  seq: number | undefined;
  private readonly waiters = new Set<Waiter>();
  private active = 0;
  private idleTimer: NodeJS.Timeout | undefined;
  private failure: CallplaneError | undefined;

  constructor(
    readonly requestId: string,
    readonly functionId: string,
    readonly functionVersionId: string,
    /** The account of the key that started it (Grant.clientNcaId). */
    readonly owner: string,
    private readonly idleMs: number,
    private readonly onClosed: (s: Session, why: string) => void,
  ) {}

  /** The tunnel, once the worker has opened it; rejects when the session fails or `signal` aborts. */
  waitForTunnel(signal: AbortSignal): Promise<ClientHttp2Session> {
    if (this.state === "open" && this.tunnel && !this.tunnel.closed) return Promise.resolve(this.tunnel);
    if (this.state === "closed")
      return Promise.reject(
        this.failure ??
          new CallplaneError(
            "TUNNEL_LOST",
            `the worker session ${this.requestId} has ended; call again without nvcf-reqid to start a new one`,
          ),
      );
    return new Promise((resolve, reject) => {
      const w: Waiter = {
        resolve: (t) => {
          signal.removeEventListener("abort", onAbort);
          resolve(t);
        },
        reject: (e) => {
          signal.removeEventListener("abort", onAbort);
          reject(e);
        },
      };
      const onAbort = () => {
        this.waiters.delete(w);
        reject(signal.reason as CallplaneError);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiters.add(w);
    });
  }

  attach(tunnel: ClientHttp2Session): void {
    if (this.state === "closed") {
      tunnel.destroy();
      return;
    }
    this.state = "open";
    this.tunnel = tunnel;
    tunnel.once("close", () => {
      if (this.tunnel === tunnel)
        this.end(
          new CallplaneError(
            "TUNNEL_LOST",
            `the tunnel of worker session ${this.requestId} closed; call again to start a new session`,
          ),
          "tunnel closed",
        );
    });
    for (const w of this.waiters) w.resolve(tunnel);
    this.waiters.clear();
    this.armIdle();
  }

  /** A call starts using the session (no idle close meanwhile). */
  begin(): void {
    this.active++;
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = undefined;
  }

  /** A call is done with the session. */
  finish(): void {
    this.active = Math.max(0, this.active - 1);
    this.armIdle();
  }

  private armIdle(): void {
    if (this.active > 0 || this.state !== "open" || this.idleTimer) return;
    this.idleTimer = setTimeout(() => {
      this.idleTimer = undefined;
      if (this.active === 0) this.end(undefined, "idle");
    }, this.idleMs);
    this.idleTimer.unref();
  }

  /** Ends the session: calls waiting get `err`; the tunnel closes gracefully (calls on it finish). */
  end(err: CallplaneError | undefined, why: string): void {
    if (this.state === "closed") return;
    this.state = "closed";
    this.failure = err;
    if (this.idleTimer) clearTimeout(this.idleTimer);
    const e =
      err ??
      new CallplaneError(
        "TUNNEL_LOST",
        `the worker session ${this.requestId} ended (${why}); call again to start a new one`,
      );
    for (const w of this.waiters) w.reject(e);
    this.waiters.clear();
    if (this.tunnel && !this.tunnel.closed) this.tunnel.close();
    this.onClosed(this, why);
  }
}
