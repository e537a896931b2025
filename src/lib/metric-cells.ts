// Metrics for the hot path. prom-client hashes the label set on every inc() and observe(), even on
// a child from labels(), and a histogram's observe() allocates an object per call. Here each
// labelled series is a cell: a plain object the caller looks up once (when it first sees a
// function version, a route, a status) and keeps; updating it is arithmetic on its fields. The
// exposition is built only when /metrics is read. A family registers with a prom-client Registry
// like any of its metrics, so the default `service` label, getSingleMetric() and the text format
// are prom-client's own.
import type { Metric, Registry } from "prom-client";

type Labels = Record<string, string | number>;

interface Sample {
  value: number;
  labels: Labels;
  metricName?: string;
}

export interface FamilyOptions {
  name: string;
  help: string;
  labelNames: readonly string[];
  /** Runs before each exposition (to bring a cell up to date). */
  collect?: () => void;
}

/** The series of one metric, one cell per label set; cells are created once and kept. */
abstract class Family<C> {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly string[];
  readonly aggregator = "sum";
  abstract readonly type: "counter" | "gauge" | "histogram";
  private readonly cells = new Map<string, { labels: Labels; cell: C }>();
  private readonly collectHook: (() => void) | undefined;

  constructor(registry: Registry, opts: FamilyOptions) {
    this.name = opts.name;
    this.help = opts.help;
    this.labelNames = opts.labelNames;
    this.collectHook = opts.collect;
    registry.registerMetric(this as unknown as Metric);
  }

  protected abstract newCell(): C;
  protected abstract samples(labels: Labels, cell: C, out: Sample[]): void;
  protected abstract zero(cell: C): void;

  /** The cell of one label set (values in labelNames order), made on first use. Keep it. */
  cell(...values: string[]): C {
    if (values.length !== this.labelNames.length)
      throw new Error(`${this.name} takes ${this.labelNames.length} label values, not ${values.length}`);
    const key = values.join("\u0000");
    let entry = this.cells.get(key);
    if (!entry) {
      const labels: Labels = {};
      this.labelNames.forEach((n, i) => (labels[n] = values[i]));
      entry = { labels, cell: this.newCell() };
      this.cells.set(key, entry);
    }
    return entry.cell;
  }

  /** What prom-client's Registry asks of a metric. */
  get(): Promise<{ name: string; help: string; type: string; aggregator: string; values: Sample[] }> {
    this.collectHook?.();
    const values: Sample[] = [];
    for (const { labels, cell } of this.cells.values()) this.samples(labels, cell, values);
    return Promise.resolve({
      name: this.name,
      help: this.help,
      type: this.type,
      aggregator: this.aggregator,
      values,
    });
  }

  reset(): void {
    for (const { cell } of this.cells.values()) this.zero(cell);
  }
}

export class CounterCell {
  value = 0;
  inc(n = 1): void {
    this.value += n;
  }
}

export class CounterFamily extends Family<CounterCell> {
  readonly type = "counter";
  protected newCell(): CounterCell {
    return new CounterCell();
  }
  protected samples(labels: Labels, cell: CounterCell, out: Sample[]): void {
    out.push({ value: cell.value, labels });
  }
  protected zero(cell: CounterCell): void {
    cell.value = 0;
  }
}

export class GaugeCell {
  value = 0;
  inc(n = 1): void {
    this.value += n;
  }
  dec(n = 1): void {
    this.value -= n;
  }
  set(v: number): void {
    this.value = v;
  }
}

export class GaugeFamily extends Family<GaugeCell> {
  readonly type = "gauge";
  protected newCell(): GaugeCell {
    return new GaugeCell();
  }
  protected samples(labels: Labels, cell: GaugeCell, out: Sample[]): void {
    out.push({ value: cell.value, labels });
  }
  protected zero(cell: GaugeCell): void {
    cell.value = 0;
  }
}

export class HistogramCell {
  /** counts[i]: observations in (bounds[i-1], bounds[i]]; the last slot is above every bound. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  constructor(private readonly bounds: readonly number[]) {
    this.counts = new Float64Array(bounds.length + 1);
  }
  observe(v: number): void {
    const b = this.bounds;
    let i = 0;
    // a dozen-odd bounds: a linear scan beats a binary search at this size
    while (i < b.length && v > b[i]) i++;
    this.counts[i]++;
    this.sum += v;
    this.count++;
  }
}

export class HistogramFamily extends Family<HistogramCell> {
  readonly type = "histogram";
  private readonly bounds: readonly number[];
  constructor(registry: Registry, opts: FamilyOptions & { buckets: readonly number[] }) {
    super(registry, opts);
    this.bounds = [...opts.buckets].sort((a, b) => a - b);
  }
  protected newCell(): HistogramCell {
    return new HistogramCell(this.bounds);
  }
  protected samples(labels: Labels, cell: HistogramCell, out: Sample[]): void {
    let cumulative = 0;
    for (let i = 0; i < this.bounds.length; i++) {
      cumulative += cell.counts[i];
      out.push({
        metricName: `${this.name}_bucket`,
        labels: { ...labels, le: this.bounds[i] },
        value: cumulative,
      });
    }
    out.push({ metricName: `${this.name}_bucket`, labels: { ...labels, le: "+Inf" }, value: cell.count });
    out.push({ metricName: `${this.name}_sum`, labels, value: cell.sum });
    out.push({ metricName: `${this.name}_count`, labels, value: cell.count });
  }
  protected zero(cell: HistogramCell): void {
    cell.counts.fill(0);
    cell.sum = 0;
    cell.count = 0;
  }
}

/** "2xx" for 204; "none" when no status went out (0). */
export const STATUS_CLASSES = ["none", "1xx", "2xx", "3xx", "4xx", "5xx"] as const;
export type StatusClass = (typeof STATUS_CLASSES)[number];

/** The index of a status's class in STATUS_CLASSES. */
export function statusClassIndex(status: number): number {
  const c = Math.floor(status / 100);
  return c >= 1 && c <= 5 ? c : 0;
}
