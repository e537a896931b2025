// The NATS cluster (nats.cluster.size 3) with the trust model of one server on every node: TLS on
// every client connection with one certificate that covers every node, every user in a named
// account, the auth callout answering logins on any node, the service roles' grants; routes over
// mutual TLS with the stack CA and the route password; and revocation that closes a worker's
// connection on whichever node holds it, and only that one. Real nats-server processes on
// 127.0.84.x (test/testkit/nats-cluster.ts).
import assert from "node:assert/strict";
import { test } from "node:test";
import { startNatsCluster } from "./testkit/nats-cluster.js";
import { lifo } from "./testkit/proc.js";

test("a three-node cluster forms: every node healthy, routed to the two others, one JetStream leader", async (t) => {
  const ctx = lifo(t);
  const nats = await startNatsCluster(ctx);
  const h = await nats.health();
  assert.equal(h.ok, true, h.problems.join("; "));
  assert.deepEqual(
    h.servers.map((s) => s.name),
    nats.nodes.map((n) => n.name),
  );
  for (const s of h.servers)
    assert.deepEqual(
      s.routesTo,
      nats.nodes.map((n) => n.name).filter((n) => n !== s.name),
    );
  assert.ok(h.metaLeader && nats.nodes.some((n) => n.name === h.metaLeader), String(h.metaLeader));
});
