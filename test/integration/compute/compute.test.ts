// The compute agent with the local backend, against a real API, a real nats-server and real
// instance processes (example inference server + worker agent) on their own loopback addresses.
// Addresses: agents on 127.0.30.x, instances on 127.0.31.0/24 (in-process agent) and
// 127.0.32.0/24 (the agent run as a child process), so this file never meets a developer's stack
// (127.0.0.1:8080..., 127.0.3.x) nor test/stack.test.ts (127.0.40-42.x).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { chmodSync, existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { jetstreamManager } from "@nats-io/jetstream";
import { waitFor as poll } from "../../testkit/client.js";
import { cmdline, descendants, lifo, running } from "../../testkit/proc.js";
import { cidrContains, parseCidr } from "../../../src/lib/net/index.js";
import { createComputeAgent } from "../../../src/services/compute/agent.js";
import type { LocalInstance } from "../../../src/services/compute/local.js";
import {
  call,
  distRoot,
  sampleDeployment,
  sampleFunction,
  startApi,
  startNats,
  tmpDir,
  type ApiFixture,
} from "../../testkit/index.js";
import { testInstanceEnv } from "../../testkit/compute.js";

/**
 * Waits for a condition; these tests start whole process trees (two instances are four Node
 * processes), which on a loaded 2-core machine took over 30 s, so the deadline is generous.
 */
const waitFor = <T>(
  what: string,
  check: () => T | undefined | false | Promise<T | undefined | false>,
  timeoutMs = 90_000,
) => poll(what, check, timeoutMs);

const INSTANCE_NET = "127.0.31.0/24";
const CHILD_INSTANCE_NET = "127.0.32.0/24";

interface InstanceDto {
  instanceId: string;
  instanceStatus: string;
  location: string;
  message?: string;
}
interface DeploymentDto {
  functionStatus: string;
  healthInfo: Array<{ error: string }>;
  instances: InstanceDto[];
}

async function workerReady(host: string): Promise<number> {
  try {
    const res = await fetch(`http://${host}:8080/v1/health/ready`, { signal: AbortSignal.timeout(2000) });
    await res.arrayBuffer();
    return res.status;
  } catch {
    return 0;
  }
}

async function createFunction(
  api: ApiFixture,
  admin: string,
  name: string,
  extra: Record<string, unknown> = {},
): Promise<{ fid: string; vid: string; path: string }> {
  const created = await call<{ function: { id: string; versionId: string } }>(
    `${api.url}/v2/nvcf/functions`,
    {
      token: admin,
      body: sampleFunction(name, extra),
    },
  );
  assert.equal(created.status, 200, created.text);
  const { id, versionId } = created.body.function;
  return {
    fid: id,
    vid: versionId,
    path: `${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`,
  };
}

async function deployment(path: string, admin: string): Promise<DeploymentDto> {
  const r = await call<{ deployment: DeploymentDto }>(path, { token: admin });
  assert.equal(r.status, 200, r.text);
  return r.body.deployment;
}

