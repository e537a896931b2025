// The configuration rules that keep callbacks routable (docs/configuration.md, "How it is read"):
// split-plane URLs with the callback proxy, the proxy URL's name, N replicas behind one callback
// URL without the relay, pod networks; unknown keys, wrong types and environment overrides; and a
// service that refuses to start on a configuration that cannot work. Every refusal must name the
// fields involved, since that is what an operator reads.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import {
  ConfigError,
  databaseProblems,
  loadConfig,
  localNatsClusterProblems,
  localPodNetworkProblems,
  type ConfigInput,
} from "../../src/lib/config/index.js";
import { POD_DATABASE_URL } from "../../src/deploy/index.js";
import { tracingFromEnv, tracingSettings, tracingWorkerEnv } from "../../src/lib/tracing/index.js";
import { distRoot, tmpDir } from "../testkit/index.js";

// compiled to dist/test/unit/, so the repository root is three levels up
const EXAMPLES_DIR = join(import.meta.dirname, "..", "..", "..", "examples");

/** Loads with no file and no process environment (only what the test gives). */
function load(overrides: ConfigInput = {}, env: NodeJS.ProcessEnv = {}) {
  return loadConfig({ overrides, env, cwd: "/tmp" });
}

/** The problems a refused configuration lists (fails if it loads). */
function problems(overrides: ConfigInput = {}, env: NodeJS.ProcessEnv = {}): string[] {
  try {
    load(overrides, env);
  } catch (err) {
    assert.ok(err instanceof ConfigError, `not a ConfigError: ${String(err)}`);
    assert.match(err.message, /^invalid configuration \(defaults\):\n {2}- /);
    for (const p of err.problems) assert.ok(err.message.includes(p), "the message lists every problem");
    return err.problems;
  }
  assert.fail(`the configuration loaded: ${JSON.stringify(overrides)} ${JSON.stringify(env)}`);
}

function assertNames(text: string, keys: string[]): void {
  for (const k of keys) assert.ok(text.includes(k), `the message does not name ${k}: ${text}`);
}

test("the defaults load, frozen, with the proxy on and its URL derived", () => {
  const c = load();
  assert.equal(c.workerCallbackProxy.enabled, true);
  assert.equal(c.invocation.relay.enabled, true);
  assert.equal(c.global.workerEndpoints.invocationProxyURL, "https://invocation.worker.callplane.test:10084");
  assert.ok(Object.isFrozen(c) && Object.isFrozen(c.invocation.relay));
  assert.throws(() => {
    (c.invocation as { replicaCount: number }).replicaCount = 9;
  }, TypeError);
});

test("with the callback proxy on, each split-plane worker URL is refused by name", () => {
  const cases: Array<[string, ConfigInput]> = [
    [
      "global.workerEndpoints.invocationServiceURL",
      { global: { workerEndpoints: { invocationServiceURL: "http://lb.example.com:8080" } } },
    ],
    [
      "global.workerEndpoints.grpcProxyWorkerConnectURL",
      { global: { workerEndpoints: { grpcProxyWorkerConnectURL: "https://grpc.example.com" } } },
    ],
    ["grpcproxy.workerConnectBaseURL", { grpcproxy: { workerConnectBaseURL: "https://grpc.example.com" } }],
    ["invocation.selfAddress", { invocation: { selfAddress: "http://lb.example.com:8080" } }],
  ];
  for (const [key, overrides] of cases) {
    const p = problems(overrides);
    assert.equal(p.length, 1, `${key}: ${p.join(" | ")}`);
    assertNames(p[0], [key, "workerCallbackProxy.enabled", `Clear ${key}`]);
    // the same URL with the proxy off is a valid split-plane setup
    assert.doesNotThrow(() => load({ ...overrides, workerCallbackProxy: { enabled: false } }), key);
  }
  // all four at once: four problems, each naming its own key
  const all = problems({
    global: {
      workerEndpoints: {
        invocationServiceURL: "http://lb.example.com:8080",
        grpcProxyWorkerConnectURL: "https://grpc.example.com",
      },
    },
    grpcproxy: { workerConnectBaseURL: "https://grpc.example.com" },
    invocation: { selfAddress: "http://lb.example.com:8080" },
  });
  assert.equal(all.length, 4, all.join(" | "));
  for (const [i, [key]] of cases.entries()) assert.ok(all[i].startsWith(`${key} is set`), all[i]);
});

