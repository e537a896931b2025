// The README's two commands run through here: `npm start` and `npm test` (and `npm run bench`).
// This file has no dependencies, so it can run on a fresh clone: it installs npm packages when the
// lockfile changed, builds the TypeScript, finds or installs nats-server 2.10+ (and, for the tests,
// Python's grpcio, kube-apiserver with etcd, and Debian's chromium), then hands over.
import { spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join, dirname, relative } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const [command = "start", ...rest] = process.argv.slice(2);
const quiet = command === "start";

function step(what) {
  if (!quiet || process.env.CALLPLANE_VERBOSE) console.error(`[callplane] ${what}`);
}

function run(cmd, args, opts = {}) {
  const started = performance.now();
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
  // CI's log says where its time went (scripts/test-times.mjs breaks the test run down by file)
  if (opts.timed) step(`${opts.what}: ${((performance.now() - started) / 1000).toFixed(1)} s`);
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

// tsc never deletes what it once wrote: a source moved or removed would leave its old .js in dist/,
// and a stale test there would still run. Every output without its source goes.
function pruneDist() {
  const walk = (dir, src) => {
    if (!existsSync(dir)) return;
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) {
        walk(p, join(src, e.name));
        if (readdirSync(p).length === 0) rmSync(p, { recursive: true });
        continue;
      }
      const m = /^(.*)\.js(\.map)?$/.exec(e.name);
      if (m && !existsSync(join(src, `${m[1]}.ts`))) rmSync(p);
    }
  };
  for (const d of ["src", "test", "examples", "bench"]) walk(join(root, "dist", d), join(root, d));
}

function ensureBuild() {
  pruneDist();
  const info = join(root, "dist", ".tsbuildinfo");
  const sources = ["src", "test", "examples", "bench"].filter((d) => existsSync(join(root, d)));
  const newest = Math.max(
    statSync(join(root, "tsconfig.json")).mtimeMs,
    ...sources.map((d) => newestMtime(join(root, d))),
  );
  if (existsSync(info) && statSync(info).mtimeMs >= newest) return;
  step("building (tsc) ...");
  run(join(root, "node_modules", ".bin", "tsc"), ["-p", "tsconfig.json"], {
    what: "TypeScript build",
    timed: true,
  });
}

function ensureNatsServer() {
  const out = run("bash", [join(root, "scripts", "ensure-nats-server.sh")], {
    capture: true,
    what: "finding nats-server",
  });
  const path = out.trim().split("\n").pop();
  process.env.CALLPLANE_NATS_SERVER = path;
  ensureHaproxy();
  return path;
}

// HAProxy is the worker callback proxy: found, or Debian's package fetched into .tools/haproxy/.
function ensureHaproxy() {
  const out = run("bash", [join(root, "scripts", "ensure-haproxy.sh")], {
    capture: true,
    what: "finding haproxy",
  });
  process.env.CALLPLANE_HAPROXY = out.trim().split("\n").pop();
}

// The kubernetes compute backend's tests run a real kube-apiserver (and kube-controller-manager) with
// etcd: found, or built once per machine from Debian's source into a cache outside the clone.
function ensureKubernetes() {
  const out = run("bash", [join(root, "scripts", "ensure-kubernetes.sh")], {
    capture: true,
    what: "finding (or building) kube-apiserver and etcd",
    timed: true,
  });
  const [bin, etcd] = out.trim().split("\n").slice(-2);
  process.env.CALLPLANE_KUBE_BIN = bin;
  process.env.CALLPLANE_ETCD = etcd;
}

// The console's browser tests drive Debian's chromium with playwright-core: found at /usr/bin/chromium
// at the major playwright-core expects, or installed (upgraded) with apt-get.
function ensureChromium() {
  run("bash", [join(root, "scripts", "ensure-chromium.sh")], { what: "installing chromium" });
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

// The test tiers, as folders of dist/: unit tests need no stack (beside the code in src/, and
// test/unit/); integration suites start real services, one folder per service; end-to-end suites
// start the whole plane as processes, across networks, or a NATS cluster. The fault suite's small
// profile (test/e2e/faults.test.ts) runs alone, after the others: it puts the machine under load and
// times what it sees.
const TIERS = {
  unit: ["dist/src", "dist/test/unit"],
  integration: ["dist/test/integration"],
  e2e: ["dist/test/e2e"],
};
const FAULTS = join("dist", "test", "e2e", "faults.test.js");

// Files known to run longest (per-file times from scripts/test-times.mjs, longest first), started
// first: node --test starts files in the order given, and a long file started last runs alone at
// the end while the other slot sits idle. A run's recorded times (dist/.test-times.json) order the
// files they cover.
const SLOW_FIRST = [
  "e2e/stack.test.js",
  "integration/cli/cli.test.js",
  "e2e/two-networks.test.js",
  "integration/invocation/invocation.test.js",
  "e2e/two-networks-grpc.test.js",
  "e2e/processes.test.js",
  "e2e/console.test.js",
  "integration/grpc-proxy/grpc.test.js",
  "e2e/nats-cluster-failover.test.js",
  "integration/secrets/secrets-cli.test.js",
  "integration/compute/compute.test.js",
  "integration/invocation/relay.test.js",
  "integration/invocation/data-path.test.js",
  "integration/secrets/secrets-rotation.test.js",
  "integration/admin-issuer/issuer-withdrawal.test.js",
  "integration/callback-proxy/tls-reload.test.js",
  "integration/worker-trust/worker-identity.test.js",
];

function testFiles(dirs) {
  const found = [];
  const walk = (dir) => {
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith(".test.js")) found.push(relative(root, p));
    }
  };
  for (const d of dirs) if (existsSync(join(root, d))) walk(join(root, d));
  return found.sort();
}

