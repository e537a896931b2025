// The replica registry against a real nats-server: its bucket lives in memory, so a nats-server
// that restarts loses it; each replica makes it again at its next refresh, and is found again.
import assert from "node:assert/strict";
import { test } from "node:test";
import { jetstreamManager } from "@nats-io/jetstream";
import { silentLogger } from "../../../src/lib/log.js";
import { ReplicaRegistry } from "../../../src/plane/registry.js";
import { waitFor } from "../../testkit/client.js";
import { startNats } from "../../testkit/nats.js";

test("a registry bucket that NATS lost (a restart loses a memory stream) is made again, and the replica found", async (t) => {
  const nats = await startNats(t);
  const nc = await nats.observe();
  const bucket = "registry_test";
  // a short TTL: refreshes every 500 ms
  const registry = new ReplicaRegistry(
    nc,
    { holder: 7, relayUrl: "https://127.0.0.7:9443" },
    silentLogger(),
    1500,
    bucket,
  );
  await registry.start();
  t.after(() => registry.close());
  assert.equal((await registry.lookup(7))?.relayUrl, "https://127.0.0.7:9443");

  // what a nats-server restart does to a memory stream
  const jsm = await jetstreamManager(nc);
  await jsm.streams.delete(`KV_${bucket}`);
  await assert.rejects(jsm.streams.info(`KV_${bucket}`), /stream not found/);

  await waitFor("the registry's bucket to be made again", async () =>
    (await jsm.streams.info(`KV_${bucket}`).catch(() => undefined)) ? true : undefined,
  );
  const found = await waitFor(
    "the replica to be found again",
    async () => (await registry.lookup(7).catch(() => undefined)) ?? undefined,
  );
  assert.equal(found.relayUrl, "https://127.0.0.7:9443");
});
