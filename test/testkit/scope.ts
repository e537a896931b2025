// Cleanup for tests: temporary folders removed when the test ends, and a Scope whose hooks run
// last-registered-first, so what was started last stops first (processes before the folders and
// servers they use).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";

type Ctx = Pick<TestContext, "after">;
type Hook = NonNullable<Parameters<TestContext["after"]>[0]>;

/** Removes a folder; never throws (a failing after-hook would skip the hooks after it). */
export function removeDir(dir: string): void {
  try {
    rmSync(dir, { recursive: true, force: true, maxRetries: 5, retryDelay: 50 });
  } catch {
    // a process that has not let go yet; the OS cleans tmp eventually
  }
}

/**
 * A temporary folder removed when the test ends. node:test runs after-hooks in the order they were
 * added, so a helper that starts a process writing into its folder must add the folder's removal
 * after the process's stop (see startNats).
 */
export function tmpDir(t: Ctx, prefix = "callplane-test-"): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  t.after(() => removeDir(dir));
  return dir;
}

/**
 * Cleanups that run last-registered-first (node:test runs t.after hooks in registration order):
 * every hook runs, and close() rejects with the first error. Stands in for a test's `t.after`
 * where there is no test (the fault suite runs as its own program).
 */
export class Scope implements Ctx {
  private hooks: Hook[] = [];
  after: Ctx["after"] = (fn) => void (fn && this.hooks.push(fn));
  async close(t?: TestContext): Promise<void> {
    let failed: { err: unknown } | undefined;
    for (const h of this.hooks.reverse()) {
      try {
        await h(t as TestContext, () => undefined);
      } catch (err) {
        failed ??= { err };
      }
    }
    this.hooks = [];
    if (failed) throw failed.err;
  }
}

/** A Scope closed inside one t.after of the test: its hooks run in reverse, the first error fails the test. */
export function reverseScope(t: Ctx): Ctx {
  const scope = new Scope();
  t.after((tc) => scope.close(tc));
  return scope;
}
