// `npm start`: runs a whole callplane stack on this machine and keeps it serving until Ctrl-C.
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import {
  ConfigError,
  loadConfig,
  localNatsClusterProblems,
  localPodNetworkProblems,
  databaseProblems,
} from "../lib/config/index.js";
import { natsNodes } from "../lib/nats/index.js";
import { cidrHost, parseCidr, parseHostPort, type HostPort } from "../lib/net/index.js";
import { ensureDemo, invokeDemo, invokeDemoGrpc, waitActive, warmDemo } from "./demo.js";
import { LocalStack, StackError, type StackInfo } from "./stack.js";

/** Invocations per replica that warm the path once the demo answers (CALLPLANE_STACK_WARMUP; 0: none). */
function warmupInvocations(): number {
  const v = process.env.CALLPLANE_STACK_WARMUP;
  if (v === undefined || v === "") return 3000;
  if (!/^\d+$/.test(v))
    throw new StackError(
      `CALLPLANE_STACK_WARMUP must be a whole number of invocations per replica, not "${v}"`,
    );
  return Number(v);
}

/** The share of requests without a sampled traceparent that `npm start`'s tracing records. */
const STACK_SAMPLE_RATIO = 0.01;

function say(line: string): void {
  console.log(`callplane: ${line}`);
}

function configFile(argv: string[]): string | undefined {
  const i = argv.indexOf("--config");
  if (i !== -1) {
    const f = argv[i + 1];
    if (!f) throw new StackError("--config needs a file name");
    return resolve(f);
  }
  if (process.env.CALLPLANE_CONFIG) return resolve(process.env.CALLPLANE_CONFIG);
  return existsSync("callplane.yaml") ? resolve("callplane.yaml") : undefined;
}

// The stack once it has claimed its data folder: what a failed start has to stop.
let claimed: LocalStack | undefined;

