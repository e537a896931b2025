// Where the repository and its build are, as the compiled testkit (dist/test/testkit/) sees them.
import { join } from "node:path";

export const repoRoot = join(import.meta.dirname, "..", "..", "..");
export const distRoot = join(repoRoot, "dist");
