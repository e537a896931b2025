// Where function instances' secrets live on one machine. Shared by the compute agent, which writes
// them, and the stack, which removes them when it is stopped at once (its agent cannot).
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * The folder this agent keeps instance secrets under: `<dir>/<stack>`, where `dir` is
 * compute.secrets.dir or, when that is empty, a tmpfs folder per user (/dev/shm/callplane-<uid>,
 * else the system's temporary folder), and `<stack>` is derived from the data folder so that two
 * stacks never share one. Only this subfolder is ever cleaned.
 */
export function secretsRoot(dataDir: string, dir = ""): string {
  const user = typeof process.getuid === "function" ? String(process.getuid()) : "user";
  const base = dir || join(existsSync("/dev/shm") ? "/dev/shm" : tmpdir(), `callplane-${user}`);
  const stack = createHash("sha256").update(dataDir).digest("hex").slice(0, 12);
  return join(base, `stack-${stack}`);
}
