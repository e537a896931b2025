// The last minute of one function version on one replica, for the operator console: requests that
// ended, how many of them were errors, and their durations, in 12 slots of 5 s; and the last hour of
// the same counts, minute by minute, for the graphs on a function's page. Prometheus keeps the long
// history (callplane_invocation_duration_seconds); this is what a replica can answer at once, with
// no query engine, when the console asks it (services/invocation/console-report.ts).
//
// Every count lives in one typed array made with the window: recording a request is a few integer
// writes, however many requests end. A slot is reused once it is older than the window, so its
// counts are cleared when it is entered again. Durations go to log-scaled buckets (four per
// doubling, from 1 ms to past two hours): a quantile read from them is the upper bound of the
// bucket that holds it, at most a fifth above the true one.
//
// The hour costs a request nothing: a 5-s slot is added to its minute's cell when the slot is
// entered again (once per 5 s per version at most, only while requests end), and a read adds the
// slots not yet added. Its 60 cells are made at the first such fold (22.5 KB a version: 11 MB at
// the series limit of 500 versions, plane/function-series.ts). The durations keep the same buckets,
// so the API can add several replicas' minutes up and read a quantile of them all.

const SLOT_MS = 5000;
const SLOTS = 12;
/** Buckets per doubling of the duration. */
const STEPS = 4;
const BUCKETS = 4 * 23; // up to 2^22.75 ms (about 2 h); longer ones share the last
/** requests, errors, then the buckets */
const WIDTH = 2 + BUCKETS;

/** The window's span: what "over the last 60 s" means (up to one slot less, as the slot fills). */
export const RECENT_WINDOW_MS = SLOT_MS * SLOTS;

const MINUTE_MS = 60_000;
/** Minutes in the hour a window keeps. */
export const HOUR_MINUTES = 60;
const SLOTS_PER_MINUTE = MINUTE_MS / SLOT_MS;

/**
 * One version's last hour on one replica, minute by minute: point i is the minute that starts at
 * `start + i * 60 s` (the last one is the current, partial minute).
 */
export interface HourCounts {
  start: number;
  requests: number[];
  errors: number[];
  /** Per minute, the durations' non-empty buckets as [bucket, count] (bucketUpperMs gives a bucket's bound). */
  latency: Array<Array<[number, number]>>;
}

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
  /** The hour's cells, one per minute (made at the first fold), and which minute each holds. */
  private hourCells: Uint32Array | undefined;
  private readonly minutes = new Float64Array(HOUR_MINUTES).fill(-1);

  /** One request ended after `durationMs`; `error` when it counts as one (see FunctionStats). */
  record(now: number, durationMs: number, error: boolean): void {
    const epoch = Math.floor(now / SLOT_MS);
    const slot = epoch % SLOTS;
    const base = slot * WIDTH;
    if (this.epochs[slot] !== epoch) {
      if (this.epochs[slot] >= 0) this.fold(slot);
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

  /** Adds a slot about to be reused to its minute's cell (unless that cell holds a later minute). */
  private fold(slot: number): void {
    const minute = Math.floor(this.epochs[slot] / SLOTS_PER_MINUTE);
    const m = minute % HOUR_MINUTES;
    if (this.minutes[m] > minute) return;
    const hour = (this.hourCells ??= new Uint32Array(HOUR_MINUTES * WIDTH));
    const base = m * WIDTH;
    if (this.minutes[m] !== minute) {
      hour.fill(0, base, base + WIDTH);
      this.minutes[m] = minute;
    }
    const from = slot * WIDTH;
    for (let i = 0; i < WIDTH; i++) hour[base + i] += this.cells[from + i];
  }

  /** The last hour, minute by minute; undefined when no request ended in it. */
  hour(now: number): HourCounts | undefined {
    const current = Math.floor(now / MINUTE_MS);
    const first = current - HOUR_MINUTES + 1;
    const sums = new Float64Array(HOUR_MINUTES * WIDTH);
    let any = false;
    const add = (i: number, from: Uint32Array, base: number) => {
      any = true;
      for (let k = 0; k < WIDTH; k++) sums[i * WIDTH + k] += from[base + k];
    };
    if (this.hourCells)
      for (let m = 0; m < HOUR_MINUTES; m++)
        if (this.minutes[m] >= first && this.minutes[m] <= current)
          add(this.minutes[m] - first, this.hourCells, m * WIDTH);
    // the slots not folded yet (a slot is folded only when it is entered again)
    for (let s = 0; s < SLOTS; s++) {
      if (this.epochs[s] < 0) continue;
      const minute = Math.floor(this.epochs[s] / SLOTS_PER_MINUTE);
      if (minute >= first && minute <= current) add(minute - first, this.cells, s * WIDTH);
    }
    if (!any) return undefined;
    const out: HourCounts = { start: first * MINUTE_MS, requests: [], errors: [], latency: [] };
    for (let i = 0; i < HOUR_MINUTES; i++) {
      const base = i * WIDTH;
      out.requests.push(sums[base]);
      out.errors.push(sums[base + 1]);
      const pairs: Array<[number, number]> = [];
      for (let b = 0; b < BUCKETS; b++) if (sums[base + 2 + b] > 0) pairs.push([b, sums[base + 2 + b]]);
      out.latency.push(pairs);
    }
    return out;
  }
}

/** The upper bound of a duration bucket of HourCounts.latency, in ms. */
export function bucketUpperMs(bucket: number): number {
  return upperMs(Math.max(0, Math.min(BUCKETS - 1, Math.floor(bucket))));
}

/**
 * The q-quantile of durations given as [bucket, count] (several replicas' minutes added up): the
 * upper bound of the bucket that holds it, in whole ms; undefined with no duration.
 */
export function quantileOfBuckets(counts: ReadonlyMap<number, number>, q: number): number | undefined {
  const sum = new Float64Array(WIDTH);
  let n = 0;
  for (const [b, c] of counts) {
    if (!Number.isInteger(b) || b < 0 || b >= BUCKETS || !(c > 0)) continue;
    sum[2 + b] += c;
    n += c;
  }
  return quantile(sum, n, q);
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
