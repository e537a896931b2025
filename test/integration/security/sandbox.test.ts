// Functions cannot reach the plane's secrets (issue 19, finding 1): with the defaults the API
// refuses a function that would run a command of its own (local/command, or a built-in image made
// to load code through its environment) and so does the compute agent, for a deployment that got
// past the API; with compute.local.allowCommand on, the command runs as an unprivileged user in a
// folder of its own and cannot read the stack's keys, MEK, database or service tokens; the stack's
// data folder and database are the stack user's alone.
// Addresses: agents on 127.0.80.x, instances on 127.0.81.0/24.
import assert from "node:assert/strict";
import {
  chmodSync,
  chownSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { openSqliteFile } from "../../../src/services/api/db/sqlite.js";
import { createComputeAgent, type ComputeAgentOptions } from "../../../src/services/compute/agent.js";
import {
  accessProblem,
  programFilesProblem,
  resolveInstanceUser,
} from "../../../src/services/compute/instance-user.js";
import { OutputSlot } from "../../../src/services/worker/output-slot.js";
import { ProgressReport } from "../../../src/services/worker/progress.js";
import { silentLogger } from "../../../src/lib/log.js";
import { waitFor } from "../../testkit/client.js";
import { repoRoot } from "../../testkit/paths.js";
import { lifo } from "../../testkit/proc.js";
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

interface CorpusEntry {
  name: string;
  finding: string;
  request: { method: string; path: string; headers: Record<string, string>; body?: unknown };
  expect: { status: number; code: string };
}

const corpus = (
  JSON.parse(readFileSync(join(repoRoot, "test", "corpus", "hostile-requests.json"), "utf8")) as Record<
    string,
    unknown
  >
).compute as CorpusEntry[];

const isRoot = process.getuid?.() === 0;

async function createFunction(api: ApiFixture, admin: string, name: string, extra = {}) {
  const r = await call<{ function: { id: string; versionId: string } }>(`${api.url}/v2/nvcf/functions`, {
    token: admin,
    body: sampleFunction(name, extra),
  });
  assert.equal(r.status, 200, r.text);
  const { id, versionId } = r.body.function;
  return {
    fid: id,
    vid: versionId,
    path: `${api.url}/v2/nvcf/deployments/functions/${id}/versions/${versionId}`,
  };
}

function agentFor(
  api: ApiFixture,
  nats: Awaited<ReturnType<typeof startNats>>,
  dataDir: string,
  host: string,
  local: ComputeAgentOptions["local"],
) {
  return createComputeAgent({
    listen: { host, port: 0 },
    apiUrl: api.url,
    serviceToken: api.serviceToken("compute"),
    instanceNetwork: "127.0.81.0/24",
    syncIntervalMs: 300,
    reporter: "sandbox-test",
    instanceEnv: testInstanceEnv(
      { natsUrl: nats.url, natsCaPem: nats.pki.ca.certPem, dataDir },
      { region: "local", stopGraceMs: 3000, restart: { initialMs: 500, maxMs: 2000 }, logLevel: "warn" },
    ),
    tokenSource: "api",
    ...(local ? { local } : {}),
  });
}

test("with the defaults, the API refuses every function that would run a command of its own (corpus: compute)", async (t) => {
  const ctx = lifo(t);
  const api = await startApi(ctx);
  const admin = await api.adminToken();
  const fn = await createFunction(api, admin, "hostile");
  assert.ok(corpus.length >= 5);
  for (const e of corpus) {
    const path = e.request.path.replace("{functionId}", fn.fid).replace("{versionId}", fn.vid);
    const r = await call<{ code: string; detail: string; errors?: Array<{ field: string }> }>(
      `${api.url}${path}`,
      {
        method: e.request.method,
        token: admin,
        headers: e.request.headers,
        ...(e.request.body !== undefined ? { body: e.request.body } : {}),
      },
    );
    assert.equal(r.status, e.expect.status, `${e.name}: ${r.text}`);
    assert.equal(r.body.code, e.expect.code, `${e.name}: ${r.text}`);
    assert.match(r.body.detail, /compute\.local\.allowCommand/, `${e.name}: names the setting`);
    assert.ok(r.body.errors?.[0]?.field, `${e.name}: names the field`);
  }
  // nothing of it was stored: the version is still the plain local/echo it was
  const v = await call<{ function: { containerImage: string; containerEnvironment?: unknown[] } }>(
    `${api.url}/v2/nvcf/functions/${fn.fid}/versions/${fn.vid}`,
    { token: admin },
  );
  assert.equal(v.body.function.containerImage, "local/echo");
  assert.deepEqual(v.body.function.containerEnvironment ?? [], []);
  // a harmless environment is fine
  const ok = await call(`${api.url}/v2/nvcf/functions/${fn.fid}/versions/${fn.vid}`, {
    method: "PUT",
    token: admin,
    body: { containerEnvironment: [{ key: "NODE_ENV", value: "production" }] },
  });
  assert.equal(ok.status, 200, ok.text);
});

test("the compute agent refuses local/command (and code-loading environment) when it is off, even if the API let it through", async (t) => {
  const ctx = lifo(t);
  const nats = await startNats(ctx, { region: "local" });
  // an API that lets it through (as one with another configuration, or a database edited by hand)
  const api = await startApi(ctx, { nats, region: "local", allowLocalCommand: true });
  const admin = await api.adminToken();
  const dataDir = tmpDir(ctx, "callplane-sandbox-off-");
  const agent = agentFor(api, nats, dataDir, "127.0.80.1", undefined);
  ctx.after(() => agent.destroy());
  await agent.listen();
  const cmd = await createFunction(api, admin, "cmd-off", {
    containerImage: "local/command",
    containerArgs: "/bin/sh -c 'id > /tmp/should-never-run; sleep 600'",
  });
  const env = await createFunction(api, admin, "env-off", {
    containerEnvironment: [{ key: "NODE_OPTIONS", value: "--import=data:text/javascript,1" }],
  });
  for (const f of [cmd, env])
    assert.equal((await call(f.path, { token: admin, body: sampleDeployment(1, 1) })).status, 200);
  for (const [f, what] of [
    [cmd, /local\/command/],
    [env, /NODE_OPTIONS/],
  ] as const) {
    const inst = await waitFor(
      "the instance ERRORED",
      () => agent.instances().find((i) => i.deployment.versionId === f.vid && i.status === "ERRORED"),
      60_000,
    );
    assert.match(inst.message ?? "", /compute\.local\.allowCommand/, "names the setting");
    assert.match(inst.message ?? "", what);
    assert.deepEqual(inst.pids, { inference: undefined, worker: undefined }, "nothing was started");
    // and the API reports it so
    const d = await call<{ deployment: { instances: Array<{ instanceStatus: string; message?: string }> } }>(
      f.path,
      { token: admin },
    );
    assert.equal(d.body.deployment.instances[0]?.instanceStatus, "ERRORED", d.text);
  }
});

test(
  "with local/command on, a function's command runs as an unprivileged user outside the stack's folder and reads none of its secrets",
  { skip: isRoot ? false : "instances switch users only when the agent runs as root" },
  async (t) => {
    const ctx = lifo(t);
    const nats = await startNats(ctx, { region: "local" });
    const api = await startApi(ctx, { nats, region: "local", allowLocalCommand: true });
    const admin = await api.adminToken();
    // the API fixture's folder is the stack's data folder here: keys, MEK, database, tokens
    const dataDir = api.dir;
    const agent = agentFor(api, nats, dataDir, "127.0.80.2", { allowCommand: true });
    ctx.after(() => agent.destroy());
    await agent.listen();
    const files = [
      api.privateKeyFile,
      api.issuerKeyFile,
      api.mekFile,
      api.dbPath,
      api.identityKeyFile,
      join(api.serviceTokenDir, "compute.token"),
    ];
    const folders = [dataDir, api.keysDir, api.serviceTokenDir];
    const targets = [...files, ...folders];
    for (const f of targets) assert.ok(existsSync(f), f);
    const server = join(distRoot, "examples", "inference-server.js");
    // what the finding ran: cat the keys, id, pwd; then a server, so that the instance stays up
    const script = [
      ...files.map((f) => `if cat ${f} >/dev/null 2>&1; then echo READ ${f}; else echo DENIED ${f}; fi`),
      ...folders.map((f) => `if ls ${f} >/dev/null 2>&1; then echo READ ${f}; else echo DENIED ${f}; fi`),
      "echo UID $(id -u) $(id -un)",
      "echo PWD $(pwd)",
      "echo HOME $HOME",
      "echo END",
      `exec ${process.execPath} ${server}`,
    ].join("; ");
    const fn = await createFunction(api, admin, "escape", {
      containerImage: "local/command",
      containerArgs: `/bin/sh -c '${script}'`,
    });
    assert.equal((await call(fn.path, { token: admin, body: sampleDeployment(1, 1) })).status, 200);
    const inst = await waitFor(
      "the instance ACTIVE",
      () => agent.instances().find((i) => i.deployment.versionId === fn.vid && i.status === "ACTIVE"),
      90_000,
    );
    const log = join(dataDir, "logs", "instances", `escape-${inst.slot}-inference.log`);
    const out = await waitFor("the command's report", () => {
      const text = existsSync(log) ? readFileSync(log, "utf8") : "";
      return text.includes("END") && text;
    });
    for (const f of targets) assert.match(out, new RegExp(`^DENIED ${f}$`, "m"), out);
    const user = resolveInstanceUser("");
    assert.match(out, new RegExp(`^UID ${user.uid} callplane-fn$`, "m"), out);
    assert.notEqual(user.uid, 0);
    const pwd = /^PWD (.*)$/m.exec(out)?.[1] ?? "";
    assert.ok(pwd && !pwd.startsWith(dataDir) && !pwd.startsWith(repoRoot), pwd);
    assert.match(out, new RegExp(`^HOME ${pwd}$`, "m"), "HOME is its own folder, not the agent's");
    const st = statSync(pwd);
    assert.equal(st.uid, user.uid, "its folder is its own");
    assert.equal(st.mode & 0o777, 0o700);
    // it still serves: the instance works as before
    const echoed = await fetch(`http://${inst.host}:8000/echo`, { method: "POST", body: "still served" });
    assert.equal(await echoed.text(), "still served");
  },
);

test("the stack's folder and database are the stack user's alone", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "callplane-sandbox-modes-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  // a database made by SQLite alone would be 0644
  const fresh = openSqliteFile(join(dir, "fresh.db"));
  fresh.exec("CREATE TABLE t (x)");
  fresh.close();
  assert.equal(statSync(join(dir, "fresh.db")).mode & 0o777, 0o600);
  writeFileSync(join(dir, "old.db"), "", { mode: 0o644 });
  chmodSync(join(dir, "old.db"), 0o644);
  const old = openSqliteFile(join(dir, "old.db"));
  old.exec("CREATE TABLE t (x)");
  assert.equal(statSync(join(dir, "old.db")).mode & 0o777, 0o600, "an existing database is made private");
  assert.equal(statSync(join(dir, "old.db-wal")).mode & 0o777, 0o600, "its WAL takes its mode");
  old.close();
  // the stack makes its data folder private whatever it was
  const { LocalStack } = await import("../../../src/stack/stack.js");
  const { loadConfig } = await import("../../../src/lib/config/index.js");
  const data = join(dir, "data");
  mkdirSync(data, { mode: 0o755 });
  chmodSync(data, 0o755);
  const stack = new LocalStack({
    config: loadConfig({ overrides: { global: { dataDir: data } }, env: {} }),
    configFile: undefined,
    say: () => undefined,
  });
  stack.claim();
  assert.equal(statSync(data).mode & 0o777, 0o700);
});