test("global.workerEndpoints.invocationProxyURL must be https under *.<workerDomain>", () => {
  const url = (u: string): ConfigInput => ({ global: { workerEndpoints: { invocationProxyURL: u } } });
  const http = problems(url("http://invocation.worker.callplane.test:10084"));
  assert.equal(http.length, 1);
  assertNames(http[0], ["global.workerEndpoints.invocationProxyURL", "https"]);

  for (const host of [
    "invocation.other.example",
    "a.invocation.worker.callplane.test",
    "worker.callplane.test",
  ]) {
    const p = problems(url(`https://${host}:10084`));
    assert.equal(p.length, 1, host);
    assertNames(p[0], [
      "global.workerEndpoints.invocationProxyURL",
      "workerCallbackProxy.workerDomain",
      host,
    ]);
  }
  // http and another domain: both problems
  assert.equal(problems(url("http://invocation.other.example")).length, 2);

  const good = load(url("https://callbacks.worker.callplane.test:443"));
  assert.equal(good.global.workerEndpoints.invocationProxyURL, "https://callbacks.worker.callplane.test:443");
  const ownDomain = load({
    ...url("https://invocation.grpc-worker.example.com:10084"),
    workerCallbackProxy: { workerDomain: "grpc-worker.example.com" },
  });
  assert.equal(ownDomain.workerCallbackProxy.workerDomain, "grpc-worker.example.com");
});

test("attach routes off the client port need the worker TLS listener and no relay", () => {
  const off = (proxy: ConfigInput["workerCallbackProxy"], relay: boolean): ConfigInput => ({
    invocation: { attachOnClientPort: false, relay: { enabled: relay } },
    workerCallbackProxy: proxy,
  });
  const noTls = problems(off({ enabled: true, invocation: { upstreamTls: { enabled: false } } }, false));
  assert.equal(noTls.length, 1, noTls.join(" | "));
  assertNames(noTls[0], [
    "invocation.attachOnClientPort",
    "workerCallbackProxy.enabled",
    "workerCallbackProxy.invocation.upstreamTls.enabled",
  ]);
  const relayed = problems(off({ enabled: true }, true));
  assert.equal(relayed.length, 1, relayed.join(" | "));
  assertNames(relayed[0], ["invocation.attachOnClientPort", "invocation.relay.enabled"]);
  const ok = load(off({ enabled: true }, false));
  assert.equal(ok.invocation.attachOnClientPort, false);
  // the defaults: callbacks on the client port, /metrics left to the deployment (null)
  const d = load({});
  assert.equal(d.invocation.attachOnClientPort, true);
  assert.equal(d.invocation.metricsOnClientPort, null);
});

test("several replicas behind one callback URL need the relay", () => {
  const base = (relay: boolean, shared: ConfigInput): ConfigInput => ({
    ...shared,
    invocation: { ...shared.invocation, replicaCount: 3, relay: { enabled: relay } },
    // the split-plane URL is allowed only without the proxy
    workerCallbackProxy: { enabled: false },
  });
  const sharedUrls: Array<[string, ConfigInput]> = [
    [
      "global.workerEndpoints.invocationServiceURL",
      { global: { workerEndpoints: { invocationServiceURL: "http://lb.example.com:8080" } } },
    ],
    ["invocation.selfAddress", { invocation: { selfAddress: "http://lb.example.com:8080" } }],
  ];
  for (const [key, shared] of sharedUrls) {
    const p = problems(base(false, shared));
    assert.equal(p.length, 1, p.join(" | "));
    assertNames(p[0], ["invocation.replicaCount", key, "invocation.relay.enabled", "is 3"]);
    assert.match(p[0], /Turn invocation\.relay\.enabled on, or set invocation\.replicaCount to 1/);
    const ok = load(base(true, shared));
    assert.equal(ok.invocation.replicaCount, 3);
    assert.equal(ok.invocation.relay.enabled, true);
    // one replica holds every request: nothing to relay
    assert.doesNotThrow(() =>
      load({
        ...base(false, shared),
        invocation: { ...shared.invocation, replicaCount: 1, relay: { enabled: false } },
      }),
    );
  }
  // no shared URL: pod addressing reaches each replica, the relay may be off
  assert.doesNotThrow(() => load({ invocation: { replicaCount: 3, relay: { enabled: false } } }));
});

