import assert from "node:assert/strict";
import { test } from "node:test";
import { FunctionSeriesTable, OTHER_FUNCTION } from "./function-series.js";

test("a version gets its own series up to the limit; later ones share the `other` series", () => {
  const made: string[] = [];
  const table = new FunctionSeriesTable(2, (fid, fvid) => {
    made.push(`${fid}/${fvid}`);
    return { fid, fvid };
  });
  const a = table.get("f1", "v1");
  assert.equal(table.get("f1", "v1"), a, "one series per version");
  table.get("f1", "v2");
  const other = table.get("f2", "v3");
  assert.deepEqual(other, { fid: OTHER_FUNCTION, fvid: OTHER_FUNCTION });
  assert.equal(table.get("f3", "v4"), other, "every later version shares it");
  assert.equal(table.get("f1", "v2").fvid, "v2", "versions seen before the limit keep theirs");
  assert.deepEqual(made, ["f1/v1", "f1/v2", "other/other"]);
  assert.equal(table.size, 2);
});

test("values() lists every series made, the shared one last", () => {
  const table = new FunctionSeriesTable(1, (fid, fvid) => `${fid}/${fvid}`);
  assert.deepEqual([...table.values()], []);
  table.get("f1", "v1");
  table.get("f2", "v2");
  assert.deepEqual([...table.values()], ["f1/v1", `${OTHER_FUNCTION}/${OTHER_FUNCTION}`]);
});
