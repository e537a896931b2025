// The README's two commands run through here: `npm start` and `npm test` (and `npm run bench`).
// This file has no dependencies, so it can run on a fresh clone: it installs npm packages when the
// lockfile changed, builds the TypeScript, finds or installs nats-server 2.10+ (and, for the tests,
// Python's grpcio), then hands over.
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const [command = "start", ...rest] = process.argv.slice(2);
const quiet = command === "start";

function step(what) {
  if (!quiet || process.env.CALLPLANE_VERBOSE) console.error(`[callplane] ${what}`);
}

function run(cmd, args, opts = {}) {
  const r = spawnSync(cmd, args, {
    cwd: root,
    stdio: opts.capture ? ["ignore", "pipe", "inherit"] : "inherit",
    encoding: "utf8",
    env: opts.env ?? process.env,
  });
  if (r.error) throw r.error;
  if (r.status !== 0) {
    console.error(
      `[callplane] ${opts.what ?? `${cmd} ${args.join(" ")}`} failed (exit ${r.status ?? r.signal})`,
    );
    process.exit(r.status ?? 1);
  }
  return r.stdout;
}

function ensureDependencies() {
  const lock = readFileSync(join(root, "package-lock.json"));
  const want = createHash("sha256").update(lock).digest("hex");
  const stamp = join(root, "node_modules", ".callplane-deps");
  if (existsSync(stamp) && readFileSync(stamp, "utf8") === want) return;
  console.error(
    "[callplane] installing npm packages (first run; building better-sqlite3 can take a minute) ...",
  );
  run("npm", ["ci", "--no-audit", "--no-fund", "--loglevel=error"], { what: "npm ci" });
  writeFileSync(stamp, want);
}

function newestMtime(dir) {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestMtime(p) : statSync(p).mtimeMs);
  }
  return newest;
}

function ensureBuild() {
  const info = join(root, "dist", ".tsbuildinfo");
  const sources = ["src", "test", "examples", "bench"].filter((d) => existsSync(join(root, d)));
  const newest = Math.max(
    statSync(join(root, "tsconfig.json")).mtimeMs,
    ...sources.map((d) => newestMtime(join(root, d))),
  );
  if (existsSync(info) && statSync(info).mtimeMs >= newest) return;
  step("building (tsc) ...");
  run(join(root, "node_modules", ".bin", "tsc"), ["-p", "tsconfig.json"], { what: "TypeScript build" });
}

function ensureNatsServer() {
  const out = run("bash", [join(root, "scripts", "ensure-nats-server.sh")], {
    capture: true,
    what: "finding nats-server",
  });
  const path = out.trim().split("\n").pop();
  process.env.CALLPLANE_NATS_SERVER = path;
  return path;
}

function exec(cmd, args) {
  // Ctrl-C reaches the whole foreground process group; the child handles it and we report its exit.
  const child = spawn(cmd, args, { cwd: process.cwd(), stdio: "inherit", env: process.env });
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) {
    process.on(sig, () => {
      if (sig !== "SIGINT") child.kill(sig);
    });
  }
  child.on("exit", (code, signal) => process.exit(code ?? (signal ? 128 + 1 : 1)));
}

function testFiles() {
  const found = [];
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith(".test.js")) found.push(p);
    }
  };
  for (const d of ["dist/src", "dist/test"]) if (existsSync(join(root, d))) walk(join(root, d));
  return found.sort();
}

ensureDependencies();
ensureBuild();
switch (command) {
  case "start": {
    ensureNatsServer();
    exec(process.execPath, [join(root, "dist", "src", "stack", "main.js"), ...rest]);
    break;
  }
  case "test": {
    ensureNatsServer();
    // the gRPC tests call grpc-proxy with Python's grpcio as well (Debian's python3-grpcio)
    run("bash", [join(root, "scripts", "ensure-python-grpcio.sh")], { what: "installing python3-grpcio" });
    const bin = (name) => join(root, "node_modules", ".bin", name);
    step("lint (eslint) ...");
    run(bin("eslint"), ["."], { what: "lint" });
    step("format check (prettier) ...");
    run(bin("prettier"), ["--check", "--log-level=warn", "."], {
      what: "format check (run `npm run format`)",
    });
    step("generated code check (protobuf) ...");
    if (existsSync(join(root, "scripts", "check-proto.mjs")))
      run(process.execPath, [join(root, "scripts", "check-proto.mjs")], { what: "protobuf check" });
    const filter = rest.length > 0 ? rest : null;
    const chosen = testFiles().filter((f) => !filter || filter.some((x) => f.includes(x)));
    // the fault suite's small profile puts the machine under load and times what it sees: it runs
    // alone, after the others
    const alone = chosen.filter((f) => f.endsWith(join("test", "faults.test.js")));
    const files = chosen.filter((f) => !alone.includes(f));
    const concurrency = process.env.CALLPLANE_TEST_CONCURRENCY ?? "2";
    if (files.length) {
      step(`node --test (${files.length} files) ...`);
      run(
        process.execPath,
        ["--test", `--test-concurrency=${concurrency}`, "--test-reporter=spec", ...files],
        {
          what: "tests",
        },
      );
    }
    if (alone.length) {
      step("node --test (the fault suite, small profile) ...");
      run(process.execPath, ["--test", "--test-reporter=spec", ...alone], { what: "fault suite" });
    }
    break;
  }
  case "faults": {
    ensureNatsServer();
    run("bash", [join(root, "scripts", "ensure-python-grpcio.sh")], { what: "installing python3-grpcio" });
    exec(process.execPath, [join(root, "dist", "test", "faults", "run.js"), ...rest]);
    break;
  }
  case "bench": {
    ensureNatsServer();
    exec(process.execPath, [join(root, "dist", "bench", "run.js"), ...rest]);
    break;
  }
  default:
    console.error(`unknown command ${command}; use start, test, faults or bench`);
    process.exit(2);
}
