// How a function instance receives its secrets on the local backend, the way NVCF gives them to
// an inference container: one JSON file, `secrets.json`, mapping each secret's name to its value
// (a string, or the JSON object it was stored as), in a folder of its own. Upstream mounts that
// folder at /var/secrets from an in-memory volume; here each instance gets a folder under a tmpfs
// (/dev/shm) outside the data folder, mode 0700 with the file 0600, named to the inference server
// as SECRETS_PATH (the file; the variable NVIDIA's secrets sample reads) and SECRETS_DIR (the
// folder). Optionally (compute.secrets.env) secrets whose names are environment variable names
// are also set in its environment. The file is rewritten (atomically: a reader sees the old or
// the new one) when a secret of the version changes; environment variables keep the values the
// process started with. The folder is removed when the instance stops.
import { chmodSync, lstatSync, mkdirSync, readdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";

export { secretsRoot } from "../../lib/secrets/index.js";

export interface FetchedSecrets {
  revision: number;
  values: Record<string, unknown>;
  unreadable: Array<{ name: string; code: string; problem: string }>;
}

export interface InstanceSecretsConfig {
  /** The folder under which each instance gets its own secrets folder. */
  root: string;
  /** Whether string-valued secrets named like environment variables are also set as such. */
  env: boolean;
  /** Reads a version's secret values from the API (the compute agent's service token). */
  fetch(functionId: string, versionId: string): Promise<FetchedSecrets>;
}

/**
 * Creates the root (mode 0700) and checks that it and its parent are real folders of this user,
 * not links someone else placed in a shared tmpfs. Then, since no instance of this agent runs yet,
 * removes every folder under the root: leftovers of a run that was killed. Returns how many.
 */
export function prepareSecretsRoot(root: string): number {
  mkdirSync(root, { recursive: true, mode: 0o700 });
  const uid = typeof process.getuid === "function" ? process.getuid() : undefined;
  for (const d of [dirname(root), root]) {
    const st = lstatSync(d);
    if (!st.isDirectory() || (uid !== undefined && st.uid !== uid))
      throw new Error(
        `${d} is not a folder of this user (a link, or owned by uid ${st.uid}); instances' secrets will not be written there. Remove it, or set compute.secrets.dir`,
      );
    chmodSync(d, 0o700);
  }
  let n = 0;
  for (const e of readdirSync(root)) {
    rmSync(join(root, e), { recursive: true, force: true });
    n++;
  }
  return n;
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
// what the worker and the server's own configuration rely on is never overwritten by a secret
const RESERVED = /^(INFERENCE_|NVCF_|SECRETS_(PATH|DIR)$|PATH$|HOME$)/;

export class InstanceSecrets {
  readonly dir: string;
  readonly file: string;
  revision = -1;
  private startValues: Record<string, unknown> = {};

  constructor(
    private readonly cfg: InstanceSecretsConfig,
    instanceId: string,
  ) {
    this.dir = join(cfg.root, instanceId);
    this.file = join(this.dir, "secrets.json");
  }

  write(s: Pick<FetchedSecrets, "revision" | "values">): void {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    chmodSync(this.dir, 0o700);
    const tmp = join(this.dir, `.secrets.${process.pid}.tmp`);
    writeFileSync(tmp, JSON.stringify(s.values), { mode: 0o600 });
    renameSync(tmp, this.file);
    if (this.revision < 0) this.startValues = s.values;
    this.revision = s.revision;
  }

  /** The inference server's environment for the values it starts with. */
  env(): Record<string, string> {
    const env: Record<string, string> = { SECRETS_DIR: this.dir, SECRETS_PATH: this.file };
    if (this.cfg.env) {
      for (const [name, value] of Object.entries(this.startValues)) {
        if (!ENV_NAME.test(name) || RESERVED.test(name)) continue;
        env[name] = typeof value === "string" ? value : JSON.stringify(value);
      }
    }
    return env;
  }

  remove(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }
}
