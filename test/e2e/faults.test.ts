// The fault suite's small profile, as CI runs it (alone, after the other tests: see
// scripts/bootstrap.mjs): the same plane and cases as `npm run test:faults`, with fewer restarts
// and rotations, and without the latency criterion (CI's machine is shared). Each case's line is
// printed as a diagnostic; the test fails with every case's problems.
import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { checkoutRoot } from "../../src/lib/paths.js";
import { netnsSupport } from "../testkit/netns.js";
import { line, runSuite } from "./faults/run.js";

const why = netnsSupport();

test(
  "fault suite (small profile): every request accounted for through every fault",
  { skip: why, timeout: 1_200_000 },
  async (t) => {
    const reports = await runSuite("small", {
      log: (l) => t.diagnostic(l),
      // a failed case keeps every service's output, and its warnings are printed with it
      evidenceDir: join(checkoutRoot, ".callplane", "test-output", "faults-evidence"),
    });
    const failed = reports.filter((r) => !r.passed);
    assert.deepEqual(
      failed.map((r) => `${line(r)}\n  ${r.problems.join("\n  ")}`),
      [],
      `${failed.length} of ${reports.length} fault cases failed`,
    );
  },
);
