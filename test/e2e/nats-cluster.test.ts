// The NATS cluster (nats.cluster.size 3) with the trust model of one server on every node: TLS on
// every client connection with one certificate that covers every node, every user in a named
// account, the auth callout answering logins on any node, the service roles' grants; routes over
// mutual TLS with the stack CA and the route password; and revocation that closes a worker's
// connection on whichever node holds it, and only that one. Real nats-server processes on
// 127.0.84.x (test/testkit/nats-cluster.ts).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { connect as netConnect } from "node:net";
import { join } from "node:path";
import { test } from "node:test";
import { jetstreamManager } from "@nats-io/jetstream";
import { createUser } from "@nats-io/nkeys";
import { connect } from "@nats-io/transport-node";
import { writeFileAtomic } from "../../src/lib/fs.js";
import {
  ensureRouteCredentials,
  natsServerBinary,
  subjects,
  writeNatsServerConfig,
} from "../../src/lib/nats/index.js";
import { waitFor } from "../testkit/client.js";
import { startApi, tmpDir, type Nats } from "../testkit/index.js";
import { startNatsCluster } from "../testkit/nats-cluster.js";
import { deployFunction, freePort } from "../testkit/plane.js";
import { lifo } from "../testkit/proc.js";
import { testPki } from "../testkit/tls.js";
import {
  connectWithNkey,
  connectWithToken,
  issueIdentity,
  plainClient,
  revokeIdentity,
  startCallout,
  type Watched,
} from "../testkit/trust.js";

const REGION = "test";

/** Everything a server sends a client that writes a plain CONNECT and PING, until it closes. */
function plainBytes(host: string, port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = netConnect(port, host, () => s.write('CONNECT {"verbose":false}\r\nPING\r\n'));
    let out = "";
    const timer = setTimeout(() => {
      s.destroy();
      reject(new Error(`${host}:${port} neither answered nor closed the plain connection within 15 s`));
    }, 15_000);
    s.on("data", (d: Buffer) => (out += d.toString("latin1")));
    s.once("error", () => undefined);
    s.once("close", () => {
      clearTimeout(timer);
      resolve(out);
    });
  });
}

async function violation(w: Watched, kind: "Publish" | "Subscription", subject: string): Promise<void> {
  const want = `Permissions Violation for ${kind} to "${subject}`;
  await waitFor(`NATS to refuse: ${want}`, () => w.errors.some((e) => e.includes(want)) || undefined, {
    timeoutMs: 10_000,
  });
}

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

test("every node keeps the trust model: one auth callout answers logins on all three, grants hold on each, a revoked identity loses its connections on every node", async (t) => {
  const ctx = lifo(t);
  const nats = await startNatsCluster(ctx, { region: REGION });
  const api = await startApi(ctx, { nats, workerAuth: "token", queue: { replicas: 3 } });
  // the callout holds one connection, to one node; logins on the others reach it over the routes
  const callout = await startCallout(ctx, nats, api, "token");
  const fn = await deployFunction(api, `cluster-${randomUUID().slice(0, 8)}`);
  const other = await deployFunction(api, `cluster-${randomUUID().slice(0, 8)}`);
  // a stream of three replicas that was just created can answer "stream not found" for a moment
  // while its group elects a leader (seen once in about ten runs; on a 2-core machine also running
  // kube-apiservers, for more than 10 s): ask until it answers, within 30 s
  const jsm = await jetstreamManager(await nats.observe());
  const info = await waitFor(
    "the version's queue",
    () => jsm.streams.info(subjects.stream(REGION, fn.versionId)),
    30_000,
  );
  assert.equal(info.config.num_replicas, 3, "the API created the version's queue with three replicas");
  const ca = nats.pki.ca.certPem;
  const id = await issueIdentity(api, fn, randomUUID());
  const stranger = new TextDecoder().decode(createUser().getSeed());
  const conns: Watched[] = [];
  for (const node of nats.nodes) {
    const one: Nats = { ...nats, url: node.url };
    await assert.rejects(
      connect({ servers: node.url, tls: { ca }, reconnect: false }),
      /Authorization Violation/,
      `${node.name}: a TLS client with no credentials`,
    );
    const plain = await plainClient(node.host, node.port);
    assert.equal(plain.tlsRequired, true, `${node.name}: TLS required`);
    assert.ok(!plain.afterInfo.includes("PONG"), `${node.name} answered a plain client: ${plain.afterInfo}`);
    await assert.rejects(
      connectWithNkey(ctx, one, stranger, "_INBOX_x"),
      /Authorization Violation/,
      `${node.name}: an unknown nkey`,
    );
    const w = await connectWithToken(ctx, one, id.token, { instanceId: id.instanceId });
    // the version's grant, not another's: the same refusal from every node
    w.nc.publish(subjects.work(REGION, other.versionId, randomUUID()), "x");
    await violation(w, "Publish", subjects.work(REGION, other.versionId, "*").replace(/\*$/, ""));
    conns.push(w);
  }
  const askedBy = new Set(
    callout
      .log()
      .filter((l) => l.msg === "Authentication successful" && String(l.user).endsWith(`.${id.instanceId}`))
      .map((l) => String(l.server)),
  );
  assert.deepEqual(
    [...askedBy].sort(),
    nats.nodes.map((n) => n.name).sort(),
    "the callout answered every node",
  );
  // revocation asks every node for its connections and closes the identity's three, one on each
  assert.equal(await revokeIdentity(api, id.instanceId), 200);
  await waitFor(
    "every node to close the revoked identity's connection",
    () => conns.every((c) => c.closed) || undefined,
    {
      timeoutMs: 10_000,
    },
  );
});

