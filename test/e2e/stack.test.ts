// The whole local stack as a user runs it: `node dist/src/stack/main.js --config <yaml>` in a
// folder of its own, driven by what a user sees (its output, stack.json, logs, exit codes) and
// checked for what it must never do (leave processes behind, clobber a running stack).
// Addresses: services on 127.0.40.x, invocation replicas on 127.0.41.0/24, instances on
// 127.0.42.0/24, grpc-proxy replicas on 127.0.43.0/24, so this file never meets a developer's stack (127.0.0.1:4222/8080..., 127.0.1.x,
// 127.0.3.x) nor test/compute.test.ts (127.0.30-32.x).
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import { test } from "node:test";
import { connect } from "@nats-io/transport-node";
import { waitFor as poll } from "../testkit/client.js";
import { plainClient } from "../testkit/trust.js";
import { descendants, lifo, running } from "../testkit/proc.js";
import { setTimeout as sleep } from "node:timers/promises";
import { call, runCli, tmpDir } from "../testkit/index.js";
import {
  runStack,
  stackProcesses,
  waitStackReady,
  writeStackConfig,
  type StackJson,
} from "../testkit/stack.js";
import { rawUnary } from "../../src/lib/grpc/index.js";

/** Waits for a condition; these tests start whole process trees, so the default is generous. */
const waitFor = <T>(
  what: string,
  check: () => T | undefined | false | Promise<T | undefined | false>,
  timeoutMs = 20_000,
) => poll(what, check, timeoutMs);

/** Runs a command line the stack printed for users, as a user's shell would, with KEY set. */
async function runPrinted(line: string, key: string): Promise<string> {
  const { stdout } = await promisify(execFile)("sh", ["-c", line], {
    env: { ...process.env, KEY: key },
    timeout: 30_000,
  });
  return stdout;
}

const lines = (s: string) => s.split("\n").filter((l) => l.trim() !== "");

async function invoke(url: string, fid: string, key: string, payload: unknown) {
  return await call(`${url}/v2/nvcf/pexec/functions/${fid}`, { token: key, body: payload });
}

async function adminToken(info: StackJson): Promise<string> {
  // the issuer mints only for the operator: the credential the stack wrote (stack.json names it)
  const credential = readFileSync(info.issuerCredentialFile, "utf8").trim();
  const r = await call<{ value: string }>(`${info.issuer}/v1/admin/keys`, { body: {}, token: credential });
  assert.equal(r.status, 200, r.text);
  return r.body.value;
}