test("pod networks: none, or one wider than /8, is refused", () => {
  const nets = (podNetworks: string[]): ConfigInput => ({ workerCallbackProxy: { podNetworks } });
  const all = problems(nets(["0.0.0.0/0"]));
  assert.equal(all.length, 1, all.join(" | "));
  assert.match(all[0], /^workerCallbackProxy\.podNetworks\.0: .*too wide/);
  const wide = problems(nets(["10.0.0.0/16", "10.0.0.0/7"]));
  assert.equal(wide.length, 1);
  assert.match(wide[0], /^workerCallbackProxy\.podNetworks\.1: .*too wide/);
  const none = problems(nets([]));
  assert.equal(none.length, 1);
  assert.match(none[0], /^workerCallbackProxy\.podNetworks: must name at least one pod network/);
  const bad = problems(nets(["10.0.0.0"]));
  assert.match(bad[0], /^workerCallbackProxy\.podNetworks\.0: must be an IPv4 CIDR/);
  // from the environment too
  assert.match(
    problems({}, { CALLPLANE__WORKER_CALLBACK_PROXY__POD_NETWORKS: '["0.0.0.0/0"]' })[0],
    /^workerCallbackProxy\.podNetworks\.0: .*too wide/,
  );
  assert.match(
    problems({}, { CALLPLANE__WORKER_CALLBACK_PROXY__POD_NETWORKS: "[]" })[0],
    /^workerCallbackProxy\.podNetworks: /,
  );
  assert.deepEqual(load(nets(["10.0.0.0/8", "192.168.1.0/24"])).workerCallbackProxy.podNetworks, [
    "10.0.0.0/8",
    "192.168.1.0/24",
  ]);
});

test("unknown keys and wrong types are all named by their path, at once", (t) => {
  const p = problems({
    invocation: { relay: { enabeld: true }, replicaCount: "3" },
    log: { level: "loud" },
    nope: {},
  } as unknown as ConfigInput);
  assert.equal(p.length, 4, p.join(" | "));
  assert.ok(p.includes("invocation.relay.enabeld: unknown key"), p.join(" | "));
  assert.ok(p.includes("nope: unknown key"), p.join(" | "));
  assert.ok(
    p.some((x) => /^invocation\.replicaCount: .*number/.test(x)),
    p.join(" | "),
  );
  assert.ok(
    p.some((x) => /^log\.level: .*"info"/.test(x)),
    p.join(" | "),
  );
  assert.match(problems({ invocation: { replicaCount: 0 } })[0], /^invocation\.replicaCount: .*>=1/);
  assert.match(
    problems({ workerCallbackProxy: { enabled: "yes" } } as unknown as ConfigInput)[0],
    /^workerCallbackProxy\.enabled: .*boolean/,
  );

  // from a file, the message names the file
  const dir = tmpDir(t);
  const file = join(dir, "env.yaml");
  writeFileSync(file, "invocation:\n  relay:\n    enabeld: false\n");
  assert.throws(
    () => loadConfig({ file, env: {}, cwd: dir }),
    (err: unknown) =>
      err instanceof ConfigError &&
      err.message.startsWith(`invalid configuration (${file}):`) &&
      err.problems.join() === "invocation.relay.enabeld: unknown key",
  );
});

