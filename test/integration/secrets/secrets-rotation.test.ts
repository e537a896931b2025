// Two API processes (node dist/src/services/api/main.js) on one database (SQLite, and PostgreSQL)
// and one keyring file, through a whole MEK rotation while secrets are written through one and read through the
// other: nothing written is lost or unreadable, each step is taken by exactly one replica, and the
// old key ends retired and out of the keyring.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, test, type TestContext } from "node:test";
import {
  createAdminTokenSigner,
  ensureAdminKeyPair,
  ensureServiceTokens,
  readServiceToken,
} from "../../../src/lib/identity/index.js";
import { ensureKeyringFile } from "../../../src/lib/secrets/index.js";
import { waitFor } from "../../testkit/client.js";
import { call, distRoot, sampleFunction, startNats, tmpDir } from "../../testkit/index.js";
import { startPostgres, type Postgres } from "../../testkit/postgres.js";
import { reverseScope, startService } from "../../testkit/processes.js";

const apiScript = join(distRoot, "src", "services", "api", "main.js");

interface KeyStatus {
  replicaId: string;
  primaryKid: string;
  meks: Array<{ kid: string; state: string; neks: number }>;
  rotation: null | {
    phase: string;
    fromKid: string;
    toKid: string;
    keyDestroyed: boolean;
    waitingFor: string[];
  };
  replicas: Array<{ id: string; live: boolean; primaryKid: string | null; keyIds: string[] }>;
}

// one PostgreSQL server for the file, stopped after its last test
let server: Promise<Postgres> | undefined;
const serverCleanup: Array<() => unknown> = [];
after(async () => {
  for (const f of serverCleanup) await f();
});

for (const driver of ["sqlite", "postgres"] as const)
  test(`two API processes on one ${driver} database: a full MEK rotation while secrets are written and read`, async (t) => {
    await rotation(t, driver);
  });