test("compute agent, local backend (in process)", async (t) => {
  const ctx = lifo(t);
  const nats = await startNats(ctx, { region: "local" });
  const api = await startApi(ctx, {
    nats,
    region: "local",
    queue: { maxMessages: 1000, maxMessageBytes: 1024 * 1024 },
    // the local/command tests below (test/integration/security/sandbox.test.ts: what it may reach)
    allowLocalCommand: true,
  });
  const admin = await api.adminToken();
  const dataDir = tmpDir(ctx, "callplane-compute-");
  const agent = createComputeAgent({
    listen: { host: "127.0.30.1", port: 0 },
    apiUrl: api.url,
    serviceToken: api.serviceToken("compute"),
    instanceNetwork: INSTANCE_NET,
    syncIntervalMs: 400,
    reporter: "compute-test",
    instanceEnv: testInstanceEnv(
      { natsUrl: nats.url, natsCaPem: nats.pki.ca.certPem, dataDir },
      { region: "local", restart: { initialMs: 500, maxMs: 2000 }, logLevel: "warn" },
    ),
    tokenSource: "api",
    local: { allowCommand: true },
  });
  // the safety net when a subtest failed midway (the last subtest closes the agent)
  ctx.after(() => agent.destroy());
  const compute = await agent.listen();
  assert.equal(compute.hostname, "127.0.30.1");
  const net = parseCidr(INSTANCE_NET);
  const instancesOf = (vid: string) => agent.instances().filter((i) => i.deployment.versionId === vid);
  const stored = async (vid: string) => await api.store.listInstances(vid);

  const echo = await createFunction(api, admin, "echo-two");
  let echoInstances: LocalInstance[] = [];

  await t.test("a deployment of local/echo with minInstances 2 gets two ACTIVE instances", async () => {
    const r = await call(echo.path, { token: admin, body: sampleDeployment(2, 2) });
    assert.equal(r.status, 200, r.text);
    const dep = await waitFor("two ACTIVE instances", async () => {
      const d = await deployment(echo.path, admin);
      return d.instances.filter((i) => i.instanceStatus === "ACTIVE").length === 2 && d;
    });
    assert.equal(dep.functionStatus, "ACTIVE");
    assert.deepEqual(dep.healthInfo, []);
    const hosts = dep.instances.map((i) => i.location);
    assert.equal(new Set(hosts).size, 2, `distinct addresses: ${hosts.join(", ")}`);
    for (const h of hosts) assert.ok(cidrContains(net, h), `${h} is in ${INSTANCE_NET}`);
    echoInstances = instancesOf(echo.vid);
    assert.equal(echoInstances.length, 2);
    // the control plane (the API) created the version's work queue, with its limits
    const nc = await nats.observe();
    try {
      const stream = await (await jetstreamManager(nc)).streams.info(`rq_local_${echo.vid}`);
      assert.equal(stream.config.max_msgs, 1000);
      assert.equal(stream.config.max_msg_size, 1024 * 1024);
      assert.equal(stream.config.num_replicas, 1);
    } finally {
      await nc.close();
    }
    for (const i of echoInstances) {
      assert.ok(running(i.pids.inference), `inference server of ${i.host} runs`);
      assert.ok(running(i.pids.worker), `worker of ${i.host} runs`);
      assert.equal(await workerReady(i.host), 200, `worker health on ${i.host}:8080`);
      // the inference server answers on the instance's own address
      const echoed = await fetch(`http://${i.host}:8000/echo`, { method: "POST", body: "hi" });
      assert.equal(echoed.status, 200);
      assert.equal(await echoed.text(), "hi");
    }
  });

  await t.test("an inference server that dies is reported ERRORED, restarted, and ACTIVE again", async () => {
    const victim = echoInstances[0];
    assert.ok(victim, "the first subtest started the instances");
    const pid = victim.pids.inference!;
    process.kill(pid, "SIGKILL");
    const errored = await waitFor("the instance reported ERRORED", async () =>
      (await stored(echo.vid)).find((i) => i.instanceId === victim.instanceId && i.status === "ERRORED"),
    );
    assert.match(errored.message ?? "", /inference server exited \(SIGKILL\)/);
    assert.match(errored.message ?? "", /restarting/);
    const log = /See (\S+\.log)/.exec(errored.message ?? "")?.[1];
    assert.ok(log && existsSync(log), `the message points at the server's log: ${errored.message}`);
    const active = await waitFor(
      "the instance ACTIVE again",
      async () =>
        (await stored(echo.vid)).find((i) => i.instanceId === victim.instanceId && i.status === "ACTIVE"),
      20_000,
    );
    // restarted after the backoff (500 ms here), not at once
    assert.ok(Date.parse(active.updatedAt) - Date.parse(errored.updatedAt) >= 500);
    const again = victim.pids.inference;
    assert.ok(again && again !== pid && running(again), "a new inference server process runs");
    assert.ok(!running(pid));
    const d = await deployment(echo.path, admin);
    assert.equal(d.functionStatus, "ACTIVE");
    const mine = d.instances.find((i) => i.instanceId === victim.instanceId);
    assert.equal(mine?.instanceStatus, "ACTIVE");
    assert.equal(mine?.message, undefined, "the error message is cleared once ACTIVE");
  });

  await t.test("scaling down to one stops one instance; undeploying stops the rest", async () => {
    assert.equal(echoInstances.length, 2, "the first subtest started the instances");
    const r = await call(echo.path, { method: "PUT", token: admin, body: sampleDeployment(1, 2) });
    assert.equal(r.status, 200, r.text);
    // the store keeps only the agent's latest report: TERMINATED shows once, then the row is gone
    const seen = new Set<string>();
    const gone = await waitFor("one instance reported TERMINATED, then gone", async () => {
      const rows = await stored(echo.vid);
      for (const row of rows) if (row.status === "TERMINATED") seen.add(row.instanceId);
      const stopped = [...seen].find((id) => !rows.some((row) => row.instanceId === id));
      return rows.length === 1 && stopped;
    });
    const stoppedInst = echoInstances.find((i) => i.instanceId === gone)!;
    const kept = echoInstances.find((i) => i.instanceId !== gone)!;
    assert.ok(stoppedInst && kept);
    const left = instancesOf(echo.vid);
    assert.equal(left.length, 1);
    assert.equal(left[0], kept);
    await waitFor("the stopped instance's processes exit", () =>
      [stoppedInst.pids.inference, stoppedInst.pids.worker].every((p) => !running(p)),
    );
    assert.equal(await workerReady(stoppedInst.host), 0, "nothing listens on the stopped address");
    assert.ok(running(kept.pids.inference) && running(kept.pids.worker));
    const d = await deployment(echo.path, admin);
    assert.equal(d.functionStatus, "ACTIVE");
    assert.deepEqual(
      d.instances.map((i) => i.instanceId),
      [kept.instanceId],
    );

    const pids = [kept.pids.inference, kept.pids.worker];
    const del = await call(echo.path, { method: "DELETE", token: admin });
    assert.equal(del.status, 200, del.text);
    await waitFor("the last instance reported TERMINATED", async () =>
      (await stored(echo.vid)).some((i) => i.instanceId === kept.instanceId && i.status === "TERMINATED"),
    );
    await waitFor("every process of the undeployed function exits", () => pids.every((p) => !running(p)));
    await waitFor("the terminated instance is gone", async () => (await stored(echo.vid)).length === 0);
    assert.deepEqual(instancesOf(echo.vid), []);
    const fn = await call<{ function: { status: string; activeInstances: unknown[] } }>(
      `${api.url}/v2/nvcf/functions/${echo.fid}/versions/${echo.vid}`,
      { token: admin },
    );
    assert.equal(fn.status, 200);
    assert.equal(fn.body.function.status, "INACTIVE");
    assert.deepEqual(fn.body.function.activeInstances, []);
  });

  await t.test("an image the local backend cannot run is ERRORED with a message that helps", async () => {
    const bad = await createFunction(api, admin, "nvcr-image", { containerImage: "nvcr.io/x/y" });
    const r = await call(bad.path, { token: admin, body: sampleDeployment(1, 1) });
    assert.equal(r.status, 200, r.text);
    const d = await waitFor("the instance reported ERRORED", async () => {
      const dep = await deployment(bad.path, admin);
      return dep.instances.some((i) => i.instanceStatus === "ERRORED") && dep;
    });
    assert.equal(d.functionStatus, "ERROR");
    const message = d.instances[0].message ?? "";
    assert.match(message, /nvcr\.io\/x\/y/, "names the image");
    assert.match(message, /cannot run on the local compute backend/);
    assert.match(message, /local\/echo/, "says what to use instead");
    assert.match(message, /local\/command/);
    assert.equal(d.healthInfo.length, 1);
    assert.equal(d.healthInfo[0].error, message);
    // it started no process and takes no restart loop: it stays ERRORED
    const inst = instancesOf(bad.vid);
    assert.equal(inst.length, 1);
    assert.deepEqual(inst[0].pids, { inference: undefined, worker: undefined });
    assert.equal((await call(bad.path, { method: "DELETE", token: admin })).status, 200);
    await waitFor("the errored instance is removed", () => instancesOf(bad.vid).length === 0);
  });

  await t.test("local/command runs the command in containerArgs as the inference server", async () => {
    const server = join(distRoot, "examples", "inference-server.js");
    const cmd = await createFunction(api, admin, "command", {
      containerImage: "local/command",
      containerArgs: `${process.execPath} ${server}`,
    });
    assert.equal((await call(cmd.path, { token: admin, body: sampleDeployment(1, 1) })).status, 200);
    await waitFor(
      "the instance ACTIVE",
      async () => (await deployment(cmd.path, admin)).functionStatus === "ACTIVE",
    );
    const [inst] = instancesOf(cmd.vid);
    assert.ok(inst);
    // exec'd, not wrapped in a shell: a stop signal reaches the server itself
    assert.match(cmdline(inst.pids.inference!), /inference-server\.js/);
    assert.equal(await workerReady(inst.host), 200);
    const echoed = await fetch(`http://${inst.host}:8000/echo`, { method: "POST", body: "from a command" });
    assert.equal(await echoed.text(), "from a command");
  });

  await t.test("a new deployment never takes the address of an instance still stopping", async () => {
    // an inference server that takes 1.5 s to stop after SIGTERM, so that its address stays busy
    // (in a folder its user can read: servers do not run as the test's user when that is root)
    const scripts = tmpDir(ctx, "callplane-compute-scripts-");
    chmodSync(scripts, 0o755);
    const script = join(scripts, "slow-stop.mjs");
    writeFileSync(
      script,
      [
        'import { createServer } from "node:http";',
        "const s = createServer((req, res) => res.end('ok'));",
        "s.listen(Number(process.env.INFERENCE_PORT), process.env.INFERENCE_HOST);",
        "process.on('SIGTERM', () => setTimeout(() => process.exit(0), 1500));",
        "",
      ].join("\n"),
    );
    const slow = await createFunction(api, admin, "slow-stop", {
      containerImage: "local/command",
      containerArgs: `${process.execPath} ${script}`,
    });
    assert.equal((await call(slow.path, { token: admin, body: sampleDeployment(1, 1) })).status, 200);
    const old = await waitFor("the slow-stopping instance ACTIVE", () => {
      const [i] = instancesOf(slow.vid);
      return i?.status === "ACTIVE" && i;
    });
    const oldPids = [old.pids.inference, old.pids.worker];
    const next = await createFunction(api, admin, "echo-next");
    // back to back, so that the agent most likely sees both changes in one sync
    const [del, dep] = await Promise.all([
      call(slow.path, { method: "DELETE", token: admin }),
      call(next.path, { token: admin, body: sampleDeployment(1, 1) }),
    ]);
    assert.equal(del.status, 200, del.text);
    assert.equal(dep.status, 200, dep.text);
    const statuses: string[] = [];
    const inst = await waitFor("the new instance ACTIVE", () => {
      const [i] = instancesOf(next.vid);
      if (i && statuses.at(-1) !== i.status) statuses.push(i.status);
      if (i?.status === "ERRORED") return i;
      return i?.status === "ACTIVE" && i;
    });
    assert.deepEqual(
      statuses.filter((s) => s === "ERRORED"),
      [],
      inst.message,
    );
    await waitFor("the old instance's processes exit", () => oldPids.every((p) => !running(p)));
  });

  await t.test("stopping the agent stops every instance process", async () => {
    // one more deployment, so that close() has more than one instance to stop
    const more = await createFunction(api, admin, "echo-more");
    assert.equal((await call(more.path, { token: admin, body: sampleDeployment(2, 2) })).status, 200);
    await waitFor(
      "every instance ACTIVE",
      () => instancesOf(more.vid).length === 2 && agent.instances().every((i) => i.status === "ACTIVE"),
    );
    const pids = agent.instances().flatMap((i) => [i.pids.inference, i.pids.worker]);
    assert.ok(pids.length >= 6, `${pids.length} processes`);
    assert.ok(pids.every(running));
    const ids: string[] = agent.instances().map((i) => i.instanceId);
    await agent.close(5000);
    assert.deepEqual(
      pids.filter((p) => running(p)),
      [],
      "no instance process outlives the agent",
    );
    assert.deepEqual(
      descendants(process.pid).filter((p) => pids.includes(p)),
      [],
    );
    // its last report says so
    const rows = await stored(more.vid);
    assert.ok(rows.length > 0);
    for (const row of await api.store.listInstances())
      if (ids.includes(row.instanceId)) assert.equal(row.status, "TERMINATED", row.instanceId);
  });
});

