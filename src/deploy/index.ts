// What the CLI calls: load an environment file the way render reads it, render it, check every
// object, and write the files.
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { basename, join } from "node:path";
import { checkoutRoot } from "../lib/paths.js";
import { parse as parseYaml } from "yaml";
import { writeFileAtomic } from "../lib/fs.js";
import { loadConfig, type Config } from "../lib/config/index.js";
import { rawAt, type RawDocument } from "./cluster-config.js";
import { RenderError, renderControlPlane, type RenderResult } from "./render/index.js";
import { HEADER, fileText, validateFiles } from "./validate.js";

export { RenderError } from "./render/index.js";
export type { RenderResult } from "./render/index.js";

/** callplane's version, from the package.json of this checkout (or of the image, /app). */
export function callplaneVersion(): string {
  const file = join(checkoutRoot, "package.json");
  return (JSON.parse(readFileSync(file, "utf8")) as { version: string }).version;
}

/**
 * What the API's pods find in their environment and the file does not say: with PostgreSQL, the
 * database URL comes from the Secret callplane-database (CALLPLANE__API__DATABASE__URL), so a file
 * that leaves api.database.url empty is checked as the pods will check it.
 */
export const POD_DATABASE_URL = "postgres://from-the-secret@database/callplane";

/**
 * Loads an environment file as the cluster's pods will: with the config loader's every rule, no
 * CALLPLANE__ overrides from this shell (the manifests follow from the file alone), and
 * api.database.url left to the Secret when the file leaves it empty.
 */
export function loadForCluster(file: string): { config: Config; raw: RawDocument } {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
    parseYaml(text);
  } catch {
    // the config loader says what is wrong with an unreadable file or bad YAML, and how
    loadConfig({ file, env: {} });
    throw new Error(`cannot read ${file}`);
  }
  const parsed = parseYaml(text) as unknown;
  const raw = (parsed && typeof parsed === "object" ? parsed : {}) as RawDocument;
  const urlFromSecret = rawAt(raw, "api.database.driver") === "postgres" && !rawAt(raw, "api.database.url");
  const config = loadConfig({
    file,
    env: urlFromSecret ? { CALLPLANE__API__DATABASE__URL: POD_DATABASE_URL } : {},
  });
  return { config, raw };
}

/** Renders an environment file, read by loadForCluster, and checks every object it renders. */
export function renderFile(file: string, opts: { version?: string } = {}): RenderResult {
  const { config, raw } = loadForCluster(file);
  const source = basename(file);
  const result = renderControlPlane({ config, raw, version: opts.version ?? callplaneVersion(), source });
  const problems = validateFiles(result.files);
  if (problems.length)
    throw new RenderError(source, [
      "a rendered object does not validate against its schema (a bug in callplane render; please report it):",
      ...problems,
    ]);
  // the pods' copy of the file must load as their services will load it
  const doc = result.files
    .flatMap((f) => f.objects)
    .find((o) => o.kind === "ConfigMap" && o.metadata?.name === "callplane-config")!;
  const text = (doc.toJSON() as { data: Record<string, string> }).data["callplane.yaml"];
  const podEnv: NodeJS.ProcessEnv =
    config.api.database.driver === "postgres" ? { CALLPLANE__API__DATABASE__URL: POD_DATABASE_URL } : {};
  try {
    loadConfig({ overrides: parseYaml(text) as RawDocument, env: podEnv, cwd: "/" });
  } catch (err) {
    throw new RenderError(source, [
      `the pods' copy of the file does not load (a bug in callplane render; please report it): ${(err as Error).message}`,
    ]);
  }
  return result;
}

export interface WriteOutcome {
  written: string[];
  removed: string[];
}

/**
 * Writes the files into `dir`. Files a previous render wrote there and this one does not are
 * removed (a component turned off must not be applied again); any other file is left alone and
 * stops the write, since `kubectl apply -f <dir>` would apply it too.
 */
export function writeRendered(result: RenderResult, dir: string, source: string): WriteOutcome {
  const wanted = new Set(result.files.map((f) => f.name));
  const removed: string[] = [];
  if (existsSync(dir)) {
    const foreign: string[] = [];
    const stale: string[] = [];
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      if (wanted.has(e.name)) continue;
      const p = join(dir, e.name);
      if (e.isFile() && /\.ya?ml$/.test(e.name) && readFileSync(p, "utf8").startsWith(HEADER))
        stale.push(e.name);
      else foreign.push(e.name);
    }
    if (foreign.length)
      throw new RenderError(source, [
        `the output folder ${dir} holds files render did not write (${foreign.join(", ")}): \`kubectl apply -f ${dir}\` would apply them too. Give render a folder of its own`,
      ]);
    for (const s of stale) {
      rmSync(join(dir, s));
      removed.push(s);
    }
  }
  mkdirSync(dir, { recursive: true });
  const written: string[] = [];
  for (const f of result.files) {
    writeFileAtomic(join(dir, f.name), fileText(f, basename(source)), 0o644);
    written.push(f.name);
  }
  return { written, removed };
}