async function main(): Promise<void> {
  const file = configFile(process.argv.slice(2));
  const config = loadConfig({ file });
  const stack = new LocalStack({ config, configFile: file, say });
  let stopping = false;
  const stop = (why: string) => {
    if (stopping) {
      say("stopping now");
      stack.killAll();
      process.exit(130);
    }
    stopping = true;
    say(`${why}: stopping the stack (Ctrl-C again to stop at once)`);
    stack
      .stop(config.invocation.shutdownGraceSeconds * 1000)
      .then(() => {
        say("stopped");
        process.exit(0);
      })
      .catch((err: unknown) => {
        console.error(err);
        process.exit(1);
      });
  };
  process.on("SIGINT", () => stop("interrupted"));
  process.on("SIGTERM", () => stop("terminated"));
  process.on("SIGHUP", () => stop("hung up"));
  process.on("exit", () => stack.killAll());

  stack.claim();
  claimed = stack;
  const addresses: Array<[string, HostPort]> = [];
  if (config.nats.server.enabled) {
    const nodes = natsNodes(config.nats);
    for (const n of nodes) {
      const name = nodes.length > 1 ? `nats-server-${n.index}` : "nats-server";
      addresses.push([name, n.client]);
      if (n.route) addresses.push([`${name} routes`, n.route]);
    }
  }
  addresses.push(["api", parseHostPort(config.api.listen)]);
  if (config.adminIssuerProxy.enabled)
    addresses.push(["admin-issuer", parseHostPort(config.adminIssuerProxy.listen)]);
  const podNetwork = parseCidr(config.invocation.podNetwork);
  const replicaIps = Array.from({ length: config.invocation.replicaCount }, (_, i) =>
    cidrHost(podNetwork, i + 1),
  );
  replicaIps.forEach((ip, i) =>
    addresses.push([`invocation-${i + 1}`, { host: ip, port: config.invocation.port }]),
  );
  const grpc = config.grpcproxy;
  const grpcNetwork = parseCidr(grpc.podNetwork);
  const grpcIps = Array.from({ length: grpc.replicaCount }, (_, i) => cidrHost(grpcNetwork, i + 1));
  const proxy = config.workerCallbackProxy;
  for (const [i, ip] of grpcIps.entries()) {
    addresses.push(
      [`grpc-proxy-${i + 1}`, { host: ip, port: grpc.port }],
      [`grpc-proxy-${i + 1} CONNECT`, { host: ip, port: grpc.connectPort }],
    );
    if (proxy.enabled)
      addresses.push([`grpc-proxy-${i + 1} worker TLS`, { host: ip, port: grpc.workerTlsPort }]);
  }
  const podProblems = [
    ...localPodNetworkProblems(config),
    ...localNatsClusterProblems(config),
    ...databaseProblems(config),
  ];
  if (podProblems.length) throw new StackError(podProblems.join("\n"));
  if (proxy.enabled) {
    addresses.push(
      ["callback-proxy", parseHostPort(proxy.listen)],
      ["callback-proxy metrics", parseHostPort(proxy.metricsListen)],
    );
    if (proxy.invocation.upstreamTls.enabled) {
      replicaIps.forEach((ip, i) =>
        addresses.push([
          `invocation-${i + 1} worker TLS`,
          { host: ip, port: proxy.invocation.workerTlsPort },
        ]),
      );
    }
  }
  addresses.push(["compute", parseHostPort(config.compute.listen)]);
  await stack.preflight(addresses);
  say(`starting a local stack in ${stack.dataDir}`);
  stack.prepareSecrets();
  await stack.preparePki(replicaIps, grpcIps);

  const natsStarted = config.nats.server.enabled ? await stack.startNats() : undefined;
  const nats = config.nats.url;
  if (natsStarted && natsStarted.nodes.length > 1) {
    for (const n of natsStarted.nodes)
      say(
        `nats-server-${n.index} ${n.url}   (${n.name}; routes at ${n.route!.host}:${n.route!.port}, TLS with the stack CA and the route password)`,
      );
    say(
      `nats cluster  ${config.nats.cluster.name}: ${natsStarted.nodes.length} JetStream nodes, work queues with ${config.nats.stream.replicas} replica(s); TLS and a login on every client connection (nats.workerAuth is ${config.nats.workerAuth}); \`bin/callplane nats status\` shows its health`,
    );
  } else {
    say(
      `nats-server   ${nats}   (TLS; every client authenticates: nats.workerAuth is ${config.nats.workerAuth})`,
    );
  }
  await stack.startService("nats-auth-callout", "nats-auth-callout");
  say(`nats-auth-callout answering nats-server's auth callout (logs/nats-auth-callout.log)`);
  // Tracing: unset in the file (observability.tracing.enabled: null), the stack turns it on for its
  // own services and workers, with spans in a file under the data folder that `callplane trace` reads,
  // recording 1% of the requests that come without a sampled traceparent (a client that sends one,
  // as the demo does, has its request traced): at ratio 1 a saturated stack spends a tenth of its
  // CPU on spans. The API is told too: it records no spans, but its console reads a request's from
  // the file.
  const tracing = config.observability.tracing;
  const spanFile =
    tracing.enabled === false
      ? undefined
      : tracing.file || (tracing.enabled === null ? join(stack.dataDir, "traces", "spans.jsonl") : undefined);
  const tracingEnv: Record<string, string> =
    tracing.enabled === null
      ? {
          CALLPLANE__OBSERVABILITY__TRACING__ENABLED: "true",
          CALLPLANE__OBSERVABILITY__TRACING__SAMPLE_RATIO: String(STACK_SAMPLE_RATIO),
          ...(tracing.file ? {} : { CALLPLANE__OBSERVABILITY__TRACING__FILE: spanFile! }),
        }
      : {};
  const api = (await stack.startService("api", "api", tracingEnv)).api;
  say(`api           ${api}`);
  const consoleUrl = `${api}/console/`;
  say(`console       ${consoleUrl}   (the operator console: log in with an admin token)`);
  let issuer: string | undefined;
  if (config.adminIssuerProxy.enabled) {
    issuer = (await stack.startService("admin-issuer", "admin-issuer")).issuer!;
    say(
      `admin-issuer  ${issuer}   (mints for the operator credential in ${config.adminIssuerProxy.operatorCredentialFile}: \`bin/callplane init\` reads it)`,
    );
  } else {
    say(
      "admin-issuer  off (adminIssuerProxy.enabled: false): not started, and the API refuses its tokens; use CALLPLANE_TOKEN or `bin/callplane admin token`",
    );
  }
  const invocation: string[] = [];
  // One machine: every port is loopback, so each replica's /metrics is served on its client port
  // (where the smoke checks and the bench read it), unless the environment file says otherwise.
  const metricsEnv: Record<string, string> =
    config.invocation.metricsOnClientPort === null
      ? { CALLPLANE__INVOCATION__METRICS_ON_CLIENT_PORT: "true" }
      : {};
  const perReplica = warmupInvocations();
  for (const [i, ip] of replicaIps.entries()) {
    const urls = await stack.startService(`invocation-${i + 1}`, "invocation", {
      POD_IP: ip,
      ...metricsEnv,
      ...tracingEnv,
    });
    invocation.push(urls.invocation);
    say(`invocation-${i + 1}  ${urls.invocation}   (workers call back at ${urls.target})`);
  }
  const grpcUrls: string[] = [];
  for (const [i, ip] of grpcIps.entries()) {
    const urls = await stack.startService(`grpc-proxy-${i + 1}`, "grpc-proxy", { POD_IP: ip, ...tracingEnv });
    grpcUrls.push(urls.grpc);
    say(`grpc-proxy-${i + 1}  ${urls.grpc}   (workers open tunnels at ${urls.connectUri})`);
  }
  let proxyUrl: string | undefined;
  if (proxy.enabled) {
    proxyUrl = (await stack.startService("callback-proxy", "callback-proxy")).proxy!;
    say(
      `callback-proxy ${proxyUrl}   (HAProxy; workers reach it as ${config.global.workerEndpoints.invocationProxyURL}; access log in logs/callback-proxy.log)`,
    );
  }
  // instances created from now on are this start's own: rows left by a stack that was killed
  // without stopping may still say ACTIVE
  const computeStarted = new Date();
  const compute = (await stack.startService("compute", "compute", tracingEnv)).compute;
  say(`compute       ${compute}   (local backend: instances on ${config.compute.instanceNetwork})`);

  const demo = await ensureDemo({
    apiUrl: api,
    dataDir: stack.dataDir,
    signingKeyFile: config.auth.adminSigningKeyFile,
    say,
  });
  await waitActive(api, config.auth.adminSigningKeyFile, demo, 120_000, computeStarted);
  const payload = { hello: "callplane", at: new Date().toISOString() };
  const answer = await invokeDemo(invocation[0], demo, payload);
  if (answer.status !== 200)
    throw new StackError(`the demo invocation failed with ${answer.status}: ${answer.body}`);
  say(
    `demo: invoked ${demo.httpFunctionName} through ${invocation[0]} -> ${answer.status} ${answer.body}  (NVCF-REQID ${answer.requestId})`,
  );
  if (perReplica > 0) {
    const warm = await warmDemo(invocation, demo, { perReplica, concurrency: 32 });
    say(
      `warmed the invocation path: ${warm.invocations} invocations of ${demo.httpFunctionName} in ${(warm.ms / 1000).toFixed(1)} s` +
        (warm.failed ? ` (${warm.failed} failed: see logs/)` : ""),
    );
  }
  if (spanFile || tracing.queryUrl)
    say(
      `demo: its trace, hop by hop: bin/callplane trace ${answer.requestId}   (spans in ${spanFile ?? tracing.queryUrl})`,
    );

  if (grpcUrls.length) {
    const g = await invokeDemoGrpc(grpcUrls[0], demo, "hello over gRPC");
    say(
      `demo: called ${demo.grpcFunctionName} (callplane.examples.Echo/Unary) through ${grpcUrls[0]} -> ${JSON.stringify(g.payload)}  (nvcf-reqid ${g.requestId})`,
    );
  }

  const info: StackInfo = {
    api,
    console: consoleUrl,
    ...(issuer ? { issuer, issuerCredentialFile: config.adminIssuerProxy.operatorCredentialFile } : {}),
    adminIssuer: {
      enabled: config.adminIssuerProxy.enabled,
      gatewayEnabled: config.adminIssuerProxy.enabled && config.adminIssuerProxy.gateway.enabled,
    },
    nats,
    ...(natsStarted && natsStarted.nodes.length > 1
      ? {
          natsCluster: {
            name: config.nats.cluster.name,
            streamReplicas: config.nats.stream.replicas,
            nodes: natsStarted.nodes.map((n) => ({
              name: n.name,
              url: n.url,
              route: `${n.route!.host}:${n.route!.port}`,
            })),
          },
        }
      : {}),
    compute,
    invocation,
    grpc: grpcUrls,
    ca: config.nats.tls.caFile,
    workerAuth: config.nats.workerAuth,
    ...(proxyUrl ? { proxy: proxyUrl, workerDomain: proxy.workerDomain } : {}),
    dataDir: stack.dataDir,
    logs: stack.logDir,
    ...(spanFile || tracing.queryUrl
      ? {
          tracing: {
            ...(spanFile ? { file: spanFile } : {}),
            ...(tracing.queryUrl ? { queryUrl: tracing.queryUrl } : {}),
          },
        }
      : {}),
    startedAt: new Date().toISOString(),
    pid: process.pid,
    demo: {
      apiKey: demo.apiKey,
      httpFunctionId: demo.httpFunctionId,
      httpFunctionVersionId: demo.httpFunctionVersionId,
      httpFunctionName: demo.httpFunctionName,
      sseFunctionId: demo.sseFunctionId,
      sseFunctionVersionId: demo.sseFunctionVersionId,
      sseFunctionName: demo.sseFunctionName,
      slowFunctionId: demo.slowFunctionId,
      slowFunctionVersionId: demo.slowFunctionVersionId,
      slowFunctionName: demo.slowFunctionName,
      grpcFunctionId: demo.grpcFunctionId,
      grpcFunctionVersionId: demo.grpcFunctionVersionId,
      grpcFunctionName: demo.grpcFunctionName,
    },
  };
  stack.writeStackFile(info);
  say(`ready: ${stack.stackFile} lists every address; logs are in ${stack.logDir}`);
  console.log("");
  const pexec = `${invocation[0]}/v2/nvcf/pexec/functions`;
  console.log("  invoke the demo with curl (KEY is the demo's API key):");
  console.log("    KEY=$(jq -r .demo.apiKey .callplane/stack.json)");
  console.log(
    `    curl -s -X POST -H "authorization: Bearer $KEY" -H 'content-type: application/json' -d '{"hello":"world"}' ${pexec}/${demo.httpFunctionId}`,
  );
  console.log("  server-sent events, one by one as the inference server writes them:");
  console.log(
    `    curl -sN -X POST -H "authorization: Bearer $KEY" -H 'accept: text/event-stream' '${pexec}/${demo.sseFunctionId}?events=5&intervalMs=500'`,
  );
  console.log("  a 202 with NVCF-REQID after 2 s, then polling for the answer:");
  console.log(
    `    curl -si -X POST -H "authorization: Bearer $KEY" -H 'nvcf-poll-seconds: 2' -d '{}' '${pexec}/${demo.slowFunctionId}?seconds=6'`,
  );
  console.log(
    `    curl -si -H "authorization: Bearer $KEY" ${invocation[0]}/v2/nvcf/pexec/status/<NVCF-REQID>`,
  );
  console.log("  or with the CLI (it reads .callplane/stack.json):");
  console.log(`    bin/callplane invoke ${demo.httpFunctionName} --data '{"hello":"world"}'`);
  if (grpcUrls.length) {
    console.log(
      "  gRPC: callplane.examples.Echo on demo-grpc through grpc-proxy (any gRPC client; see README):",
    );
    console.log(`    bin/callplane invoke ${demo.grpcFunctionName} --grpc --data 'hello'`);
  }
  console.log(
    config.adminIssuerProxy.enabled
      ? "  manage functions:  bin/callplane init && bin/callplane function list"
      : "  manage functions:  bin/callplane admin token --save && bin/callplane function list   (the admin issuer is off)",
  );
  console.log(
    `  operator console:  ${consoleUrl}   (paste an admin token: \`bin/callplane admin token\` prints one)`,
  );
  console.log("  stop the stack:    Ctrl-C");
}

main().catch(async (err: unknown) => {
  if (err instanceof StackError || err instanceof ConfigError) {
    console.error(`callplane: ${err.message}`);
  } else {
    console.error("callplane: the stack failed to start:", err);
  }
  // Fix: a start that failed after some services were up used to exit at once, and the exit
  // handler SIGKILLed the services, so the compute agent could not stop its instances (their
  // inference servers were left running). Stop what was started, as Ctrl-C would, and release the
  // data folder (stack.pid). Only a stack that claimed the folder does so: a start refused
  // because another stack runs there must not touch that stack's files.
  if (claimed) await claimed.stop(5000).catch(() => undefined);
  process.exit(1);
});
