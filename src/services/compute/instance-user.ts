// The user local instances' inference servers run as. A function's server must not read what the
// stack keeps (the admin signing key, the MEK, the database, service tokens): when the agent runs as
// root, servers run as an unprivileged user (compute.local.runAs; by default the system user
// callplane-fn, created on first use) in folders of their own outside the data folder. An agent
// that is not root cannot switch users: its servers run as itself, and only compute.local.allowCommand
// being off (no command of the function's choosing runs) keeps them from the stack's files.
//
// Since that user is not the checkout's owner, it must still be able to read the program files
// (node, dist/, node_modules/); a checkout under a private home folder (/root, mode 0700) is not,
// and the instance fails with a message naming the folder and the fix instead of a crash.
import { execFileSync } from "node:child_process";
import { existsSync, realpathSync, statSync } from "node:fs";
import { dirname, join } from "node:path";

export const DEFAULT_INSTANCE_USER = "callplane-fn";

export interface InstanceUser {
  name: string;
  uid: number;
  gid: number;
  /** Its groups (primary and supplementary), for checking what it can read. */
  groups: number[];
  /** Whether servers run as another user than the agent (the agent is root). */
  switched: boolean;
}

function idOf(name: string, flag: "-u" | "-g" | "-G"): string | undefined {
  try {
    return execFileSync("id", [flag, "--", name], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "ignore"],
    }).trim();
  } catch {
    return undefined;
  }
}

function lookup(name: string): InstanceUser | undefined {
  const uid = idOf(name, "-u");
  const gid = idOf(name, "-g");
  if (uid === undefined || gid === undefined) return undefined;
  const groups = (idOf(name, "-G") ?? gid).split(/\s+/).map(Number);
  return { name, uid: Number(uid), gid: Number(gid), groups, switched: true };
}

function createSystemUser(name: string): void {
  const shell = ["/usr/sbin/nologin", "/sbin/nologin"].find((s) => existsSync(s)) ?? "/bin/false";
  try {
    execFileSync("useradd", ["--system", "--no-create-home", "--shell", shell, name], {
      stdio: ["ignore", "ignore", "pipe"],
    });
  } catch (err) {
    // another agent on this machine may have created it at the same moment
    if (lookup(name)) return;
    const why = ((err as { stderr?: Buffer }).stderr?.toString() || (err as Error).message).trim();
    throw new Error(
      `cannot create the system user ${name} that function instances run as (useradd: ${why}); create it (useradd --system --no-create-home --shell ${shell} ${name}), or set compute.local.runAs to an existing unprivileged user`,
    );
  }
}

/** Resolves compute.local.runAs (creating the default user when missing); throws what to fix. */
export function resolveInstanceUser(setting: string): InstanceUser {
  const self = typeof process.getuid === "function" ? process.getuid() : undefined;
  if (self !== 0) {
    const own = { uid: self ?? -1, gid: process.getgid?.() ?? -1 };
    if (setting !== "" && lookup(setting)?.uid !== own.uid)
      throw new Error(
        `compute.local.runAs is ${setting}, but the compute agent runs as uid ${own.uid}, not root, and cannot start processes as another user; leave compute.local.runAs empty, or run the stack as root`,
      );
    return { name: setting || String(own.uid), ...own, groups: [own.gid], switched: false };
  }
  const name = setting || DEFAULT_INSTANCE_USER;
  let user = lookup(name);
  if (!user && setting === "") {
    createSystemUser(name);
    user = lookup(name);
  }
  if (!user)
    throw new Error(
      `compute.local.runAs names the user ${name}, which does not exist on this machine; create it, or leave the key empty for the system user ${DEFAULT_INSTANCE_USER}`,
    );
  if (user.uid === 0)
    throw new Error(
      `compute.local.runAs is ${name}, which is root (uid 0): function instances would read the stack's keys; name an unprivileged user, or leave the key empty`,
    );
  return user;
}

function allows(user: InstanceUser, st: { uid: number; gid: number; mode: number }, bits: number): boolean {
  const shift = st.uid === user.uid ? 6 : user.groups.includes(st.gid) ? 3 : 0;
  return ((st.mode >> shift) & bits) === bits;
}

/**
 * Why `user` cannot use `path` (read it, and for a folder or a program also enter or run it), or
 * undefined when it can: the first folder on the way that stops it, by its mode bits (ACLs are not
 * read).
 */
export function accessProblem(user: InstanceUser, path: string, what: "read" | "run"): string | undefined {
  if (!user.switched) return undefined;
  let real: string;
  try {
    real = realpathSync(path);
  } catch (err) {
    return `${path} cannot be found (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`;
  }
  const folders: string[] = [];
  for (let d = dirname(real); ; d = dirname(d)) {
    folders.unshift(d);
    if (d === dirname(d)) break;
  }
  const mode = (m: number) => `0${(m & 0o777).toString(8)}`;
  for (const d of folders) {
    const st = statSync(d);
    if (!allows(user, st, 0o1))
      return `${d} (mode ${mode(st.mode)}, owner uid ${st.uid}) does not let ${user.name} through to ${real}`;
  }
  const st = statSync(real);
  const bits = st.isDirectory() || what === "run" ? 0o5 : 0o4;
  if (!allows(user, st, bits))
    return `${real} (mode ${mode(st.mode)}, owner uid ${st.uid}) cannot be ${what === "run" ? "run" : "read"} by ${user.name}`;
  return undefined;
}

/**
 * What every local instance needs to read: node, the built tree (dist/, where the example servers
 * and the worker agent are) and the installed packages beside it. A message naming the fix, or
 * undefined.
 */
export function programFilesProblem(user: InstanceUser, distRoot: string): string | undefined {
  if (!user.switched) return undefined;
  const nodeModules = join(distRoot, "..", "node_modules");
  const needs: Array<[string, "read" | "run"]> = [
    [process.execPath, "run"],
    [distRoot, "read"],
    ...(existsSync(nodeModules) ? [[nodeModules, "read"] as [string, "read"]] : []),
  ];
  for (const [path, what] of needs) {
    const problem = accessProblem(user, path, what);
    if (problem)
      return `function instances run as the user ${user.name}, which cannot use the program files: ${problem}. Put the checkout where other users can read it (for example under /opt, not a private home folder such as /root), make that folder readable (chmod o+rx), or set compute.local.runAs to a user that can read it`;
  }
  return undefined;
}