async function rotation(t: TestContext, driver: "sqlite" | "postgres"): Promise<void> {
  const ctx = reverseScope(t);
  const dir = tmpDir(t, "callplane-rotation-");
  const keyFile = join(dir, "keys", "admin-signing.key.pem");
  ensureAdminKeyPair(keyFile, join(dir, "keys", "admin-signing.pub.pem"));
  ensureServiceTokens(join(dir, "secrets"));
  const mekFile = join(dir, "keys", "mek.json");
  ensureKeyringFile(mekFile);
  const nats = await startNats(ctx);
  const env = {
    ...nats.serviceEnv(),
    CALLPLANE__GLOBAL__DATA_DIR: dir,
    CALLPLANE__API__LISTEN: "127.0.0.1:0",
    CALLPLANE__ADMIN_ISSUER_PROXY__ENABLED: "false",
    CALLPLANE__SECRETS__MEK__REFRESH_SECONDS: "0.25",
    CALLPLANE__SECRETS__MEK__ROTATION_GRACE_SECONDS: "1",
    CALLPLANE__LOG__LEVEL: "info",
    ...(driver === "postgres"
      ? {
          CALLPLANE__API__DATABASE__DRIVER: "postgres",
          CALLPLANE__API__DATABASE__URL: await (
            await (server ??= startPostgres({ after: (fn) => void serverCleanup.push(fn as () => unknown) }))
          ).createDatabase(`rot_${Date.now()}`),
        }
      : {}),
  };
  const a = await startService(ctx, "api-a", apiScript, env);
  const b = await startService(ctx, "api-b", apiScript, env);
  const [urlA, urlB] = [a.urls.api, b.urls.api];
  assert.ok(urlA && urlB && urlA !== urlB, `two APIs: ${urlA} ${urlB}`);
  const admin = (await (await createAdminTokenSigner(readFileSync(keyFile, "utf8"), 3600)).sign()).token;
  const compute = readServiceToken(join(dir, "secrets"), "compute");
  const status = async (url: string) =>
    (await call<KeyStatus>(`${url}/v1/admin/secrets/keys`, { token: admin })).body;

  // ten functions, each with a secret, made through A
  const fns: Array<{ fid: string; vid: string }> = [];
  for (let i = 0; i < 10; i++) {
    const r = await call<{ function: { id: string; versionId: string } }>(`${urlA}/v2/nvcf/functions`, {
      token: admin,
      body: sampleFunction(`rot-${i}`, { secrets: [{ name: "BASE", value: `base-${i}` }] }),
    });
    assert.equal(r.status, 200, r.text);
    fns.push({ fid: r.body.function.id, vid: r.body.function.versionId });
  }
  await waitFor(
    "both replicas beat",
    async () => (await status(urlA)).replicas.filter((r) => r.live).length === 2,
    10_000,
  );
  const oldKid = (await status(urlB)).primaryKid;

  // the load: each write goes to one API and is read back through the other at once
  const written = new Map<string, string>(); // `${i}/${name}` -> value
  const problems: string[] = [];
  let writes = 0;
  let running = true;
  const load = (async () => {
    while (running) {
      const i = writes % fns.length;
      const [w, r] = writes % 2 === 0 ? [urlA, urlB] : [urlB, urlA];
      const name = `W${writes}`;
      const value = `value-${writes}-${Date.now()}`;
      const put = await call(`${w}/v2/nvcf/secrets/functions/${fns[i].fid}/versions/${fns[i].vid}`, {
        method: "PUT",
        token: admin,
        body: { secrets: [{ name, value }] },
      });
      if (put.status !== 204) problems.push(`PUT ${name} via ${w}: ${put.status} ${put.text}`);
      else written.set(`${i}/${name}`, value);
      const got = await call<{ values: Record<string, string>; unreadable: unknown[] }>(
        `${r}/v1/internal/secrets/functions/${fns[i].fid}/versions/${fns[i].vid}`,
        { token: compute },
      );
      if (got.status !== 200) problems.push(`read via ${r}: ${got.status} ${got.text}`);
      else {
        if (got.body.values[name] !== value)
          problems.push(`${name} read back via ${r} as ${got.body.values[name]}`);
        if (got.body.values.BASE !== `base-${i}`)
          problems.push(`BASE of function ${i} via ${r}: ${got.body.values.BASE}`);
        if (got.body.unreadable.length)
          problems.push(`unreadable via ${r}: ${JSON.stringify(got.body.unreadable)}`);
      }
      writes++;
    }
  })();

  // the rotation is started on B and followed on A
  const started = await call<KeyStatus>(`${urlB}/v1/admin/secrets/mek/rotate`, { token: admin, body: {} });
  assert.equal(started.status, 202, started.text);
  const newKid = started.body.rotation!.toKid;
  const phases = new Set<string>();
  const done = await waitFor(
    "the rotation done",
    async () => {
      const s = await status(urlA);
      if (s.rotation) phases.add(s.rotation.phase);
      // the retired key leaves the keyring right after the step that retires it
      return s.rotation?.phase === "done" && s.rotation.keyDestroyed && s;
    },
    { timeoutMs: 60_000, intervalMs: 100 },
  );
  const writesAtEnd = writes;
  // a little more load once it is over
  await waitFor("more writes after the rotation", () => writes >= writesAtEnd + 10, 20_000);
  running = false;
  await load;
  assert.deepEqual(problems, [], `${problems.length} problems in ${writes} writes`);
  assert.ok(writes >= 20, `only ${writes} writes`);
  assert.ok(phases.has("distributing") || phases.has("rewrapping"), `seen: ${[...phases].join(", ")}`);

  assert.equal(done.primaryKid, newKid);
  const states = new Map(done.meks.map((m) => [m.kid, [m.state, m.neks]]));
  assert.deepEqual(states.get(oldKid), ["retired", 0]);
  assert.deepEqual(states.get(newKid), ["primary", 10]);
  assert.equal(done.rotation!.keyDestroyed, true);
  const keyring = readFileSync(mekFile, "utf8");
  assert.ok(keyring.includes(newKid) && !keyring.includes(oldKid), "the keyring holds the new key only");
  await waitFor("both replicas on the new primary", async () => {
    const s = await status(urlB);
    return s.replicas.filter((r) => r.live && r.primaryKid === newKid).length === 2;
  });

  // everything written reads back through both, with cold caches (fresh processes would too)
  for (const url of [urlA, urlB]) {
    for (const [i, f] of fns.entries()) {
      const got = await call<{ values: Record<string, string>; unreadable: unknown[] }>(
        `${url}/v1/internal/secrets/functions/${f.fid}/versions/${f.vid}`,
        { token: compute },
      );
      assert.deepEqual(got.body.unreadable, []);
      assert.equal(got.body.values.BASE, `base-${i}`);
      for (const [k, v] of written)
        if (k.startsWith(`${i}/`)) assert.equal(got.body.values[k.slice(k.indexOf("/") + 1)], v);
    }
  }
  // each step was taken by exactly one replica
  const lines = (re: RegExp) =>
    [a, b].flatMap((p) =>
      p
        .output()
        .split("\n")
        .filter((l) => re.test(l)),
    );
  // services write their logs in batches (flushed every 200 ms): the last step's line may be on its way
  await waitFor(
    "the rotation's last log line",
    () => (lines(/MEK rotation done/).length ? true : undefined),
    {
      timeoutMs: 10_000,
      intervalMs: 100,
    },
  ).catch(() => undefined); // counted below
  assert.equal(lines(/MEK rotation started/).length, 1);
  assert.equal(lines(/the new MEK is primary/).length, 1, "promoted once");
  assert.equal(lines(/MEK rotation done/).length, 1, "retired once");
  // the promotion waited out the grace period: not before the promoteAfter the start logged (its
  // own log line may be written later than the start's clock reading on a busy machine)
  const line = (re: RegExp) => JSON.parse(lines(re)[0]) as { time: string; promoteAfter?: string };
  const startLine = line(/MEK rotation started/);
  assert.ok(startLine.promoteAfter, "the start names when promotion may come");
  assert.ok(
    Date.parse(line(/the new MEK is primary/).time) >= Date.parse(startLine.promoteAfter),
    `promoted after the 1 s grace (not before ${startLine.promoteAfter})`,
  );
  t.diagnostic(
    `${writes} writes, each read back through the other API; phases seen: ${[...phases].join(", ")}`,
  );
  // a restarted replica reads everything with the new key only
  await b.stop();
  const c = await startService(ctx, "api-c", apiScript, env);
  for (const [i, f] of fns.entries()) {
    const got = await call<{ values: Record<string, string> }>(
      `${c.urls.api}/v1/internal/secrets/functions/${f.fid}/versions/${f.vid}`,
      { token: compute },
    );
    assert.equal(got.body.values.BASE, `base-${i}`);
  }
  assert.ok(!a.output().includes("value-") && !c.output().includes("value-"), "no value in any log line");
}