test("environment overrides: CALLPLANE__ names, YAML values, checked like the file", () => {
  assert.equal(load({}, { CALLPLANE__INVOCATION__REPLICA_COUNT: "3" }).invocation.replicaCount, 3);
  // an override wins over the document
  assert.equal(
    load({ invocation: { replicaCount: 2 } }, { CALLPLANE__INVOCATION__REPLICA_COUNT: "5" }).invocation
      .replicaCount,
    5,
  );
  assert.deepEqual(problems({}, { CALLPLANE__NOPE: "1" }), [
    "CALLPLANE__NOPE: nope is not a configuration key",
  ]);
  assert.deepEqual(problems({}, { CALLPLANE__INVOCATION__REPLICAS: "3" }), [
    "CALLPLANE__INVOCATION__REPLICAS: invocation.replicas is not a configuration key",
  ]);
  assert.deepEqual(problems({}, { CALLPLANE__LOG__LEVEL__X: "1" }), [
    "CALLPLANE__LOG__LEVEL__X: log.level.x is not a configuration key",
  ]);
  // values are YAML: a whole section, a quoted string, null for an empty value
  assert.equal(
    load({}, { CALLPLANE__INVOCATION__RELAY: "{enabled: false}" }).invocation.relay.enabled,
    false,
  );
  assert.equal(load({}, { CALLPLANE__GLOBAL__REGION: '"3"' }).global.region, "3");
  assert.match(
    problems({}, { CALLPLANE__INVOCATION__REPLICA_COUNT: '"3"' })[0],
    /^invocation\.replicaCount: /,
  );
  assert.match(problems({}, { CALLPLANE__LOG__LEVEL: "" })[0], /^log\.level: /);
  // segments match ignoring case and underscores
  assert.equal(
    load(
      {},
      {
        CALLPLANE__GLOBAL__WORKER_ENDPOINTS__INVOCATIONSERVICEURL: "http://lb:8080",
        CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "false",
      },
    ).global.workerEndpoints.invocationServiceURL,
    "http://lb:8080",
  );
  // one underscore: not an override
  assert.doesNotThrow(() => load({}, { CALLPLANE_CONFIG: "/nonexistent.yaml", CALLPLANE_NATS_SERVER: "/x" }));
  // overrides go through the cross-field rules too
  const p = problems(
    {},
    {
      CALLPLANE__INVOCATION__SELF_ADDRESS: "http://lb:8080",
      CALLPLANE__INVOCATION__REPLICA_COUNT: "3",
      CALLPLANE__INVOCATION__RELAY__ENABLED: "false",
    },
  );
  // the proxy is on by default, so the shared URL breaks two rules
  assert.equal(p.length, 2, p.join(" | "));
  assertNames(p.join("\n"), [
    "invocation.replicaCount",
    "invocation.selfAddress",
    "invocation.relay.enabled",
    "workerCallbackProxy.enabled",
  ]);
});

test(
  "the invocation service refuses to start on a configuration that cannot route callbacks",
  { timeout: 30_000 },
  async (t) => {
    const dir = tmpDir(t);
    const run = (extra: NodeJS.ProcessEnv) =>
      new Promise<{ code: number | null; stderr: string }>((resolve, reject) => {
        const child = spawn(process.execPath, [join(distRoot, "src", "services", "invocation", "main.js")], {
          cwd: dir,
          // nothing from this process's environment: no CALLPLANE_CONFIG, no stray overrides
          env: {
            PATH: process.env.PATH,
            POD_IP: "127.0.50.9",
            CALLPLANE__GLOBAL__DATA_DIR: dir,
            CALLPLANE__LOG__LEVEL: "silent",
            CALLPLANE__INVOCATION__REPLICA_COUNT: "3",
            CALLPLANE__WORKER_CALLBACK_PROXY__ENABLED: "false",
            CALLPLANE__GLOBAL__WORKER_ENDPOINTS__INVOCATION_SERVICE_URL: "http://lb:8080",
            ...extra,
          },
          stdio: ["ignore", "ignore", "pipe"],
        });
        let stderr = "";
        child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
        const kill = setTimeout(() => child.kill("SIGKILL"), 20_000);
        child.once("error", reject);
        child.once("exit", (code) => {
          clearTimeout(kill);
          resolve({ code, stderr });
        });
      });

    const refused = await run({ CALLPLANE__INVOCATION__RELAY__ENABLED: "false" });
    assert.equal(refused.code, 2, refused.stderr);
    assert.match(refused.stderr, /^invocation: invalid configuration \(defaults\):/);
    assertNames(refused.stderr, [
      "invocation.replicaCount is 3",
      "global.workerEndpoints.invocationServiceURL",
      "invocation.relay.enabled is false",
      "Turn invocation.relay.enabled on",
    ]);

    // the same settings with the relay on pass validation: the service gets as far as its own
    // start-up (and stops there, for want of a service token in the empty data folder)
    const passed = await run({ CALLPLANE__INVOCATION__RELAY__ENABLED: "true" });
    assert.equal(passed.code, 1, passed.stderr);
    assert.doesNotMatch(passed.stderr, /invalid configuration/);
    assert.match(passed.stderr, /invocation failed to start/);
  },
);

