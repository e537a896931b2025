import assert from "node:assert/strict";
import type { LookupAddress } from "node:dns";
import { test } from "node:test";
import { podAwareLookup, podNameLookup, type LookupFunction } from "./pod-lookup.js";

function resolve(fn: LookupFunction, name: string): Promise<string> {
  return new Promise((ok, fail) =>
    fn(name, { all: true }, (err, addrs) => (err ? fail(err) : ok((addrs as LookupAddress[])[0].address))),
  );
}

test("pod names resolve to the address they carry; the static map comes first", async () => {
  const fn = podAwareLookup(
    new Map([
      ["invocation.worker.test", "127.0.0.9"],
      ["*.worker.test", "127.0.0.8"],
    ]),
    "nvcf.svc.cluster.local",
  );
  assert.equal(await resolve(fn, "10-0-1-5.invocation.nvcf.svc.cluster.local"), "10.0.1.5");
  assert.equal(await resolve(fn, "Invocation.Worker.Test"), "127.0.0.9");
  assert.equal(await resolve(fn, "127-0-2-1.worker.test"), "127.0.0.8");
  assert.equal(await resolve(fn, "localhost"), "127.0.0.1");
});

test("the proxy's lookup knows pod names only", async () => {
  const fn = podNameLookup();
  assert.equal(await resolve(fn, "127-0-2-1.grpc-headless.nvcf.svc.cluster.local"), "127.0.2.1");
  await assert.rejects(resolve(fn, "localhost"), /not a pod address/);
  await assert.rejects(resolve(fn, "010-0-0-1.x"), /not a pod address/);
});
