// How a function instance receives its secrets on the local backend, the way NVCF gives them to
// an inference container: one JSON file, `secrets.json`, mapping each secret's name to its value
// (a string, or the JSON object it was stored as), in a folder of its own. Upstream mounts that
// folder at /var/secrets from an in-memory volume; here each instance gets a folder under a tmpfs
// (/dev/shm) outside the data folder, mode 0700 with the file 0600 (both owned by the user the
// server runs as: instance-user.ts), named to the inference server
// as SECRETS_PATH (the file; the variable NVIDIA's secrets sample reads) and SECRETS_DIR (the
// folder). Optionally (compute.secrets.env) secrets whose names are environment variable names
// are also set in its environment. The file is rewritten (atomically: a reader sees the old or
// the new one) when a secret of the version changes; environment variables keep the values the
// process started with. The folder is removed when the instance stops.
import { randomBytes } from "node:crypto";
import { closeSync, fchownSync, openSync, renameSync, writeSync } from "node:fs";
import { join } from "node:path";
import { removeTreeSync } from "../../lib/fs.js";
import { loadsCode } from "../../lib/local-images.js";
import { prepareAgentRoot, serverFolder } from "./instance-folders.js";
import type { InstanceUser } from "./instance-user.js";

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
 * Creates the root (mode 0700, or 0711 when instances run as another user, who must reach its own
 * folder in it) and removes what an earlier run left there (instance-folders.ts). Returns how many.
 */
export function prepareSecretsRoot(root: string, mode = 0o700): number {
  return prepareAgentRoot(root, mode, "compute.secrets.dir");
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
// what the worker and the server's own configuration rely on is never overwritten by a secret
// (nor, by a secret named NODE_OPTIONS or LD_PRELOAD, made to load code: lib/local-images.ts)
const RESERVED = /^(INFERENCE_|NVCF_|SECRETS_(PATH|DIR)$|PATH$|HOME$|TMPDIR$)/;

export class InstanceSecrets {
  readonly dir: string;
  readonly file: string;
  revision = -1;
  private startValues: Record<string, unknown> = {};

  constructor(
    private readonly cfg: InstanceSecretsConfig,
    instanceId: string,
    private readonly user: InstanceUser,
  ) {
    this.dir = join(cfg.root, instanceId);
    this.file = join(this.dir, "secrets.json");
  }

  write(s: Pick<FetchedSecrets, "revision" | "values">): void {
    // the folder is the server's (it may list it); a file is made anew (O_EXCL: never through a
    // link the server placed under that name) and renamed over the old one
    serverFolder(this.dir, this.user);
    const tmp = join(this.dir, `.secrets.${randomBytes(8).toString("hex")}.tmp`);
    const fd = openSync(tmp, "wx", 0o600);
    try {
      if (this.user.switched) fchownSync(fd, this.user.uid, this.user.gid);
      writeSync(fd, JSON.stringify(s.values));
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, this.file);
    if (this.revision < 0) this.startValues = s.values;
    this.revision = s.revision;
  }

  /** The inference server's environment for the values it starts with. */
  env(): Record<string, string> {
    const env: Record<string, string> = { SECRETS_DIR: this.dir, SECRETS_PATH: this.file };
    if (this.cfg.env) {
      for (const [name, value] of Object.entries(this.startValues)) {
        if (!ENV_NAME.test(name) || RESERVED.test(name) || loadsCode(name)) continue;
        env[name] = typeof value === "string" ? value : JSON.stringify(value);
      }
    }
    return env;
  }

  remove(): void {
    removeTreeSync([this.dir]);
  }
}
