// Every HTTP service's request metrics, by route (the pattern, never the path: ids stay out of
// labels), method and status code. The cells of each (route, method, status) are looked up
// through nested maps, so a request adds no label object, string or hash; the values are bounded:
// routes are the router's patterns (or /health, /metrics, unmatched), methods the few Node's parser
// accepts, statuses three digits.
import { CounterFamily, HistogramFamily, type CounterCell, type HistogramCell } from "../metric-cells.js";
import { LATENCY_BUCKETS, type Registry } from "../metrics.js";

interface Cells {
  requests: CounterCell;
  duration: HistogramCell;
}

export class HttpServerMetrics {
  private readonly requests: CounterFamily;
  private readonly duration: HistogramFamily;
  private readonly byRoute = new Map<string, Map<string, Map<number, Cells>>>();

  constructor(registry: Registry) {
    const labelNames = ["route", "method", "status"];
    this.requests = new CounterFamily(registry, {
      name: "callplane_http_requests_total",
      help: "HTTP requests answered, by route, method and status",
      labelNames,
    });
    this.duration = new HistogramFamily(registry, {
      name: "callplane_http_request_duration_seconds",
      help: "Time to answer an HTTP request (until the response ended), by route, method and status",
      labelNames,
      buckets: LATENCY_BUCKETS,
    });
  }

  record(route: string, method: string, status: number, seconds: number): void {
    let byMethod = this.byRoute.get(route);
    if (!byMethod) this.byRoute.set(route, (byMethod = new Map<string, Map<number, Cells>>()));
    let byStatus = byMethod.get(method);
    if (!byStatus) byMethod.set(method, (byStatus = new Map<number, Cells>()));
    let cells = byStatus.get(status);
    if (!cells) {
      const labels = [route, method, String(status)];
      cells = { requests: this.requests.cell(...labels), duration: this.duration.cell(...labels) };
      byStatus.set(status, cells);
    }
    cells.requests.inc();
    cells.duration.observe(seconds);
  }
}