test(
  "what an instance's user cannot read is found before it starts, naming the folder and the fix",
  { skip: isRoot ? false : "needs root" },
  (t) => {
    const user = resolveInstanceUser("");
    const dir = mkdtempSync(join(tmpdir(), "callplane-sandbox-private-"));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    // a checkout under a private folder (as under /root, mode 0700)
    const dist = join(dir, "checkout", "dist");
    mkdirSync(dist, { recursive: true });
    const problem = programFilesProblem(user, dist);
    assert.match(problem ?? "", new RegExp(`${dir} \\(mode 0700`), problem);
    assert.match(problem ?? "", /compute\.local\.runAs/);
    assert.match(problem ?? "", /chmod o\+rx/);
    chmodSync(dir, 0o755);
    assert.equal(programFilesProblem(user, dist), undefined);
    assert.equal(accessProblem(user, distRoot, "read"), undefined, "this checkout is readable");
  },
);

test("the worker never reads an instance's progress file through a link (its folder is the server's)", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "callplane-sandbox-progress-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const secret = join(dir, "only-the-worker.json");
  writeFileSync(secret, JSON.stringify({ progress: 42, partialResponse: { secret: "key material" } }));
  const out = join(dir, "slot-0");
  mkdirSync(out);
  symlinkSync(secret, join(out, "progress"));
  const report = new ProgressReport("req", silentLogger());
  await report.check(out);
  assert.equal(report.unreported, false, "a link is not followed");
  assert.doesNotMatch(report.message().toString(), /key material/);
});

