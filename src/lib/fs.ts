// Files written so that a reader never sees half of one, and folders removed without following links.
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

/** Writes a file atomically (temporary file, then rename) with the given mode. */
export function writeFileAtomic(path: string, data: string, mode = 0o600): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  const tmp = `${path}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`;
  writeFileSync(tmp, data, { mode });
  chmodSync(tmp, mode);
  renameSync(tmp, path);
}

/** Whose rights a removal runs with: a user and group id (the process's own when absent). */
export interface RemoveAs {
  uid: number;
  gid: number;
}

function rmArgs(paths: readonly string[]): string[] {
  return ["-rf", "--one-file-system", "--", ...paths];
}

/**
 * Removes folders another, less trusted user can write into (a function instance's), without
 * following a link swapped in during the removal: fs.rm checks each entry and then opens it by
 * name, and a process of that user could put a link to the stack's keys in between. GNU rm walks
 * by open folder handles and never follows links; with `as`, it also runs with that user's rights
 * only. Falls back to fs.rm where there is no rm program.
 */
export function removeTreeSync(paths: readonly string[], as?: RemoveAs): void {
  if (!paths.length) return;
  const r = spawnSync("rm", rmArgs(paths), { stdio: "ignore", ...(as ?? {}) });
  if (r.error && (r.error as NodeJS.ErrnoException).code === "ENOENT")
    for (const p of paths) rmSync(p, { recursive: true, force: true });
}

/** removeTreeSync without blocking: for the worker, which removes a request's outputs. */
export function removeTree(paths: readonly string[], as?: RemoveAs): Promise<void> {
  if (!paths.length) return Promise.resolve();
  return new Promise((resolve) => {
    const child = spawn("rm", rmArgs(paths), { stdio: "ignore", ...(as ?? {}) });
    child.once("error", (err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") for (const p of paths) rmSync(p, { recursive: true, force: true });
      resolve();
    });
    child.once("exit", () => resolve());
  });
}
