// The built `callplane` command, run as a child process.
import { spawn } from "node:child_process";
import { join } from "node:path";
import { distRoot, repoRoot } from "./paths.js";

/** Variables from the developer's shell that would change what the CLI does: unset for a test's CLI run. */
export const CLI_CLEAN_ENV: NodeJS.ProcessEnv = {
  CALLPLANE_TOKEN: undefined,
  CALLPLANE_API_URL: undefined,
  CALLPLANE_ISSUER_URL: undefined,
  CALLPLANE_INVOCATION_URL: undefined,
  CALLPLANE_API_KEY: undefined,
  CALLPLANE_CLI_CONFIG: undefined,
  CALLPLANE__GLOBAL__DATA_DIR: undefined,
  CALLPLANE_OPERATOR_CREDENTIAL_FILE: undefined,
};

/** Runs the built CLI as a child process and returns its exit code and output. */
export function runCli(
  args: string[],
  opts: { env?: NodeJS.ProcessEnv; cwd?: string; input?: string } = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(distRoot, "src", "cli", "main.js"), ...args], {
      cwd: opts.cwd ?? repoRoot,
      env: { ...process.env, ...opts.env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(opts.input ?? "");
  });
}
