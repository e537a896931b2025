import assert from "node:assert/strict";
import { test } from "node:test";
import { createRegistry } from "./metrics.js";
import {
  CounterFamily,
  GaugeFamily,
  HistogramFamily,
  statusClassIndex,
  STATUS_CLASSES,
} from "./metric-cells.js";

test("cells expose as prom-client's metrics do: default labels, cumulative buckets, +Inf, _sum and _count", async () => {
  const registry = createRegistry("t", { defaultMetrics: false });
  const c = new CounterFamily(registry, {
    name: "t_requests_total",
    help: "requests",
    labelNames: ["route"],
  });
  const g = new GaugeFamily(registry, { name: "t_in_flight", help: "held", labelNames: ["route"] });
  const h = new HistogramFamily(registry, {
    name: "t_seconds",
    help: "time",
    labelNames: ["route"],
    buckets: [1, 0.1],
  });
  const cell = c.cell("/a");
  assert.equal(c.cell("/a"), cell, "one cell per label set");
  cell.inc();
  cell.inc(2);
  g.cell("/a").inc();
  g.cell("/a").dec();
  g.cell("/b").set(4);
  for (const v of [0.05, 0.1, 0.5, 3]) h.cell("/a").observe(v);
  assert.equal(
    await registry.metrics(),
    [
      "# HELP t_requests_total requests",
      "# TYPE t_requests_total counter",
      't_requests_total{route="/a",service="t"} 3',
      "",
      "# HELP t_in_flight held",
      "# TYPE t_in_flight gauge",
      't_in_flight{route="/a",service="t"} 0',
      't_in_flight{route="/b",service="t"} 4',
      "",
      "# HELP t_seconds time",
      "# TYPE t_seconds histogram",
      't_seconds_bucket{route="/a",le="0.1",service="t"} 2',
      't_seconds_bucket{route="/a",le="1",service="t"} 3',
      't_seconds_bucket{route="/a",le="+Inf",service="t"} 4',
      't_seconds_sum{route="/a",service="t"} 3.65',
      't_seconds_count{route="/a",service="t"} 4',
      "",
    ].join("\n"),
  );
  assert.throws(() => c.cell("/a", "extra"), /takes 1 label values, not 2/);
  registry.resetMetrics();
  assert.match(await registry.metrics(), /^t_seconds_count\{route="\/a",service="t"\} 0$/m);
});

test("status classes", () => {
  assert.deepEqual(
    [0, 101, 200, 204, 302, 404, 499, 503, 600].map((s) => STATUS_CLASSES[statusClassIndex(s)]),
    ["none", "1xx", "2xx", "2xx", "3xx", "4xx", "4xx", "5xx", "none"],
  );
});