test(
  "the worker empties an output folder of the server's user with that user's rights only",
  { skip: isRoot ? false : "needs root" },
  async (t) => {
    const user = resolveInstanceUser("");
    const dir = mkdtempSync(join(tmpdir(), "callplane-sandbox-slot-"));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    chmodSync(dir, 0o711);
    const keys = join(dir, "keys");
    mkdirSync(keys, { mode: 0o700 });
    writeFileSync(join(keys, "admin.key.pem"), "the stack's key", { mode: 0o600 });
    const out = join(dir, "slot-0");
    mkdirSync(out, { mode: 0o700 });
    chownSync(out, user.uid, user.gid);
    const slot = await OutputSlot.create(out);
    t.after(() => slot.close());
    // what a server leaves: its own files, and links into the stack's folder
    const own = join(out, "large-output");
    mkdirSync(own);
    writeFileSync(join(own, "part-1"), "x");
    chownSync(own, user.uid, user.gid);
    chownSync(join(own, "part-1"), user.uid, user.gid);
    symlinkSync(keys, join(out, "to-keys"));
    await waitFor("the slot noticed the writes", async () => {
      await slot.reset();
      return !existsSync(own) && !existsSync(join(out, "to-keys"));
    });
    assert.equal(readFileSync(join(keys, "admin.key.pem"), "utf8"), "the stack's key");
  },
);
