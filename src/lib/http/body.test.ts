import assert from "node:assert/strict";
import { test } from "node:test";
import { CallplaneError } from "../errors.js";
import { checkJsonDepth, invalidUtf8Offset, isJsonContentType, parseJsonBody } from "./body.js";

const code = (f: () => unknown): string | undefined => {
  try {
    f();
  } catch (err) {
    return err instanceof CallplaneError ? err.code : "not a CallplaneError";
  }
  return undefined;
};

test("only application/json (optionally charset=utf-8) is JSON", () => {
  for (const t of [
    "application/json",
    "Application/JSON",
    "application/json; charset=utf-8",
    'application/json;charset="UTF-8"',
  ])
    assert.ok(isJsonContentType(t), t);
  for (const t of [
    "application/json-patch",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/vnd.api+json",
    "application/json; charset=iso-8859-1",
    "application/jsonx",
    "text/json",
    "text/plain",
    "",
  ])
    assert.ok(!isJsonContentType(t), t);
});

test("the depth limit: 64 levels pass, 65 do not, and the path says where", () => {
  const nest = (n: number) => "[".repeat(n) + "]".repeat(n);
  assert.doesNotThrow(() => checkJsonDepth(nest(64)));
  assert.equal(
    code(() => checkJsonDepth(nest(65))),
    "JSON_TOO_DEEP",
  );
  // a million levels: a scan, no recursion, so no stack overflow
  assert.equal(
    code(() => checkJsonDepth(nest(1_000_000))),
    "JSON_TOO_DEEP",
  );
  const doc = `{"a":[1,{"b c":2},{"x\\"y":${nest(70)}}],"z":"[[[[{{{{"}`;
  assert.throws(
    () => checkJsonDepth(doc),
    (err: CallplaneError) => /at a\[2\]\["x\\"y"\](\[0\])+;/.test(err.message),
  );
  // brackets inside strings do not count
  assert.doesNotThrow(() => checkJsonDepth(JSON.stringify({ s: "[".repeat(1000) })));
  // sensitive: the path stops after three steps
  assert.throws(
    () => checkJsonDepth(`{"secrets":[{"value":{"k":${nest(70)}}}]}`, 64, { sensitive: true }),
    (err: CallplaneError) => /at secrets\[0\]\.value…;/.test(err.message) && !err.message.includes('"k"'),
  );
});

test("invalid UTF-8 is found at its offset; well-formed text of every length passes", () => {
  assert.equal(invalidUtf8Offset(Buffer.from("aé€𝄞")), -1);
  for (const [hex, at] of [
    ["61e9", 1], // Latin-1 é
    ["c0af", 0], // overlong /
    ["eda080", 0], // a surrogate
    ["f4908080", 0], // past U+10FFFF
    ["61e282", 1], // cut short
    ["ff", 0],
  ] as const)
    assert.equal(invalidUtf8Offset(Buffer.from(hex, "hex")), at, hex);
  assert.equal(
    code(() => parseJsonBody(Buffer.from('"\xe9"', "latin1"))),
    "INVALID_UTF8",
  );
  assert.deepEqual(parseJsonBody(Buffer.from('{"a":"é"}')), { a: "é" });
  assert.equal(
    code(() => parseJsonBody(Buffer.from("{"))),
    "MALFORMED_JSON",
  );
});
