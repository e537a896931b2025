// The last minute of one function version on one replica, for the operator console: requests that
// ended, how many of them were errors, and their durations, in 12 slots of 5 s. Prometheus keeps
// the long history (callplane_invocation_duration_seconds); this is what a replica can answer at
// once, with no query engine, when the console asks it (services/invocation/console-report.ts).
//
// Every count lives in one typed array made with the window: recording a request is a few integer
// writes, however many requests end. A slot is reused once it is older than the window, so its
// counts are cleared when it is entered again. Durations go to log-scaled buckets (four per
// doubling, from 1 ms to past two hours): a quantile read from them is the upper bound of the
// bucket that holds it, at most a fifth above the true one.

const SLOT_MS = 5000;
const SLOTS = 12;
/** Buckets per doubling of the duration. */
const STEPS = 4;
const BUCKETS = 4 * 23; // up to 2^22.75 ms (about 2 h); longer ones share the last
/** requests, errors, then the buckets */
const WIDTH = 2 + BUCKETS;

/** The window's span: what "over the last 60 s" means (up to one slot less, as the slot fills). */
export const RECENT_WINDOW_MS = SLOT_MS * SLOTS;

export interface RecentStats {
  requests: number;
  errors: number;
  p50Ms: number | undefined;
  p99Ms: number | undefined;
}

function bucketOf(ms: number): number {
  if (!(ms >= 1)) return 0;
  return Math.min(BUCKETS - 1, Math.floor(Math.log2(ms) * STEPS) + 1);
}

/** The upper bound of a bucket, in ms (bucket 0 holds everything under 1 ms). */
function upperMs(bucket: number): number {
  return bucket === 0 ? 1 : 2 ** (bucket / STEPS);
}

export class RecentWindow {
  private readonly cells = new Uint32Array(SLOTS * WIDTH);
  /** Which 5-s epoch each slot holds (-1: none yet). */
  private readonly epochs = new Float64Array(SLOTS).fill(-1);

  /** One request ended after `durationMs`; `error` when it counts as one (see FunctionStats). */
  record(now: number, durationMs: number, error: boolean): void {
    const epoch = Math.floor(now / SLOT_MS);
    const slot = epoch % SLOTS;
    const base = slot * WIDTH;
    if (this.epochs[slot] !== epoch) {
      this.cells.fill(0, base, base + WIDTH);
      this.epochs[slot] = epoch;
    }
    this.cells[base]++;
    if (error) this.cells[base + 1]++;
    this.cells[base + 2 + bucketOf(durationMs)]++;
  }

  /** Whether anything ended within the window. */
  active(now: number): boolean {
    const oldest = Math.floor(now / SLOT_MS) - SLOTS + 1;
    for (let s = 0; s < SLOTS; s++) if (this.epochs[s] >= oldest && this.cells[s * WIDTH] > 0) return true;
    return false;
  }

  /** The window's counts and quantiles (undefined with no request in it). */
  stats(now: number): RecentStats {
    const oldest = Math.floor(now / SLOT_MS) - SLOTS + 1;
    const sum = new Float64Array(WIDTH);
    for (let s = 0; s < SLOTS; s++) {
      if (this.epochs[s] < oldest) continue;
      const base = s * WIDTH;
      for (let i = 0; i < WIDTH; i++) sum[i] += this.cells[base + i];
    }
    const requests = sum[0];
    return {
      requests,
      errors: sum[1],
      p50Ms: quantile(sum, requests, 0.5),
      p99Ms: quantile(sum, requests, 0.99),
    };
  }
}

function quantile(sum: Float64Array, n: number, q: number): number | undefined {
  if (n === 0) return undefined;
  const rank = Math.ceil(q * n);
  let seen = 0;
  for (let b = 0; b < BUCKETS; b++) {
    seen += sum[2 + b];
    // the bucket's upper bound, rounded: the console shows whole milliseconds
    if (seen >= rank) return Math.round(upperMs(b));
  }
  return Math.round(upperMs(BUCKETS - 1));
}
