// Where callplane's own files are, found from this module's place in the build: this file is
// dist/src/lib/paths.js, in a checkout or in the image (/app).
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The build's root: `dist/` (its `src/`, `examples/`, `test/`). */
export const distRoot = join(fileURLToPath(import.meta.url), "..", "..", "..");

/** The checkout's (or the image's) root: package.json, `.tools/`, `deploy/`, `node_modules/`. */
export const checkoutRoot = join(distRoot, "..");
