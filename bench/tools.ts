// The tools the benchmarks drive that callplane does not ship (wrk, HAProxy, h2load, curl): found on
// the PATH, or installed from Debian's packages through scripts/ensure-debian-tool.sh (root with
// apt-get, as on a fresh CI machine). A tool that cannot be had is reported, never faked: the
// report prints "not measured: <tool> missing" for the rows that need it.
import { spawnSync } from "node:child_process";
import { join } from "node:path";

const ensureScript = join(import.meta.dirname, "..", "..", "scripts", "ensure-debian-tool.sh");
const haproxyScript = join(import.meta.dirname, "..", "..", "scripts", "ensure-haproxy.sh");

/** The Debian package of each tool. */
export const TOOL_PACKAGES = {
  wrk: "wrk",
  haproxy: "haproxy",
  h2load: "nghttp2-client",
  curl: "curl",
} as const;

export type Tool = keyof typeof TOOL_PACKAGES;

const found = new Map<Tool, string | Error>();

/** The tool's path, installing its package when missing and possible; an Error saying why not. */
export function ensureTool(tool: Tool): string | Error {
  const known = found.get(tool);
  if (known !== undefined) return known;
  // HAProxy is the callback proxy too: the one the stack runs (found, or fetched into .tools/)
  const r = spawnSync(
    "bash",
    tool === "haproxy" ? [haproxyScript] : [ensureScript, tool, TOOL_PACKAGES[tool]],
    {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  const out: string | Error =
    r.status === 0 && r.stdout.trim()
      ? r.stdout.trim().split("\n").at(-1)!
      : new Error(
          `${tool} missing (${(r.stderr || r.error?.message || "").trim().split("\n").at(-1) ?? ""})`.replace(
            / \(\)$/,
            "",
          ),
        );
  found.set(tool, out);
  return out;
}

/** Throws when any of the tools cannot be had, naming them and their packages. */
export function requireTools(...tools: Tool[]): void {
  const missing = tools.filter((t) => ensureTool(t) instanceof Error);
  if (missing.length)
    throw new Error(
      `not measured: ${missing.join(", ")} missing (apt-get install -y ${missing.map((t) => TOOL_PACKAGES[t]).join(" ")})`,
    );
}

/** The first line a command prints for its version (stdout or stderr), or undefined. */
export function versionOf(command: string, args: string[], pattern?: RegExp): string | undefined {
  const r = spawnSync(command, args, { encoding: "utf8", timeout: 5000 });
  if (r.error) return undefined;
  const text = `${r.stdout ?? ""}\n${r.stderr ?? ""}`;
  if (pattern) return pattern.exec(text)?.[1];
  return text
    .split("\n")
    .map((l) => l.trim())
    .find(Boolean);
}