test("nats.workerAuth is nkey or token, token by default; token mode needs a webhook URL; the URL is derived by default", () => {
  const bad = problems({ nats: { workerAuth: "jwt" as never } });
  assert.deepEqual(bad, ["nats.workerAuth: nats.workerAuth must be nkey or token"]);
  const env = problems({}, { CALLPLANE__NATS__WORKER_AUTH: "oauth" });
  assert.ok(env[0].includes("nats.workerAuth must be nkey or token"), env[0]);
  const empty = problems({
    nats: { workerAuth: "token", authCallout: { workerTokenAuth: { webhookUrl: "" } } },
  });
  assert.equal(empty.length, 1);
  assertNames(empty[0], ["nats.workerAuth", "nats.authCallout.workerTokenAuth.webhookUrl"]);
  const c = load({ nats: { workerAuth: "token" }, api: { url: "http://api.example:8080" } });
  assert.equal(
    c.nats.authCallout.workerTokenAuth.webhookUrl,
    "http://api.example:8080/v2/nvcf/webhook/nats-auth",
  );
  // token mode is the default, and the rule holds for it without the key being set
  assert.equal(load().nats.workerAuth, "token");
  const emptyByDefault = problems({ nats: { authCallout: { workerTokenAuth: { webhookUrl: "" } } } });
  assert.equal(emptyByDefault.length, 1);
  assertNames(emptyByDefault[0], ["nats.workerAuth", "nats.authCallout.workerTokenAuth.webhookUrl"]);
  // nkey mode does not use the webhook: an empty one is not an error there
  assert.doesNotThrow(() =>
    load({ nats: { workerAuth: "nkey", authCallout: { workerTokenAuth: { webhookUrl: "" } } } }),
  );
  // an empty token source is the default source
  assert.equal(load().compute.workerIdentity.tokenSource, "");
  assert.match(problems({ compute: { workerIdentity: { tokenSource: "off" as never } } })[0], /tokenSource/);
});

test("grpc-proxy: several replicas behind one tunnel address need the relay; the two names of that address must agree", () => {
  const base = (relay: boolean, shared: ConfigInput): ConfigInput => ({
    ...shared,
    grpcproxy: { ...shared.grpcproxy, replicaCount: 3, relay: { enabled: relay } },
    workerCallbackProxy: { enabled: false },
  });
  const sharedUrls: Array<[string, ConfigInput]> = [
    [
      "grpcproxy.workerConnectBaseURL",
      { grpcproxy: { workerConnectBaseURL: "http://grpc.example.com:10086" } },
    ],
    [
      "global.workerEndpoints.grpcProxyWorkerConnectURL",
      { global: { workerEndpoints: { grpcProxyWorkerConnectURL: "http://grpc.example.com:10086" } } },
    ],
  ];
  for (const [key, shared] of sharedUrls) {
    const p = problems(base(false, shared));
    assert.equal(p.length, 1, p.join(" | "));
    assertNames(p[0], ["grpcproxy.replicaCount", key, "grpcproxy.relay.enabled", "is 3"]);
    assert.equal(load(base(true, shared)).grpcproxy.relay.enabled, true);
  }
  const both = problems({
    workerCallbackProxy: { enabled: false },
    grpcproxy: { workerConnectBaseURL: "http://a.example.com:10086" },
    global: { workerEndpoints: { grpcProxyWorkerConnectURL: "http://b.example.com:10086" } },
  });
  assert.equal(both.length, 1, both.join(" | "));
  assertNames(both[0], [
    "grpcproxy.workerConnectBaseURL",
    "global.workerEndpoints.grpcProxyWorkerConnectURL",
  ]);
  const tls = problems({ grpcproxy: { tls: { enabled: true } } });
  assertNames(tls[0], ["grpcproxy.tls.enabled", "grpcproxy.tls.certFile", "grpcproxy.tls.keyFile"]);
});

test("the local stack's pod networks must lie inside the proxy's, naming both keys", () => {
  const c = load({ workerCallbackProxy: { podNetworks: ["127.0.1.0/24"] } });
  const p = localPodNetworkProblems(c);
  assert.equal(p.length, 1, p.join(" | "));
  assertNames(p[0], ["grpcproxy.podNetwork", "127.0.2.0/24", "workerCallbackProxy.podNetworks"]);
  assert.deepEqual(localPodNetworkProblems(load()), []);
  assert.deepEqual(
    localPodNetworkProblems(
      load({ grpcproxy: { replicaCount: 0 }, workerCallbackProxy: { podNetworks: ["127.0.1.0/24"] } }),
    ),
    [],
  );
});

