// NVCF-LARGE-OUTPUT-DIR for a request: a folder per concurrency slot, made once and watched with
// inotify (fs.watch). A request that writes nothing there costs no file-system calls (creating and
// removing a folder per request cost a fifth of the worker's CPU), a progress file is noticed as
// soon as it is written, and a folder is emptied only when something was written into it.
import { watch, type FSWatcher } from "node:fs";
import { lstat, mkdir, readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { removeTree } from "../../lib/fs.js";

export class OutputSlot {
  private dirty = true;
  private watcher: FSWatcher | undefined;
  /** Called on every change in the folder while a request holds the slot. */
  onChange: (() => void) | undefined;

  private constructor(readonly dir: string) {}

  static async create(dir: string): Promise<OutputSlot> {
    await mkdir(dir, { recursive: true });
    const slot = new OutputSlot(dir);
    slot.watcher = watch(dir, { persistent: false }, () => {
      slot.dirty = true;
      slot.onChange?.();
    });
    slot.watcher.on("error", () => {
      // without a watcher, treat the folder as always dirty: correct, only slower
      slot.watcher = undefined;
    });
    await slot.reset();
    return slot;
  }

  /** True while the watcher works; without it callers must poll. */
  get watched(): boolean {
    return this.watcher !== undefined;
  }

  /** Empties the folder if anything was written since the last reset. */
  async reset(): Promise<void> {
    this.onChange = undefined;
    if (!this.dirty && this.watcher) return;
    const entries = (await readdir(this.dir)).map((e) => join(this.dir, e));
    // a folder of another user's (the compute agent gives it to the inference server's user) is
    // emptied with that user's rights only, so that a link swapped in leads nowhere it could not go
    const owner = await lstat(this.dir);
    if (owner.uid !== process.getuid?.()) await removeTree(entries, { uid: owner.uid, gid: owner.gid });
    else await Promise.all(entries.map((e) => rm(e, { recursive: true, force: true })));
    this.dirty = false;
  }

  close(): void {
    this.watcher?.close();
    this.watcher = undefined;
  }
}
