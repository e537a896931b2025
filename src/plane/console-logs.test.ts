// A service's recent lines as the console's logs question reads them: kept by createLogger at the
// logger's level (child loggers included), bounded, newest first, and filtered by request and
// function id.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { LogRing } from "../lib/log-ring.js";
import { createLogger, recentLogLines, silentLogger } from "../lib/log.js";
import { matchingLines } from "./console-logs.js";

const R1 = "0a0b0c0d-0000-8000-8000-000000000001";
const R2 = "0a0b0c0d-0000-8000-8000-000000000002";
const F1 = "11111111-2222-4333-8444-555555555555";

test("createLogger keeps the lines it writes at its level, its children's too; others keep none", (t) => {
  const dir = mkdtempSync(join(tmpdir(), "callplane-log-ring-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const logger = createLogger("invocation", { destination: join(dir, "x.log"), sync: true, level: "info" });
  logger.debug({ requestId: R1 }, "not kept: below the level");
  logger.info({ requestId: R1, functionId: F1 }, "first");
  logger.child({ part: "relay" }).warn({ requestId: R2 }, "second");
  const ring = recentLogLines(logger);
  assert.ok(ring);
  const lines = [...ring.newestFirst()].map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.deepEqual(
    lines.map((l) => [l.msg, l.level, l.requestId, l.service]),
    [
      ["second", "warn", R2, "invocation"],
      ["first", "info", R1, "invocation"],
    ],
  );
  assert.equal(recentLogLines(silentLogger()), undefined);
  assert.equal(
    recentLogLines(createLogger("x", { destination: join(dir, "y.log"), sync: true, recentLines: 0 })),
    undefined,
  );
});

test("the ring holds the last lines only, newest first", () => {
  const ring = new LogRing(3);
  assert.deepEqual([...ring.newestFirst()], []);
  for (const l of ["a", "b", "c", "d", "e"]) ring.push(l);
  assert.deepEqual([...ring.newestFirst()], ["e", "d", "c"]);
});

test("matching lines: by request id, by function id, both, a limit; a line that only mentions an id is not one of its lines", () => {
  const lines = [
    JSON.stringify({ msg: "a", requestId: R1, functionId: F1 }),
    JSON.stringify({ msg: "b", requestId: R2 }),
    JSON.stringify({ msg: "c", requestId: R1 }),
    JSON.stringify({ msg: `d about ${R1}`, functionId: F1 }),
    "not json " + R1,
  ].map((l) => `${l}\n`);
  const msgs = (q: Parameters<typeof matchingLines>[1]) =>
    matchingLines(lines, q).map((l) => (JSON.parse(l) as { msg: string }).msg);
  assert.deepEqual(msgs({ requestId: R1 }), ["a", "c"]);
  assert.deepEqual(msgs({ functionId: F1 }), ["a", `d about ${R1}`]);
  assert.deepEqual(msgs({ requestId: R1, functionId: F1 }), ["a"]);
  assert.deepEqual(msgs({ limit: 2 }).length, 2);
  assert.equal(matchingLines(lines, {}).length, 5, "unfiltered: every line, parsed or not");
  assert.deepEqual(msgs({ requestId: R1, limit: 0 }), []);
});
