// Process helpers for tests that start whole trees of processes: find what a process started (from
// /proc, with the same walk the stack uses to stop its own tree), and undo in reverse order.
import { readFileSync } from "node:fs";
import type { TestContext } from "node:test";
import { descendantPids, processCommandLine } from "../../src/stack/preflight.js";

/** A live process that is not a zombie. */
export function running(pid: number | undefined): boolean {
  if (pid === undefined) return false;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2)[0];
    return state !== "Z" && state !== "X";
  } catch {
    return false;
  }
}

/** Every live process below `root` (children, grandchildren ...). */
export function descendants(root: number): number[] {
  return descendantPids(root).filter(running);
}

export function cmdline(pid: number): string {
  return processCommandLine(pid) ?? "";
}

/**
 * A context whose `after` hooks run in reverse order of registration (node:test runs them in
 * order), so that what was started last stops first: processes before the folders they use.
 */
export function lifo(t: TestContext): Pick<TestContext, "after"> {
  const undo: Array<() => unknown> = [];
  t.after(async () => {
    for (const f of undo.reverse()) await f();
  });
  return {
    after: (fn) => {
      if (fn) undo.push(fn as unknown as () => unknown);
    },
  };
}
