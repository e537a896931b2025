// The console's only assets, served by the API itself from /console/assets/ (no page loads
// anything from elsewhere): the stylesheet, the live and logs pages' scripts, the function page's
// graphs script, and uPlot (the npm package `uplot`, MIT), which draws the graphs. The console's own
// are strings in this module, so the TypeScript build that makes dist/ carries them with no copy
// step; uPlot's files are read once, at start, from the installed package (a dependency, so the
// image has it), with its licence notice in front. No bundler: each is one file the page names.
// Each has an ETag (its hash), so a browser revalidates cheaply after the short max-age.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const CSS = `
:root { color-scheme: light dark; --fg: #1b1f24; --bg: #fff; --muted: #57606a; --line: #d0d7de;
  --up: #1a7f37; --down: #cf222e; --degraded: #9a6700; --unknown: #57606a; --accent: #0969da; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6edf3; --bg: #0d1117; --muted: #8d96a0; --line: #30363d;
    --up: #3fb950; --down: #f85149; --degraded: #d29922; --unknown: #8d96a0; --accent: #4493f8; }
}
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; flex-wrap: wrap; align-items: center; gap: .5rem 1.5rem; padding: .6rem 1rem; border-bottom: 1px solid var(--line); }
.brand { font-weight: 600; color: var(--fg); text-decoration: none; }
nav { display: flex; flex-wrap: wrap; align-items: center; gap: .5rem 1rem; flex: 1; }
nav ul { display: flex; flex-wrap: wrap; gap: .25rem 1rem; list-style: none; margin: 0; padding: 0; flex: 1; }
nav a { color: var(--accent); text-decoration: none; padding: .2rem 0; }
nav a[aria-current="page"] { color: var(--fg); font-weight: 600; border-bottom: 2px solid var(--accent); }
a:focus-visible, button:focus-visible, input:focus-visible { outline: 3px solid var(--accent); outline-offset: 2px; }
main { padding: 1rem; max-width: 1400px; }
h1 { font-size: 1.4rem; margin: .2rem 0 1rem; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); white-space: nowrap; }
td.num, th.num { text-align: right; }
code, .id { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .9em; word-break: break-all; }
.state { font-weight: 600; }
[data-state="up"] .state, .state-up { color: var(--up); }
[data-state="down"] .state, .state-down { color: var(--down); }
[data-state="degraded"] .state, [data-state="draining"] .state { color: var(--degraded); }
[data-state="unknown"] .state { color: var(--unknown); }
.muted { color: var(--muted); }
form.inline, form.scale, form.undeploy, form.revoke-identity { display: inline-flex; flex-wrap: wrap; gap: .3rem; align-items: center; margin: 0; }
input[type="number"] { width: 5rem; }
input, button { font: inherit; padding: .3rem .5rem; border: 1px solid var(--line); border-radius: 4px; background: var(--bg); color: var(--fg); }
button { cursor: pointer; background: var(--accent); color: #fff; border-color: var(--accent); }
button.danger { background: var(--down); border-color: var(--down); }
.logout button { background: transparent; color: var(--accent); }
.filter, .lookup, .login { display: flex; flex-wrap: wrap; gap: .5rem; align-items: end; margin: 0 0 1rem; }
.login { flex-direction: column; align-items: stretch; max-width: 28rem; }
label { display: flex; flex-direction: column; gap: .2rem; font-size: .9rem; color: var(--muted); }
.error { border-left: 4px solid var(--down); padding: .5rem .8rem; margin: 0 0 1rem; }
.confirm { border-left: 4px solid var(--degraded); padding: .5rem .8rem; margin: 0 0 1rem; }
.pager { display: flex; gap: 1rem; margin: 1rem 0; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .3rem 1rem; }
dt { color: var(--muted); }
dd { margin: 0; }
#logs td { font-size: .9em; }
#logs .level { font-weight: 600; }
#logs [data-level="warn"] .level { color: var(--degraded); }
#logs [data-level="error"] .level, #logs [data-level="fatal"] .level { color: var(--down); }
#logs time { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; white-space: nowrap; }
table.trace .depth-0 { padding-left: 0.5rem; }
table.trace .depth-1 { padding-left: 1.5rem; }
table.trace .depth-2 { padding-left: 2.5rem; }
table.trace .depth-3 { padding-left: 3.5rem; }
table.trace .depth-4 { padding-left: 4.5rem; }
table.trace .depth-5 { padding-left: 5.5rem; }
table.trace .depth-6 { padding-left: 6.5rem; }
table.trace .depth-7 { padding-left: 7.5rem; }
table.trace .depth-8 { padding-left: 8.5rem; }
.graphs { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 380px), 1fr)); gap: 1rem; margin: 0 0 1rem; }
figure.graph { margin: 0; min-width: 0; }
figure.graph figcaption { font-weight: 600; color: var(--muted); margin: 0 0 .3rem; }
.graph-plot { min-height: 200px; }
.graph-plot .u-legend { font-size: .85rem; color: var(--fg); }
form.deploy { display: flex; flex-wrap: wrap; gap: .5rem; align-items: end; margin: 0 0 1rem; }
select { font: inherit; padding: .3rem .5rem; border: 1px solid var(--line); border-radius: 4px; background: var(--bg); color: var(--fg); }
[data-state="ok"] .state { color: var(--up); }
[data-state="warning"] .state { color: var(--degraded); }
[data-state="expired"] .state { color: var(--down); }
@media (max-width: 700px) {
  main { padding: .6rem; }
  th, td { padding: .3rem .4rem; }
  dl { grid-template-columns: 1fr; }
}
`;

// Replaces the live table's body with what the server rendered (the server escaped it); the
// browser reconnects by itself when the stream drops.
const LIVE_JS = `"use strict";
(function () {
  var body = document.querySelector("#inflight tbody");
  var status = document.getElementById("live-status");
  if (!body || typeof EventSource === "undefined") return;
  var source = new EventSource("/console/live/events");
  source.addEventListener("inflight", function (e) {
    body.innerHTML = e.data;
    if (status) status.textContent = "updated " + new Date().toLocaleTimeString();
  });
  source.addEventListener("error", function () {
    if (status) status.textContent = "reconnecting…";
  });
})();
`;

// The logs page: the table's body replaced by each update for its filter (the URL is on the
// table); Pause closes the stream so lines hold still for reading, Resume opens it again.
const LOGS_JS = `"use strict";
(function () {
  var table = document.getElementById("logs");
  var body = table && table.querySelector("tbody");
  var status = document.getElementById("logs-status");
  var pause = document.getElementById("logs-pause");
  if (!body || typeof EventSource === "undefined") return;
  var source = null;
  function open() {
    source = new EventSource(table.getAttribute("data-events"));
    source.addEventListener("logs", function (e) {
      body.innerHTML = e.data;
      if (status) status.textContent = "updated " + new Date().toLocaleTimeString();
    });
    source.addEventListener("error", function () {
      if (status) status.textContent = "reconnecting…";
    });
  }
  open();
  if (pause)
    pause.addEventListener("click", function () {
      var paused = source !== null;
      if (paused) {
        source.close();
        source = null;
        if (status) status.textContent = "paused";
      } else open();
      pause.textContent = paused ? "Resume" : "Pause";
      pause.setAttribute("aria-pressed", paused ? "true" : "false");
    });
})();
`;

// Draws the function page's hour (the JSON in #hour-data, made by the server: graphs.ts) with
// uPlot, in the page's own colours; marks each plot data-rendered once it is drawn.
const GRAPHS_JS = `"use strict";
(function () {
  var data = document.getElementById("hour-data");
  if (!data || typeof uPlot === "undefined") return;
  var h = JSON.parse(data.textContent);
  var css = getComputedStyle(document.documentElement);
  var color = function (name, fallback) { return css.getPropertyValue(name).trim() || fallback; };
  var fg = color("--muted", "#57606a"), line = color("--line", "#d0d7de");
  var accent = color("--accent", "#0969da"), down = color("--down", "#cf222e"), warn = color("--degraded", "#9a6700");
  var xs = h.requests.map(function (_, i) { return h.start / 1000 + i * 60; });
  var axis = { stroke: fg, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 } };
  var plots = [];
  var width = function (el) { return Math.max(260, el.clientWidth); };
  function plot(id, series, ys, yAxis) {
    var el = document.getElementById(id);
    if (!el) return;
    var u = new uPlot({
      width: width(el), height: 200,
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, Math.max(max, yAxis.floor)]; } } },
      series: [{}].concat(series),
      axes: [axis, { stroke: fg, grid: axis.grid, ticks: axis.ticks, size: 56, values: yAxis.values }],
      cursor: { drag: { x: false, y: false } },
    }, [xs].concat(ys), el);
    el.setAttribute("data-rendered", "true");
    plots.push([u, el]);
  }
  var count = function (u, vals) { return vals.map(function (v) { return String(v); }); };
  plot("graph-rate", [{ label: "requests", stroke: accent, width: 2, fill: accent + "22" }], [h.requests], { floor: 1, values: count });
  // as many decimals as the ticks' step needs (0.25% apart: two)
  var percent = function (u, vals, axis, space, incr) {
    var step = (incr * 100).toFixed(3).replace(/\\.?0+$/, "");
    var digits = step.indexOf(".") < 0 ? 0 : step.length - step.indexOf(".") - 1;
    return vals.map(function (v) { return (100 * v).toFixed(digits) + "%"; });
  };
  // a minute with requests between two without is one point: drawn as a dot, not lost
  var dots = { show: true, size: 5 };
  plot("graph-errors", [{ label: "errors", stroke: down, width: 2, points: dots,
    value: function (u, v) { return v == null ? "–" : (100 * v).toFixed(1) + "%"; } }], [h.errorRatio],
    { floor: 0.01, values: percent });
  plot("graph-latency", [
    { label: "p50 ms", stroke: accent, width: 2, points: dots },
    { label: "p99 ms", stroke: warn, width: 2, points: dots },
  ], [h.p50Ms, h.p99Ms], { floor: 1, values: count });
  var resized;
  window.addEventListener("resize", function () {
    clearTimeout(resized);
    resized = setTimeout(function () {
      plots.forEach(function (p) { p[0].setSize({ width: width(p[1]), height: 200 }); });
    }, 100);
  });
})();
`;

/**
 * uPlot's file from the installed package, its licence notice in front (the minified file has none).
 * Missing (a checkout whose packages predate the dependency: `npm ci`), the page keeps its numbers
 * in words and draws no graph, rather than the API refusing to start over a picture.
 */
function uplotFile(name: string): string {
  const require = createRequire(import.meta.url);
  try {
    const licence = readFileSync(require.resolve("uplot/LICENSE"), "utf8").trim();
    const body = readFileSync(require.resolve(`uplot/dist/${name}`), "utf8");
    return `/*! uPlot (npm package uplot), ${licence.replace(/\*\//g, "* /")} */\n${body}`;
  } catch {
    // (assets are served without a login: no path or message of this machine goes out)
    return "/* uPlot is not installed with this API: run npm ci */\n";
  }
}

export interface Asset {
  body: string;
  contentType: string;
  etag: string;
}

function asset(body: string, contentType: string): Asset {
  return {
    body,
    contentType,
    etag: `"${createHash("sha256").update(body).digest("base64url").slice(0, 16)}"`,
  };
}

export const ASSETS: Readonly<Record<string, Asset>> = {
  "console.css": asset(CSS, "text/css; charset=utf-8"),
  "live.js": asset(LIVE_JS, "text/javascript; charset=utf-8"),
  "logs.js": asset(LOGS_JS, "text/javascript; charset=utf-8"),
  "graphs.js": asset(GRAPHS_JS, "text/javascript; charset=utf-8"),
  "uplot.js": asset(uplotFile("uPlot.iife.min.js"), "text/javascript; charset=utf-8"),
  "uplot.css": asset(uplotFile("uPlot.min.css"), "text/css; charset=utf-8"),
};

export const ASSET_PATHS = {
  css: "/console/assets/console.css",
  liveJs: "/console/assets/live.js",
  logsJs: "/console/assets/logs.js",
  graphsJs: "/console/assets/graphs.js",
  uplotJs: "/console/assets/uplot.js",
  uplotCss: "/console/assets/uplot.css",
} as const;
