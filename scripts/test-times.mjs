// A node:test reporter that prints, at the end of a run, how long each test file took (slowest
// first) and its share of the sum. `npm test` runs it beside the spec reporter, so every CI log says
// where the time went, and writes them to dist/.test-times.json (merged with what is there), from
// which the next run starts the longest files first (scripts/bootstrap.mjs). A file's time is its own
// test's duration when the runner reports one (one process per file), else the sum of its top-level
// tests.
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { relative } from "node:path";

const RECORD = "dist/.test-times.json";

export default async function* testTimes(source) {
  const files = new Map();
  const started = Date.now();
  for await (const event of source) {
    if (event.type !== "test:pass" && event.type !== "test:fail") continue;
    const { file, name, nesting, details } = event.data;
    if (!file) continue;
    const f = files.get(file) ?? { own: undefined, top: 0, topNesting: Infinity, tests: 0, failed: 0 };
    const ms = details?.duration_ms ?? 0;
    if (name === file || relative(process.cwd(), file) === name) f.own = ms;
    else {
      if (nesting < f.topNesting) {
        f.topNesting = nesting;
        f.top = 0;
      }
      if (nesting === f.topNesting) {
        f.top += ms;
        f.tests++;
        if (event.type === "test:fail") f.failed++;
      }
    }
    files.set(file, f);
  }
  if (files.size === 0) return;
  const rows = [...files].map(([file, f]) => ({
    file: relative(process.cwd(), file),
    ms: f.own ?? f.top,
    tests: f.tests,
    failed: f.failed,
  }));
  rows.sort((a, b) => b.ms - a.ms);
  const total = rows.reduce((s, r) => s + r.ms, 0);
  const wall = (Date.now() - started) / 1000;
  let out = `\ntest file times (sum ${(total / 1000).toFixed(1)} s over ${rows.length} files, ${wall.toFixed(1)} s wall):\n`;
  for (const r of rows)
    out += `${(r.ms / 1000).toFixed(1).padStart(8)} s ${((100 * r.ms) / total).toFixed(1).padStart(5)}%  ${r.file} (${r.tests} tests${r.failed ? `, ${r.failed} failed` : ""})\n`;
  yield out;
  if (existsSync("dist")) {
    let record = {};
    try {
      record = JSON.parse(readFileSync(RECORD, "utf8"));
    } catch {
      // none yet
    }
    for (const r of rows) record[r.file] = Math.round(r.ms);
    writeFileSync(RECORD, `${JSON.stringify(record, null, 1)}\n`);
  }
}