test("compute agent as a process: main.js reads its token from auth.serviceTokenDir and stops its instances on SIGTERM", async (t) => {
  const ctx = lifo(t);
  const nats = await startNats(ctx, { region: "local" });
  const api = await startApi(ctx, { nats, region: "local" });
  const admin = await api.adminToken();
  const dir = tmpDir(ctx, "callplane-compute-main-");
  const configFile = join(dir, "callplane.yaml");
  writeFileSync(
    configFile,
    [
      "global:",
      `  dataDir: ${join(dir, "data")}`,
      "log:",
      "  level: warn",
      "nats:",
      `  url: ${nats.url}`,
      `  credentialsDir: ${nats.credentialsDir}`,
      "  tls:",
      `    caFile: ${nats.caFile}`,
      "  server:",
      "    enabled: false",
      "api:",
      `  url: ${api.url}`,
      "auth:",
      `  serviceTokenDir: ${api.serviceTokenDir}`,
      "workerCallbackProxy:",
      "  enabled: false",
      "compute:",
      "  listen: 127.0.30.2:0",
      `  instanceNetwork: ${CHILD_INSTANCE_NET}`,
      "  syncIntervalSeconds: 0.3",
      "  stopGraceSeconds: 5",
      "",
    ].join("\n"),
  );
  const fn = await createFunction(api, admin, "echo-child");
  assert.equal((await call(fn.path, { token: admin, body: sampleDeployment(1, 1) })).status, 200);

  const child = spawn(
    process.execPath,
    [join(distRoot, "src", "services", "compute", "main.js"), "--config", configFile],
    {
      cwd: dir,
      env: { ...process.env, CALLPLANE_CONFIG: "" },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let output = "";
  child.stdout.on("data", (d: Buffer) => (output += d.toString()));
  child.stderr.on("data", (d: Buffer) => (output += d.toString()));
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  ctx.after(() => {
    // when the test failed midway: the agent and its instances, by pid
    if (child.exitCode !== null || child.signalCode !== null) return;
    for (const pid of [...descendants(child.pid!), child.pid!]) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
  });

  const dep = await waitFor(
    "the instance ACTIVE",
    async () => {
      const d = await deployment(fn.path, admin);
      return d.functionStatus === "ACTIVE" && d;
    },
    30_000,
  ).catch((err: Error) => {
    throw new Error(`${err.message}\ncompute output:\n${output}`);
  });
  const host = dep.instances[0].location;
  assert.ok(cidrContains(parseCidr(CHILD_INSTANCE_NET), host), host);
  assert.equal(await workerReady(host), 200);
  const procs = descendants(child.pid!);
  assert.equal(procs.length, 2, `inference server and worker: ${procs.map(cmdline).join(" | ")}`);

  child.kill("SIGTERM");
  assert.equal(await exited, 0, output);
  assert.deepEqual(procs.filter(running), [], "no instance process outlives the agent");
  const rows = await api.store.listInstances(fn.vid);
  assert.deepEqual(
    rows.map((r) => r.status),
    ["TERMINATED"],
  );
});