test("nats.cluster: one server by default; three nodes on their own addresses, queues replicated to match, nats.url naming every node", () => {
  const one = load();
  assert.equal(one.nats.cluster.size, 1);
  assert.equal(one.nats.stream.replicas, 1);
  assert.equal(one.nats.url, "tls://127.0.0.1:4222", "one server: the URL it always had");
  const three = load({ nats: { cluster: { size: 3 } } });
  assert.equal(three.nats.stream.replicas, 3, "an unset nats.stream.replicas follows the cluster");
  assert.equal(three.nats.url, "tls://127.0.4.1:4222,tls://127.0.4.2:4222,tls://127.0.4.3:4222");
  assert.equal(three.nats.cluster.tls.certFile, "/tmp/.callplane/pki/nats-route/tls.crt");
  // set on purpose, fewer replicas than nodes is allowed (and a URL listing every node)
  const r1 = load({
    nats: {
      cluster: { size: 3 },
      stream: { replicas: 1 },
      url: "tls://127.0.4.1:4222, tls://127.0.4.2:4222,tls://127.0.4.3:4222",
    },
  });
  assert.equal(r1.nats.stream.replicas, 1);
  // the same from the environment
  const env = load({}, { CALLPLANE__NATS__CLUSTER__SIZE: "3" });
  assert.equal(env.nats.stream.replicas, 3);
  // an external cluster (the stack runs none): its URL is the operator's, its size says how many answer
  const ext = load({
    nats: { server: { enabled: false }, cluster: { size: 3 }, url: "tls://nats.example:4222" },
  });
  assert.equal(ext.nats.url, "tls://nats.example:4222");
});

test("nats.cluster rules: an odd size, replicas within it, every node in nats.url, two ports, room for the nodes", () => {
  const even = problems({ nats: { cluster: { size: 2 } } });
  assert.equal(even.length, 1, even.join("\n"));
  assertNames(even[0], ["nats.cluster.size", "odd"]);
  assert.ok(problems({ nats: { cluster: { size: 4 } } }).some((p) => p.includes("nats.cluster.size is 4")));
  const beyond = problems({ nats: { cluster: { size: 3 }, stream: { replicas: 5 } } });
  assert.equal(beyond.length, 1, beyond.join("\n"));
  assertNames(beyond[0], ["nats.stream.replicas", "nats.cluster.size", "at most 3"]);
  // the size left unset: the file may be rendered for Kubernetes (three servers of its own), so it
  // loads; the local stack, which runs one server then, refuses it (below)
  assertNames(problems({ nats: { cluster: { size: 6 } } })[0], ["nats.cluster.size"]);
  const missing = problems({ nats: { cluster: { size: 3 }, url: "tls://127.0.4.1:4222" } });
  assert.equal(missing.length, 1, missing.join("\n"));
  assertNames(missing[0], ["nats.url", "nats.cluster.size", "missing 127.0.4.2:4222, 127.0.4.3:4222"]);
  const ports = problems({ nats: { cluster: { size: 3, routePort: 4222 } } });
  assertNames(ports[0], ["nats.cluster.routePort", "nats.server.listen"]);
  const small = problems({ nats: { cluster: { size: 3, nodeNetwork: "127.0.4.0/31" } } });
  assertNames(small[0], ["nats.cluster.nodeNetwork", "nats.cluster.size"]);
  assertNames(problems({ nats: { cluster: { name: "has space" } } })[0], ["nats.cluster.name"]);
  assertNames(problems({ nats: { url: "http://x:4222" } })[0], ["nats.url"]);
});

test("nats.cluster on one machine: the node network may not overlap the pods' or the instances'", () => {
  assert.deepEqual(localNatsClusterProblems(load({ nats: { cluster: { size: 3 } } })), []);
  const one = localNatsClusterProblems(load({ nats: { stream: { replicas: 3 } } }));
  assert.equal(one.length, 1, one.join("\n"));
  assertNames(one[0], ["nats.stream.replicas", "nats.cluster.size", "at most 1"]);
  // an external NATS says nothing about its size the stack could check
  assert.deepEqual(
    localNatsClusterProblems(load({ nats: { server: { enabled: false }, stream: { replicas: 3 } } })),
    [],
  );
  const clash = localNatsClusterProblems(
    load({ nats: { cluster: { size: 3, nodeNetwork: "127.0.1.0/28" } } }),
  );
  assert.equal(clash.length, 1, clash.join("\n"));
  assertNames(clash[0], ["nats.cluster.nodeNetwork", "invocation.podNetwork"]);
  // one server takes no node addresses at all
  assert.deepEqual(
    localNatsClusterProblems(load({ nats: { cluster: { nodeNetwork: "127.0.1.0/24" } } })),
    [],
  );
});