test("local stack", async (t) => {
  const ctx = lifo(t);
  const dir = tmpDir(ctx, "callplane-stack-");
  const cfg = await writeStackConfig(dir, {
    host: "127.0.40.1",
    podNetwork: "127.0.41.0/24",
    grpcNetwork: "127.0.43.0/24",
    instanceNetwork: "127.0.42.0/24",
  });
  const first = runStack(ctx, dir, cfg.file);
  let info: StackJson | undefined;
  let firstDemoId = "";

  await t.test(
    "comes up: stack.json lists every address, the demo answers on both replicas, logs exist",
    async () => {
      info = await waitStackReady(first, cfg.dataDir);
      const file = join(cfg.dataDir, "stack.json");
      assert.equal(statSync(file).mode & 0o777, 0o600, "stack.json holds an API key: owner only");
      assert.equal(info.api, `http://127.0.40.1:${cfg.ports.api}`);
      assert.equal(info.issuer, `http://127.0.40.1:${cfg.ports.issuer}`);
      assert.equal(info.nats, `tls://127.0.40.1:${cfg.ports.nats}`);
      // NATS speaks TLS only, and refuses a client without credentials (the issue 10 smoke check)
      const ca = readFileSync(String(info.ca), "utf8");
      await assert.rejects(
        connect({ servers: info.nats, tls: { ca }, reconnect: false }),
        /Authorization Violation/,
        "a TLS client without credentials is refused",
      );
      const plain = await plainClient("127.0.40.1", cfg.ports.nats);
      assert.equal(plain.tlsRequired, true, "a plain client is told TLS is required");
      assert.ok(!plain.afterInfo.includes("PONG"), `nats-server answered a plain client: ${plain.afterInfo}`);
      assert.equal(info.compute, `http://127.0.40.1:${cfg.ports.compute}`);
      assert.equal(info.dataDir, cfg.dataDir);
      assert.equal(info.pid, first.child.pid);
      assert.deepEqual(info.invocation, ["http://127.0.41.1:8080", "http://127.0.41.2:8080"]);
      assert.match(info.demo.apiKey, /^nvapi-/);
      assert.match(info.demo.httpFunctionId, /^[0-9a-f-]{36}$/);
      firstDemoId = info.demo.httpFunctionId;
      for (const [i, url] of info.invocation.entries()) {
        const payload = { hello: "stack", replica: i };
        const r = await invoke(url, info.demo.httpFunctionId, info.demo.apiKey, payload);
        assert.equal(r.status, 200, r.text);
        assert.deepEqual(r.body, payload);
        assert.ok(r.headers.get("nvcf-reqid"));
        // each replica's /metrics has the invocation in the demo function's series (the issue 23 smoke check)
        const metrics = await (await fetch(`${url}/metrics`)).text();
        assert.match(
          metrics,
          new RegExp(`^callplane_invocations_total\\{[^}]*function_id="${info.demo.httpFunctionId}"`, "m"),
        );
      }
      // the small answers above went over NATS; a large one (past what NATS carries: 100 KiB) is
      // posted through the callback proxy, to the replica holding each request
      for (const url of info.invocation) {
        const payload = { large: "x".repeat(100 * 1024) };
        const r = await invoke(url, info.demo.httpFunctionId, info.demo.apiKey, payload);
        assert.equal(r.status, 200, r.text.slice(0, 200));
        assert.deepEqual(r.body, payload);
      }
      assert.equal(info.proxy, `https://127.0.40.1:${cfg.ports.proxy}`);
      assert.equal(info.workerDomain, "worker.callplane.test");
      assert.ok(info.ca && existsSync(info.ca), "stack.json names the stack CA file");
      const accessLog = await waitFor(
        "callbacks to both replicas in the proxy's access log",
        () => {
          const lines = readFileSync(join(cfg.dataDir, "logs", "callback-proxy.log"), "utf8")
            .split("\n")
            .filter((l) => l.includes('"msg":"callback"'))
            .map((l) => JSON.parse(l) as { target: string; status: number; outcome: string });
          const pods = new Set(
            lines.filter((l) => l.outcome === "forwarded" && l.status === 200).map((l) => l.target),
          );
          return pods.has("127-0-41-1.invocation.nvcf.svc.cluster.local") &&
            pods.has("127-0-41-2.invocation.nvcf.svc.cluster.local")
            ? lines
            : undefined;
        },
        10_000,
      );
      assert.ok(accessLog.length >= 2);
      for (const service of [
        "nats-server",
        "nats-auth-callout",
        "api",
        "admin-issuer",
        "invocation-1",
        "invocation-2",
        "callback-proxy",
        "grpc-proxy-1",
        "grpc-proxy-2",
        "compute",
      ]) {
        const log = join(cfg.dataDir, "logs", `${service}.log`);
        assert.ok(existsSync(log), `${log} exists`);
        assert.ok(statSync(log).size > 0, `${log} is not empty`);
      }
      // gRPC: two grpc-proxy replicas, each answering the demo's Echo/Unary through its worker's tunnel
      assert.deepEqual(info.grpc, ["http://127.0.43.1:10081", "http://127.0.43.2:10081"]);
      assert.match(info.demo.grpcFunctionId, /^[0-9a-f-]{36}$/);
      for (const url of info.grpc) {
        const r = await rawUnary(
          new URL(url).host,
          "/callplane.examples.Echo/Unary",
          Buffer.from([0x0a, 4, ...Buffer.from("ping")]),
          { authorization: `Bearer ${info.demo.apiKey}`, "function-id": info.demo.grpcFunctionId },
          30_000,
        );
        assert.deepEqual([...r.response], [0x0a, 4, ...Buffer.from("ping")], `${url} echoes`);
      }
      // the workers' tunnels came through the callback proxy (routed by server name) to each
      // replica's worker TLS listener
      // (replica logs are written in batches)
      for (const n of [1, 2]) {
        await poll(
          `grpc-proxy-${n}'s log line of a tunnel through the proxy`,
          () =>
            /"via":"worker-tls".*"msg":"tunnel open"/.test(
              readFileSync(join(cfg.dataDir, "logs", `grpc-proxy-${n}.log`), "utf8"),
            ),
          10_000,
        );
      }
      const out = first.output();
      assert.match(out, /callplane: ready: .*stack\.json/);
      assert.match(out, /demo: invoked .* -> 200/);
      assert.match(out, /demo: called demo-grpc .* -> "hello over gRPC"/);
    },
  );

  await t.test(
    "the curl commands the stack prints get an SSE stream and a 202 answered by polling",
    async () => {
      assert.ok(info, "the stack came up");
      const printed = first
        .output()
        .split("\n")
        .map((l) => l.trim())
        .filter((l) => l.startsWith("curl "));
      const sse = printed.find((l) => l.includes(info!.demo.sseFunctionId));
      const slow = printed.find((l) => l.includes(info!.demo.slowFunctionId));
      const status = printed.find((l) => l.includes("/pexec/status/<NVCF-REQID>"));
      assert.ok(sse && slow && status, `the stack printed the commands:\n${printed.join("\n")}`);

      const events = await runPrinted(sse, info.demo.apiKey);
      assert.deepEqual(
        [...events.matchAll(/^id: (\d+)$/gm)].map((m) => m[1]),
        ["0", "1", "2", "3", "4"],
        events,
      );
      assert.match(events, /event: done/);

      const first202 = await runPrinted(slow, info.demo.apiKey);
      assert.match(first202, /^HTTP\/1\.1 202 /, first202);
      const reqId = /^nvcf-reqid: (\S+)/im.exec(first202)?.[1];
      assert.ok(reqId, first202);
      const answer = await waitFor("the polled answer", async () => {
        const r = await runPrinted(status.replace("<NVCF-REQID>", reqId), info!.demo.apiKey);
        return /^HTTP\/1\.1 200 /.test(r) ? r : undefined;
      });
      assert.match(answer, /\{"done":true,"seconds":6\}/);
    },
  );

  await t.test(
    "tracing is on: a client's traceparent is continued, and callplane trace shows the request's spans",
    async () => {
      assert.ok(info, "the stack came up");
      const traceId = randomUUID().replaceAll("-", "");
      const res = await fetch(`${info.invocation[0]}/v2/nvcf/pexec/functions/${info.demo.httpFunctionId}`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${info.demo.apiKey}`,
          "content-type": "application/json",
          traceparent: `00-${traceId}-00f067aa0ba902b7-01`,
        },
        body: '{"traced":true}',
      });
      assert.equal(res.status, 200, await res.text());
      const reqId = res.headers.get("nvcf-reqid")!;
      assert.equal(
        (info as { tracing?: { file?: string } }).tracing?.file,
        join(cfg.dataDir, "traces", "spans.jsonl"),
      );
      // as a user runs it, in the stack's folder (here the data folder is elsewhere: named by the variable)
      const r = await runCli(["trace", reqId, "--wait", "20"], {
        cwd: dir,
        env: { CALLPLANE__GLOBAL__DATA_DIR: cfg.dataDir },
      });
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, new RegExp(`^trace ${traceId} `));
      for (const span of [
        /invocation\s+\|[# ]+\| {2}POST \/v2\/nvcf\/pexec\/functions\/:fid$/m,
        /invocation\s+\|[# ]+\| {4}send rq\./m,
        /worker\s+\|[# ]+\| {6}process rq\./m,
        /worker\s+\|[# ]+\| {8}POST \/echo$/m,
        // the small answer went over NATS to the replica
        /worker\s+\|[# ]+\| {8}send callplane\.answer\.\*$/m,
      ])
        assert.match(r.stdout, span);
      // a large answer is posted through the callback proxy, whose access line carries the trace id
      const posted = randomUUID().replaceAll("-", "");
      const large = await fetch(`${info.invocation[0]}/v2/nvcf/pexec/functions/${info.demo.httpFunctionId}`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${info.demo.apiKey}`,
          "content-type": "application/json",
          traceparent: `00-${posted}-00f067aa0ba902b7-01`,
        },
        body: JSON.stringify({ large: "x".repeat(100 * 1024) }),
      });
      assert.equal(large.status, 200);
      await large.arrayBuffer();
      await poll(
        "the proxy's access line with the trace id",
        () =>
          readFileSync(join(cfg.dataDir, "logs", "callback-proxy.log"), "utf8").includes(
            `"traceId":"${posted}"`,
          ),
        10_000,
      );
      assert.match(first.output(), /demo: its trace, hop by hop: bin\/callplane trace [0-9a-f-]{36}/);
    },
  );

  await t.test(
    "a second stack on the same data folder refuses with one line naming the running one",
    async () => {
      assert.ok(info, "the stack came up");
      const second = runStack(ctx, dir, cfg.file);
      const { code } = await second.exited;
      assert.notEqual(code, 0);
      const out = lines(second.output());
      assert.equal(out.length, 1, second.output());
      assert.match(out[0], /already running/);
      assert.match(out[0], new RegExp(`pid ${first.child.pid}\\b`));
      // and it left the running stack alone
      assert.ok(existsSync(join(cfg.dataDir, "stack.json")));
      const r = await invoke(info.invocation[0], info.demo.httpFunctionId, info.demo.apiKey, { still: "up" });
      assert.equal(r.status, 200, r.text);
    },
  );

  await t.test("SIGINT stops every process the stack started and removes stack.json", async () => {
    assert.ok(info, "the stack came up");
    const recorded = (
      JSON.parse(readFileSync(join(cfg.dataDir, "stack.pid"), "utf8")) as { children: Array<{ pid: number }> }
    ).children.map((c) => c.pid);
    const tree = descendants(first.child.pid!);
    // nats, api, issuer, two replicas, compute, and two instances of two processes each
    assert.ok(tree.length >= 10, `${tree.length} processes under the stack`);
    for (const p of recorded) assert.ok(tree.includes(p), `stack.pid lists ${p}, a child of the stack`);
    first.child.kill("SIGINT");
    const { code } = await first.exited;
    assert.equal(code, 0, first.output());
    assert.match(first.output(), /callplane: stopped/);
    assert.deepEqual(tree.filter(running), [], "no process of the stack is left");
    assert.deepEqual(stackProcesses(dir), []);
    assert.ok(!existsSync(join(cfg.dataDir, "stack.json")), "stack.json is removed");
  });

  await t.test(
    "a start that fails after its services are up stops them all and says why in one line",
    async () => {
      // a demo key that the API does not know makes the demo invocation fail after every service,
      // and the demo's instances, have started
      const demoFile = join(cfg.dataDir, "demo.json");
      const demo = readFileSync(demoFile, "utf8");
      const parsed = JSON.parse(demo) as { apiKey: string };
      writeFileSync(demoFile, JSON.stringify({ ...parsed, apiKey: "nvapi-not-a-key-the-api-knows" }));
      try {
        const failing = runStack(ctx, dir, cfg.file);
        const { code } = await failing.exited;
        assert.notEqual(code, 0);
        const out = lines(failing.output());
        const last = out.at(-1) ?? "";
        assert.match(last, /^callplane: the demo invocation failed with 401/, failing.output());
        await waitFor(
          "every process of the failed start to exit",
          () => stackProcesses(dir).length === 0,
          15_000,
        ).catch(() => assert.deepEqual(stackProcesses(dir), [], "no process is left behind"));
        assert.ok(!existsSync(join(cfg.dataDir, "stack.json")));
      } finally {
        writeFileSync(demoFile, demo);
      }
    },
  );

  await t.test(
    "a second start reuses the demo function; a second Ctrl-C stops at once and leaves nothing",
    async () => {
      assert.ok(firstDemoId, "the first start created the demo");
      // the recorded demo key is no longer one the API knows as active (revoked, expired, or as
      // here unknown): the second start issues a new one instead of failing the demo
      const demoFile = join(cfg.dataDir, "demo.json");
      const recorded = JSON.parse(readFileSync(demoFile, "utf8")) as { apiKey: string; apiKeyId: string };
      assert.match(recorded.apiKeyId, /^[0-9a-f-]{36}$/);
      writeFileSync(demoFile, JSON.stringify({ ...recorded, apiKeyId: randomUUID() }));
      const again = runStack(ctx, dir, cfg.file);
      const info2 = await waitStackReady(again, cfg.dataDir);
      assert.equal(info2.demo.httpFunctionId, firstDemoId);
      assert.match(again.output(), /reusing the demo function/);
      assert.match(again.output(), /the demo API key is unknown to the api; issuing a new one/);
      assert.notEqual(info2.demo.apiKey, recorded.apiKey);
      const admin = await adminToken(info2);
      const fns = await call<{ functions: Array<{ id: string; name: string }> }>(
        `${info2.api}/v2/nvcf/functions`,
        {
          token: admin,
        },
      );
      assert.equal(fns.status, 200, fns.text);
      const demos = fns.body.functions.filter((f) => f.name.startsWith("demo-"));
      assert.deepEqual(
        demos.map((f) => f.id).sort(),
        [firstDemoId, info2.demo.sseFunctionId, info2.demo.slowFunctionId, info2.demo.grpcFunctionId].sort(),
      );
      assert.deepEqual(
        [info2.demo.sseFunctionId, info2.demo.slowFunctionId, info2.demo.grpcFunctionId],
        [info!.demo.sseFunctionId, info!.demo.slowFunctionId, info!.demo.grpcFunctionId],
      );
      const r = await invoke(info2.invocation[1], firstDemoId, info2.demo.apiKey, { again: true });
      assert.equal(r.status, 200, r.text);

      const tree = descendants(again.child.pid!);
      assert.ok(tree.length >= 10, `${tree.length} processes under the stack`);
      again.child.kill("SIGINT");
      await sleep(20);
      again.child.kill("SIGINT");
      const { code } = await again.exited;
      assert.notEqual(code, 0);
      assert.match(again.output(), /stopping now/);
      await waitFor("every process of the stack to exit", () => tree.every((p) => !running(p)), 10_000).catch(
        () =>
          assert.deepEqual(
            tree.filter(running).map((p) => readFileSync(`/proc/${p}/cmdline`, "utf8").replaceAll("\0", " ")),
            [],
            "no process of the stack is left",
          ),
      );
      assert.deepEqual(stackProcesses(dir), []);
    },
  );
});

