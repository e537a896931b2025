// Regenerates the protobuf TypeScript into a scratch folder and fails when it differs from the
// committed src/gen/, so generated code cannot drift from proto/.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";

const root = join(import.meta.dirname, "..");
const scratch = mkdtempSync(join(tmpdir(), "callplane-proto-"));
try {
  const r = spawnSync(join(root, "node_modules", ".bin", "buf"), ["generate", "--output", scratch], {
    cwd: root,
    encoding: "utf8",
    env: { ...process.env, PATH: `${join(root, "node_modules", ".bin")}:${process.env.PATH}` },
  });
  if (r.status !== 0) {
    console.error(`buf generate failed:\n${r.stderr}`);
    process.exit(1);
  }
  const list = (dir) =>
    readdirSync(dir, { recursive: true, withFileTypes: true })
      .filter((e) => e.isFile())
      .map((e) => relative(dir, join(e.parentPath ?? e.path, e.name)))
      .sort();
  const want = list(join(scratch, "src", "gen"));
  const have = list(join(root, "src", "gen"));
  const problems = [];
  for (const f of new Set([...want, ...have])) {
    if (!want.includes(f)) problems.push(`src/gen/${f} has no source in proto/ (delete it)`);
    else if (!have.includes(f)) problems.push(`src/gen/${f} is missing`);
    else if (
      readFileSync(join(scratch, "src", "gen", f), "utf8") !==
      readFileSync(join(root, "src", "gen", f), "utf8")
    )
      problems.push(`src/gen/${f} differs from what proto/ generates`);
  }
  if (problems.length) {
    console.error(
      `generated protobuf code is stale:\n  ${problems.join("\n  ")}\nrun \`npm run proto:gen\` and commit the result`,
    );
    process.exit(1);
  }
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