test("the example environment files load with the config loader (as the pods read them); one-machine passes the local stack's rule too", () => {
  const files = readdirSync(EXAMPLES_DIR).filter((f) => f.endsWith(".yaml"));
  for (const e of ["one-machine", "split-plane"])
    assert.ok(files.includes(`${e}.yaml`), `examples/${e}.yaml`);
  for (const f of files) {
    const text = readFileSync(join(EXAMPLES_DIR, f), "utf8");
    // every pod but the API's reads the file as it is: a PostgreSQL URL is never in it
    const config = loadConfig({ file: join(EXAMPLES_DIR, f), env: {}, cwd: "/tmp" });
    // the API's pods get the URL from a Secret, as an override, and check it at their start
    if (/driver: postgres/.test(text)) {
      assert.notDeepEqual(
        databaseProblems(config),
        [],
        `${f}: the API would refuse to start without its URL`,
      );
      const api = loadConfig({
        file: join(EXAMPLES_DIR, f),
        env: { CALLPLANE__API__DATABASE__URL: POD_DATABASE_URL },
        cwd: "/tmp",
      });
      assert.deepEqual(databaseProblems(api), [], f);
    } else assert.deepEqual(databaseProblems(config), [], f);
  }
  const split = loadConfig({
    file: join(EXAMPLES_DIR, "split-plane.yaml"),
    env: { CALLPLANE__API__DATABASE__URL: POD_DATABASE_URL },
    cwd: "/tmp",
  });
  assert.equal(split.workerCallbackProxy.enabled, true);
  assert.equal(split.invocation.replicaCount, 3);
  assert.equal(split.grpcproxy.replicaCount, 3);
  assert.equal(split.workerCallbackProxy.replicaCount, 3);
  // npm start -- --config examples/one-machine.yaml: nothing the local stack adds refuses it
  const one = loadConfig({ file: join(EXAMPLES_DIR, "one-machine.yaml"), env: {}, cwd: "/tmp" });
  assert.deepEqual(localPodNetworkProblems(one), []);
  assert.deepEqual(localNatsClusterProblems(one), []);
});

test("observability.tracing: off until set (npm start turns it on); on, it needs somewhere to send spans", () => {
  const d = load();
  assert.equal(d.observability.tracing.enabled, null);
  assert.equal(tracingSettings(d), undefined, "unset is off for the services");
  assert.deepEqual(tracingWorkerEnv(d), {}, "and for the workers");
  const p = problems({ observability: { tracing: { enabled: true } } });
  assert.equal(p.length, 1);
  assert.match(
    p[0],
    /observability\.tracing\.enabled.*observability\.tracing\.endpoint.*observability\.tracing\.file/,
  );
  const on = load(
    {},
    {
      CALLPLANE__OBSERVABILITY__TRACING__ENABLED: "true",
      CALLPLANE__OBSERVABILITY__TRACING__FILE: "traces/spans.jsonl",
      CALLPLANE__OBSERVABILITY__TRACING__SAMPLE_RATIO: "0.25",
    },
  );
  assert.equal(
    on.observability.tracing.file,
    "/tmp/traces/spans.jsonl",
    "a relative file is taken from the working directory",
  );
  assert.deepEqual(tracingSettings(on), { endpoint: "", sampleRatio: 0.25, file: "/tmp/traces/spans.jsonl" });
  const env = tracingWorkerEnv(on);
  assert.deepEqual(tracingFromEnv(env), tracingSettings(on), "the workers get the same settings");
  assert.match(
    problems({ observability: { tracing: { sampleRatio: 2 } } })[0],
    /observability\.tracing\.sampleRatio/,
  );
  assert.match(
    problems({ observability: { tracing: { endpoint: "ftp://x" } } })[0],
    /observability\.tracing\.endpoint/,
  );
  assert.throws(
    () => tracingFromEnv({ CALLPLANE_TRACING_FILE: "/x", CALLPLANE_TRACING_SAMPLE_RATIO: "lots" }),
    /CALLPLANE_TRACING_SAMPLE_RATIO/,
  );
  assert.equal(tracingFromEnv({}), undefined, "a worker with neither endpoint nor file does not trace");
});
