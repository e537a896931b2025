// A real PostgreSQL server for tests: Debian's postgresql package (installed by
// scripts/ensure-postgres.sh when missing), a fresh cluster made with initdb in a temporary folder,
// listening on a random loopback port, with trust authentication for local test connections. As
// root, the server runs as the `postgres` user (PostgreSQL refuses to run as root). Stopped and
// removed in t.after.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { chownSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import pg from "pg";
import { freePort } from "./plane.js";
import { repoRoot } from "./paths.js";
import { removeDir } from "./scope.js";

type Ctx = Pick<TestContext, "after">;

let binDir: string | undefined;

function serverBin(): string {
  if (binDir) return binDir;
  const r = spawnSync("bash", [join(repoRoot, "scripts", "ensure-postgres.sh")], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`no PostgreSQL server for the tests: ${r.stderr.trim()}`);
  binDir = r.stdout.trim().split("\n").pop()!;
  return binDir;
}

/**
 * As root, the uid and gid of the `postgres` user to run the server programs as (given to spawn
 * itself, not through runuser or su: those do not pass signals on, and a server that never sees its
 * SIGINT lingers until it notices its folder is gone).
 */
function serverUser(): { uid: number; gid: number } | Record<string, never> {
  if (process.getuid?.() !== 0) return {};
  const id = (flag: string) =>
    Number(spawnSync("id", [flag, "postgres"], { encoding: "utf8" }).stdout.trim());
  return { uid: id("-u"), gid: id("-g") };
}

export interface Postgres {
  /** postgres://postgres@127.0.0.1:<port>/postgres */
  adminUrl: string;
  port: number;
  process: ChildProcess;
  /** Creates an empty database and returns its URL. */
  createDatabase(name: string): Promise<string>;
  stop(): Promise<void>;
}

export async function startPostgres(t: Ctx): Promise<Postgres> {
  const bin = serverBin();
  const dir = mkdtempSync(join(tmpdir(), "callplane-pg-"));
  const user = serverUser();
  if ("uid" in user) chownSync(dir, user.uid, user.gid);
  const data = join(dir, "data");
  const r = spawnSync(
    join(bin, "initdb"),
    ["-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"],
    { encoding: "utf8", ...user },
  );
  if (r.status !== 0) throw new Error(`initdb failed: ${r.stderr}`);
  const port = await freePort("127.0.0.1");
  // fsync off: a test cluster is thrown away; crash-safety of the database is not under test
  const child = spawn(
    join(bin, "postgres"),
    [
      "-D",
      data,
      "-p",
      String(port),
      "-h",
      "127.0.0.1",
      "-k",
      dir,
      "-c",
      "fsync=off",
      "-c",
      "max_connections=200",
    ],
    { stdio: ["ignore", "ignore", "pipe"], ...user },
  );
  let stderr = "";
  child.stderr.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-8192)));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((res) => child.once("exit", res));
      // SIGINT: PostgreSQL's fast shutdown (disconnects clients, no waiting for them)
      child.kill("SIGINT");
      const k = setTimeout(() => child.kill("SIGKILL"), 5000);
      await exited;
      clearTimeout(k);
    }
    removeDir(dir);
  };
  t.after(stop);
  const adminUrl = `postgres://postgres@127.0.0.1:${port}/postgres`;
  for (let i = 0; ; i++) {
    const c = new pg.Client({ connectionString: adminUrl });
    try {
      await c.connect();
      await c.end();
      break;
    } catch {
      await c.end().catch(() => undefined);
      if (child.exitCode !== null || i > 300) throw new Error(`PostgreSQL did not start: ${stderr}`);
      await sleep(50);
    }
  }
  return {
    adminUrl,
    port,
    process: child,
    async createDatabase(name) {
      const c = new pg.Client({ connectionString: adminUrl });
      await c.connect();
      try {
        await c.query(`CREATE DATABASE "${name.replace(/"/g, "")}"`);
      } finally {
        await c.end();
      }
      return `postgres://postgres@127.0.0.1:${port}/${name}`;
    },
    stop,
  };
}
