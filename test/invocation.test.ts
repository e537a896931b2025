import assert from "node:assert/strict";
import { test } from "node:test";
import { startPlane } from "./testkit/plane.js";

test("a client invokes a function and gets the inference server's answer with NVCF headers", async (t) => {
  const plane = await startPlane(t);
  const res = await fetch(plane.invokeUrl(), {
    method: "POST",
    headers: { authorization: `Bearer ${plane.fn.apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ hello: "callplane" }),
  });
  const text = await res.text();
  assert.equal(res.status, 200, text);
  assert.deepEqual(JSON.parse(text), { hello: "callplane" });
  assert.match(
    res.headers.get("nvcf-reqid") ?? "",
    /^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
  );
  assert.equal(res.headers.get("nvcf-status"), "fulfilled");
});
