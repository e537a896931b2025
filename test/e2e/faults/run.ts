// The fault suite's runner: starts the fault plane once, runs each case in turn, prints one line
// per case with its counts, and a table at the end.
//
//   npm run test:faults [-- --profile small|full] [--only name,name] [--markdown FILE] [--evidence DIR]
//
// A failed case leaves every service's recent output in DIR/<case>/ (default faults-evidence/).
//
// The full profile (the default here) restarts every replica, rotates certificates ten times and
// asserts the latency criterion; CI runs the small one (test/e2e/faults.test.ts) inside its time.
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { netnsSupport } from "../../testkit/netns.js";
import { CASES, PROFILES, type CaseOutcome, type FaultCase, type ProfileName } from "./cases.js";
import { describe } from "./load.js";
import { startFaultPlane } from "./plane.js";

/** A command line the suite cannot run: said in one line, without a stack. */
class UsageError extends Error {}

/** A case that runs longer has hung somewhere (each of its steps has its own, shorter bound). */
const CASE_TIMEOUT_MS = 600_000;

export interface CaseReport extends CaseOutcome {
  name: string;
  criterion: string;
  passed: boolean;
  seconds: number;
}

export async function runSuite(
  profileName: ProfileName,
  opts: { only?: string[]; log?: (line: string) => void; evidenceDir?: string } = {},
): Promise<CaseReport[]> {
  const log = opts.log ?? ((l: string) => console.log(l));
  const unknown = (opts.only ?? []).filter((n) => !CASES.some((c) => c.name === n));
  if (unknown.length)
    throw new UsageError(
      `no fault case named ${unknown.join(", ")}; the cases: ${CASES.map((c) => c.name).join(", ")}`,
    );
  const profile = PROFILES[profileName];
  const cases: FaultCase[] = opts.only?.length ? CASES.filter((c) => opts.only!.includes(c.name)) : CASES;
  const t0 = Date.now();
  const plane = await startFaultPlane();
  log(`# fault plane up in ${((Date.now() - t0) / 1000).toFixed(1)} s (profile ${profile.name})`);
  const reports: CaseReport[] = [];
  try {
    for (const c of cases) {
      const started = Date.now();
      let outcome: CaseOutcome;
      try {
        let timer: NodeJS.Timeout | undefined;
        outcome = await Promise.race([
          c.run({ plane, profile, log: (m) => log(`  ${c.name}: ${m}`) }),
          new Promise<never>((_, reject) => {
            timer = setTimeout(
              () => reject(new Error(`the case did not finish within ${CASE_TIMEOUT_MS / 1000} s`)),
              CASE_TIMEOUT_MS,
            );
          }),
        ]).finally(() => clearTimeout(timer));
      } catch (err) {
        outcome = {
          loads: {},
          problems: [`the case could not run: ${(err as Error).stack ?? String(err)}`],
          notes: [],
        };
      }
      const report: CaseReport = {
        name: c.name,
        criterion: c.criterion,
        ...outcome,
        passed: outcome.problems.length === 0,
        seconds: (Date.now() - started) / 1000,
      };
      reports.push(report);
      log(line(report));
      for (const p of report.problems) log(`    problem: ${p}`);
      if (!report.passed && opts.evidenceDir) {
        const dir = join(opts.evidenceDir, c.name);
        plane.saveOutputs(dir);
        log(`    evidence: every service's output in ${dir}`);
        // a CI log is often all there is: the services' warnings and errors go in it too
        for (const l of warnings(dir)) log(`    ${l}`);
      }
    }
  } finally {
    await plane.close();
  }
  return reports;
}

/** The last warnings and errors (pino level 40 and up) each service wrote, as `service: line`. */
function warnings(dir: string, perService = 15): string[] {
  const out: string[] = [];
  for (const f of readdirSync(dir).filter((n) => n.endsWith(".log"))) {
    const lines = readFileSync(join(dir, f), "utf8")
      .split("\n")
      .filter((l) => /"level":(4|5|6)0\b/.test(l));
    for (const l of lines.slice(-perService)) out.push(`${f.slice(0, -4)}: ${l.slice(0, 400)}`);
  }
  return out;
}

/** `PASS rolling-restart-invocation (41.2 s) http: sent ... | notes` */
export function line(r: CaseReport): string {
  const loads = Object.entries(r.loads).map(([k, v]) => `${k}: ${describe(v)}`);
  return [`${r.passed ? "PASS" : "FAIL"} ${r.name} (${r.seconds.toFixed(1)} s)`, ...loads, ...r.notes].join(
    " | ",
  );
}

export function markdown(reports: CaseReport[], profile: ProfileName): string {
  const rows = reports.map((r) => {
    const sum = (k: "sent" | "answered" | "failed" | "wrong" | "unaccounted") =>
      Object.values(r.loads).reduce((a, l) => a + l[k], 0);
    const counts = Object.keys(r.loads).length
      ? `${sum("sent")} | ${sum("answered")} | ${sum("failed") + sum("wrong")} | ${sum("unaccounted")}`
      : "- | - | - | -";
    const detail = [...r.notes, ...r.problems.map((p) => `**${p}**`)].join("; ").replaceAll("|", "/");
    return `| ${r.name} | ${r.passed ? "pass" : "FAIL"} | ${counts} | ${detail} |`;
  });
  return [
    `Fault suite, profile ${profile}, ${new Date().toISOString()}`,
    "",
    "| case | result | sent | answered | failed | unaccounted | what it saw |",
    "| --- | --- | --- | --- | --- | --- | --- |",
    ...rows,
    "",
  ].join("\n");
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      profile: { type: "string", default: "full" },
      only: { type: "string" },
      markdown: { type: "string" },
      evidence: { type: "string", default: "faults-evidence" },
    },
  });
  const profile = values.profile as ProfileName;
  if (!(profile in PROFILES)) throw new UsageError(`--profile must be small or full, not ${values.profile}`);
  const why = netnsSupport();
  if (why) throw new UsageError(`the fault suite needs network namespaces (run as root): ${why}`);
  const reports = await runSuite(profile, {
    only: values.only?.split(",").filter(Boolean),
    evidenceDir: values.evidence,
  });
  const md = markdown(reports, profile);
  console.log(`\n${md}`);
  if (values.markdown) writeFileSync(values.markdown, md);
  const failed = reports.filter((r) => !r.passed);
  console.log(
    failed.length
      ? `${failed.length} of ${reports.length} cases failed`
      : `all ${reports.length} cases passed`,
  );
  process.exit(failed.length ? 1 : 0);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  main().catch((err: unknown) => {
    // a wrong command line is told in one line; anything else with its stack
    console.error(
      err instanceof UsageError ? `error: ${err.message}` : ((err as Error).stack ?? String(err)),
    );
    process.exit(2);
  });
}
