import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { holderHex } from "../lib/ids.js";
import { TokenTable, tokenHolder } from "./tokens.js";

test("a token names its holder and is single-use", () => {
  const table = new TokenTable<string>(0xabc);
  const t = table.mint("a");
  assert.equal(tokenHolder(t), 0xabc);
  assert.ok(t.startsWith(`${holderHex(0xabc)}.`));
  assert.ok(table.isOwn(t));
  assert.equal(table.take(t), "a");
  assert.equal(table.take(t), undefined, "a second use is refused");
  assert.equal(tokenHolder("no-holder-here"), undefined);
  assert.equal(new TokenTable<string>(1).isOwn(t), false);
  table.close();
});

test("take with accept leaves a token that does not fit in place", () => {
  const table = new TokenTable<{ kind: string }>(1);
  const t = table.mint({ kind: "request" });
  assert.equal(
    table.take(t, (v) => v.kind === "response"),
    undefined,
  );
  assert.deepEqual(table.peek(t), { kind: "request" });
  table.delete(t);
  assert.equal(table.peek(t), undefined);
  table.close();
});

test("an expired token is refused", async () => {
  const table = new TokenTable<number>(1, 30);
  const t = table.mint(7);
  await sleep(60);
  assert.equal(table.take(t), undefined);
  assert.equal(table.size, 0);
  table.close();
});
