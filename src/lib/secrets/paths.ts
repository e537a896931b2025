// Where function instances' files live on one machine, outside the data folder: their secrets
// (in memory) and their working folders. Shared by the compute agent, which writes them, and the
// stack, which removes them when it is stopped at once (its agent cannot).
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const userPart = () => (typeof process.getuid === "function" ? String(process.getuid()) : "user");

/** `stack-<hash of the data folder>`, so that two stacks on one machine never share a folder. */
function stackPart(dataDir: string): string {
  return `stack-${createHash("sha256").update(dataDir).digest("hex").slice(0, 12)}`;
}

/**
 * The folder this agent keeps instance secrets under: `<dir>/<stack>`, where `dir` is
 * compute.secrets.dir or, when that is empty, a tmpfs folder per user (/dev/shm/callplane-<uid>,
 * else the system's temporary folder), and `<stack>` is derived from the data folder so that two
 * stacks never share one. Only this subfolder is ever cleaned.
 */
export function secretsRoot(dataDir: string, dir = ""): string {
  const base = dir || join(existsSync("/dev/shm") ? "/dev/shm" : tmpdir(), `callplane-${userPart()}`);
  return join(base, stackPart(dataDir));
}

/**
 * The folder under which each local instance gets its working folder and its output folders:
 * `<system temporary folder>/callplane-<uid>-instances/<stack>`, outside the data folder (whose
 * keys, MEK and database an instance must never reach). Only this subfolder is ever cleaned.
 */
export function instancesRoot(dataDir: string): string {
  return join(tmpdir(), `callplane-${userPart()}-instances`, stackPart(dataDir));
}