test("a port in use: the stack exits with one line naming it and leaves nothing behind", async (t) => {
  const ctx = lifo(t);
  const dir = tmpDir(ctx, "callplane-stack-port-");
  const cfg = await writeStackConfig(dir, {
    host: "127.0.40.2",
    podNetwork: "127.0.41.128/25",
    grpcNetwork: "127.0.43.128/25",
    instanceNetwork: "127.0.42.128/25",
  });
  const squatter: Server = createServer();
  await new Promise<void>((r) => squatter.listen(cfg.ports.api, "127.0.40.2", r));
  ctx.after(() => squatter.close());
  const run = runStack(ctx, dir, cfg.file);
  const { code } = await run.exited;
  assert.notEqual(code, 0);
  const out = lines(run.output());
  assert.equal(out.length, 1, run.output());
  assert.match(out[0], new RegExp(`127\\.0\\.40\\.2:${cfg.ports.api}\\b`));
  assert.match(out[0], /in use/);
  assert.deepEqual(stackProcesses(dir), []);
  assert.ok(!existsSync(join(cfg.dataDir, "stack.json")));
});

test("a lone key or CA file is refused in one line naming both fields, and left as it was", async (t) => {
  const ctx = lifo(t);
  const dir = tmpDir(ctx, "callplane-stack-keys-");
  const cfg = await writeStackConfig(dir, {
    host: "127.0.40.3",
    podNetwork: "127.0.41.128/25",
    grpcNetwork: "127.0.43.128/25",
    instanceNetwork: "127.0.42.128/25",
  });
  // an operator's own verification key (an identity provider's), without a signing key beside it
  const pub = join(cfg.dataDir, "keys", "admin-signing.pub.pem");
  mkdirSync(join(cfg.dataDir, "keys"), { recursive: true });
  writeFileSync(pub, "the identity provider's public key\n");
  const run = runStack(ctx, dir, cfg.file);
  const { code } = await run.exited;
  assert.notEqual(code, 0);
  // "starting a local stack in ...", then the one line that says what is wrong
  const out = lines(run.output());
  assert.equal(out.length, 2, run.output());
  assert.match(out[1], /auth\.adminPublicKeyFile .* exists but auth\.adminSigningKeyFile .* does not/);
  assert.equal(readFileSync(pub, "utf8"), "the identity provider's public key\n");
  assert.deepEqual(stackProcesses(dir), []);

  // the same for a CA certificate without its key
  rmSync(join(cfg.dataDir, "keys"), { recursive: true });
  const caCert = join(cfg.dataDir, "pki", "ca.crt");
  mkdirSync(join(cfg.dataDir, "pki"), { recursive: true });
  writeFileSync(caCert, "the operator's CA certificate\n");
  const again = runStack(ctx, dir, cfg.file);
  assert.notEqual((await again.exited).code, 0);
  const out2 = lines(again.output());
  assert.match(out2.at(-1) ?? "", /pki\.caCertFile .* exists but pki\.caKeyFile .* does not/);
  assert.equal(readFileSync(caCert, "utf8"), "the operator's CA certificate\n");
  assert.deepEqual(stackProcesses(dir), []);
});