test("routes admit only the cluster's own: a server with a foreign CA or the wrong route password never joins", async (t) => {
  const ctx = lifo(t);
  const nats = await startNatsCluster(ctx, { region: REGION });
  const target = nats.nodes[0];
  // a route begins with the TLS handshake: a plain client gets no INFO at all, and no PONG
  const plain = await plainBytes(target.host, target.routePort);
  assert.ok(!/INFO|PONG/.test(plain), `the route port spoke plain NATS: ${plain}`);
  const dir = tmpDir(ctx, "callplane-rogue-");
  const host = "127.0.84.9";
  const good = await nats.pki.issue([host], { clientAuth: true });
  const foreign = await (await testPki()).issue([host], { clientAuth: true });
  const route = ensureRouteCredentials(nats.credentialsDir);
  const cases = [
    {
      what: "the right certificate, a wrong route password",
      cert: good,
      password: "not-the-route-password-0000",
      said: /authentication error|authorization violation/i,
    },
    {
      what: "the right route password, a certificate from another CA",
      cert: foreign,
      password: route.password,
      said: /[^\n]*(tls|x509|certificate)[^\n]*/i,
    },
  ];
  for (const [i, c] of cases.entries()) {
    const d = join(dir, `rogue-${i}`);
    const certFile = join(d, "route.crt");
    const keyFile = join(d, "route.key");
    writeFileAtomic(certFile, c.cert.certPem, 0o644);
    writeFileAtomic(keyFile, c.cert.keyPem, 0o600);
    const files = writeNatsServerConfig(
      d,
      { host, port: await freePort(host) },
      {
        name: `rogue-${i}`,
        security: {
          certFile: nats.certFile,
          keyFile: nats.keyFile,
          credentialsDir: nats.credentialsDir,
          region: REGION,
        },
        cluster: {
          name: "test",
          listen: { host, port: await freePort(host) },
          routes: [{ host: target.host, port: target.routePort }],
          certFile,
          keyFile,
          caFile: nats.caFile,
          user: route.user,
          password: c.password,
        },
      },
    );
    const before = target.log().length;
    const rogue = spawn(natsServerBinary(), ["-c", files.configFile], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    let rogueLog = "";
    rogue.stderr.on("data", (b: Buffer) => (rogueLog += b.toString()));
    const stopRogue = async () => {
      if (rogue.exitCode !== null || rogue.signalCode !== null) return;
      const exited = new Promise((r) => rogue.once("exit", r));
      rogue.kill("SIGKILL");
      await exited;
    };
    ctx.after(stopRogue);
    // the node refuses the route it opened (and the route it is offered): wait for it to say so
    const refused = await waitFor(
      `${target.name} to refuse ${c.what}`,
      () => {
        const said = target.log().slice(before) + rogueLog;
        return c.said.exec(said)?.[0];
      },
      { timeoutMs: 20_000, intervalMs: 100 },
    );
    t.diagnostic(`${c.what}: ${refused}`);
    const h = await nats.health();
    assert.deepEqual(
      h.servers.map((s) => s.name),
      nats.nodes.map((n) => n.name),
      `${c.what}: the cluster is still its three nodes`,
    );
    for (const s of h.servers)
      assert.ok(
        !s.routesTo.some((r) => r.startsWith("rogue")),
        `${s.name} routes to ${s.routesTo.join(",")}`,
      );
    await stopRogue();
  }
});
