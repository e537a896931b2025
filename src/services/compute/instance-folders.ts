// The folders a local instance's inference server gets, outside the data folder: a working folder
// (its current folder, HOME and TMPDIR) and one output folder per concurrency slot (what the worker
// names to it as NVCF-LARGE-OUTPUT-DIR). When servers run as another user (instance-user.ts), the
// agent's folders above them are mode 0711 (that user can pass, not list) and owned by the agent,
// so that the server can write only into its own folders and never swap a folder the worker works
// in for a link; the folders it writes into are its own, mode 0700.
import { chmodSync, chownSync, lstatSync, mkdirSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { removeTreeSync } from "../../lib/fs.js";
import type { InstanceUser } from "./instance-user.js";

/** 0711 when servers run as another user (they pass through), else 0700. */
export function passMode(user: InstanceUser): number {
  return user.switched ? 0o711 : 0o700;
}

/**
 * Creates `root` and checks that it and its parent are real folders of this user, not links
 * someone else placed in a shared temporary folder, and sets their mode. Then, since no instance
 * of this agent runs yet, removes every folder under the root: leftovers of a run that was killed.
 * Returns how many. `setting` names the key that moves the root.
 */
export function prepareAgentRoot(root: string, mode: number, setting: string): number {
  mkdirSync(root, { recursive: true, mode: 0o700 });
  const uid = typeof process.getuid === "function" ? process.getuid() : undefined;
  for (const d of [dirname(root), root]) {
    const st = lstatSync(d);
    if (!st.isDirectory() || (uid !== undefined && st.uid !== uid))
      throw new Error(
        `${d} is not a folder of this user (a link, or owned by uid ${st.uid}); function instances' files will not be written there. Remove it${setting ? `, or set ${setting}` : ""}`,
      );
    chmodSync(d, mode);
  }
  const leftovers = readdirSync(root).map((e) => join(root, e));
  removeTreeSync(leftovers);
  return leftovers.length;
}

/** Makes a folder for the server: owned by its user, mode 0700. */
export function serverFolder(path: string, user: InstanceUser): void {
  mkdirSync(path, { recursive: true, mode: 0o700 });
  chmodSync(path, 0o700);
  if (user.switched) chownSync(path, user.uid, user.gid);
}

export class InstanceFolders {
  readonly dir: string;
  /** The server's working folder, HOME and TMPDIR. */
  readonly home: string;
  /** The worker's BASE_RESPONSE_DIR: slot-<k> for each concurrency slot k. */
  readonly responses: string;

  constructor(
    root: string,
    instanceId: string,
    private readonly user: InstanceUser,
  ) {
    this.dir = join(root, instanceId);
    this.home = join(this.dir, "home");
    this.responses = join(this.dir, "responses");
  }

  /** Creates the folders, with the output folders of `slots` concurrency slots (the worker's). */
  create(slots: number): void {
    for (const d of [this.dir, this.responses]) {
      mkdirSync(d, { recursive: true, mode: 0o700 });
      chmodSync(d, passMode(this.user));
    }
    serverFolder(this.home, this.user);
    for (let k = 0; k < slots; k++) serverFolder(join(this.responses, `slot-${k}`), this.user);
  }

  /** Removes them, never following a link the server (or a process it left behind) put there. */
  remove(): void {
    removeTreeSync([this.dir]);
  }
}