/** Longest first: by the last recorded run's times; a file not recorded by SLOW_FIRST, ahead of them. */
function slowFirst(files) {
  let times = {};
  try {
    times = JSON.parse(readFileSync(join(root, "dist", ".test-times.json"), "utf8"));
  } catch {
    // no run recorded yet (a clean clone): the fixed list alone
  }
  const weight = (f) => {
    if (times[f] !== undefined) return times[f];
    const i = SLOW_FIRST.findIndex((s) => f.endsWith(s));
    return i < 0 ? 0 : Number.MAX_SAFE_INTEGER - i;
  };
  return [...files].sort((a, b) => weight(b) - weight(a) || a.localeCompare(b));
}

function runChecks() {
  const bin = (name) => join(root, "node_modules", ".bin", name);
  step("lint (eslint) ...");
  run(bin("eslint"), ["."], { what: "lint", timed: true });
  step("format check (prettier) ...");
  run(bin("prettier"), ["--check", "--log-level=warn", "."], {
    what: "format check (run `npm run format`)",
    timed: true,
  });
  step("generated code check (protobuf) ...");
  if (existsSync(join(root, "scripts", "check-proto.mjs")))
    run(process.execPath, [join(root, "scripts", "check-proto.mjs")], {
      what: "protobuf check",
      timed: true,
    });
}

function runTests(tiers, filter) {
  const chosen = testFiles(tiers.flatMap((t) => TIERS[t])).filter(
    (f) => filter.length === 0 || filter.some((x) => f.includes(x)),
  );
  if (chosen.length === 0) {
    console.error(
      `[callplane] no test file of the ${tiers.join(", ")} tier${tiers.length > 1 ? "s" : ""} has a path containing ${filter.map((x) => JSON.stringify(x)).join(" or ")}; ` +
        "name part of a test file's path, e.g. `npm run test:integration -- invocation/` or `npm run test:unit -- render`",
    );
    process.exit(2);
  }
  const alone = chosen.filter((f) => f === FAULTS);
  const files = slowFirst(chosen.filter((f) => f !== FAULTS));
  // three at once on two cores: most test time is waiting on the processes a test starts, and a
  // third file filled it (a CI run's tests took 0.8x the time of two at once, on the same machine)
  const concurrency = process.env.CALLPLANE_TEST_CONCURRENCY ?? "3";
  // the spec reporter, and at the end each file's time (written down for the next run's order)
  const reporters = [
    "--test-reporter=spec",
    "--test-reporter-destination=stdout",
    `--test-reporter=${join(root, "scripts", "test-times.mjs")}`,
    "--test-reporter-destination=stdout",
  ];
  if (files.length) {
    step(`node --test (${tiers.join(", ")}: ${files.length} files) ...`);
    run(process.execPath, ["--test", `--test-concurrency=${concurrency}`, ...reporters, ...files], {
      what: "tests",
      timed: true,
    });
  }
  if (alone.length) {
    step("node --test (the fault suite, small profile) ...");
    run(process.execPath, ["--test", "--test-reporter=spec", ...alone], { what: "fault suite", timed: true });
  }
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
    // everything, as CI runs it: the checks, every tier, then the fault suite's small profile
    ensureNatsServer();
    // the gRPC tests call grpc-proxy with Python's grpcio as well (Debian's python3-grpcio)
    run("bash", [join(root, "scripts", "ensure-python-grpcio.sh")], { what: "installing python3-grpcio" });
    ensureKubernetes();
    ensureChromium();
    runChecks();
    runTests(["unit", "integration", "e2e"], rest);
    break;
  }
  case "unit": {
    // the quick loop: no stack (render's check runs `nats-server -t`, so it is found or fetched)
    ensureNatsServer();
    runTests(["unit"], rest);
    break;
  }
  case "integration":
  case "e2e": {
    ensureNatsServer();
    run("bash", [join(root, "scripts", "ensure-python-grpcio.sh")], { what: "installing python3-grpcio" });
    ensureKubernetes();
    if (command === "e2e") ensureChromium();
    runTests([command], rest);
    break;
  }
  case "faults": {
    ensureNatsServer();
    run("bash", [join(root, "scripts", "ensure-python-grpcio.sh")], { what: "installing python3-grpcio" });
    exec(process.execPath, [join(root, "dist", "test", "e2e", "faults", "run.js"), ...rest]);
    break;
  }
  case "bench": {
    ensureNatsServer();
    ensureKubernetes();
    exec(process.execPath, [join(root, "dist", "bench", "run.js"), ...rest]);
    break;
  }
  default:
    console.error(`unknown command ${command}; use start, test, unit, integration, e2e, faults or bench`);
    process.exit(2);
}
