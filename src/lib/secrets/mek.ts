// Where master encryption keys (MEKs) come from. The secret store depends on this interface only:
// it asks a provider to wrap and unwrap NEKs under a named key, and which keys it has. Two
// providers are built in, both for one machine or a Kubernetes Secret mounted as a file or given as
// an environment variable: a keyring file (the stack generates one on first start, mode 0600) and
// a keyring in an environment variable. A plugin module can provide any other (an external KMS,
// OpenBao Transit): see docs/operations.md, "MEK providers".
//
// Which key is primary is not the provider's business: that state lives in the database, shared by
// every API replica, so that all of them agree on it (see src/services/api/secrets/store.ts).
import { randomBytes } from "node:crypto";
import { closeSync, existsSync, openSync, readFileSync, statSync, unlinkSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { z } from "zod";
import { writeFileAtomic } from "../fs.js";
import type { Logger } from "../log.js";
import { KEY_BYTES, gcmOpen, gcmSeal, isValidKeyId } from "./envelope.js";

export interface MekProvider {
  /** A short name for logs and status: `file`, `env`, or the plugin's own. */
  readonly name: string;
  /**
   * Re-reads key material. On failure the provider keeps what it had (the last good keyring) and
   * rejects, so that the caller can log and count the failure.
   */
  refresh(): Promise<void>;
  /** The ids of the keys this provider can wrap and unwrap with now. */
  keyIds(): string[];
  /** Encrypts a NEK under the key `kid`, bound to `aad`. Returns the bytes to store. */
  wrap(kid: string, plaintext: Buffer, aad: Buffer): Promise<Buffer>;
  /** Decrypts what wrap() returned, checking `aad`. */
  unwrap(kid: string, body: Buffer, aad: Buffer): Promise<Buffer>;
  /** Creates a new key and returns its id (absent where keys are made outside callplane). */
  createKey?(): Promise<string>;
  /** Destroys a key that no NEK is wrapped with any more (absent where keys are managed outside). */
  destroyKey?(kid: string): Promise<void>;
  close?(): Promise<void>;
}

/** Thrown by a provider that cannot do what was asked; `unavailable` means "try again later". */
export class MekProviderError extends Error {
  constructor(
    message: string,
    readonly kind: "unknown-key" | "unavailable" | "refused",
    opts?: { cause?: unknown },
  ) {
    super(message, opts);
    this.name = "MekProviderError";
  }
}

export const KEYRING_FORMAT = "callplane-mek-keyring/v1";

const keyringSchema = z.strictObject({
  format: z.literal(KEYRING_FORMAT),
  keys: z.array(
    z.strictObject({
      kid: z.string().refine(isValidKeyId, "must be 1-255 printable ASCII characters"),
      key: z
        .string()
        .refine((k) => Buffer.from(k, "base64").length === KEY_BYTES, `must be ${KEY_BYTES} bytes, base64`),
      createdAt: z.string().optional(),
    }),
  ),
});
export type Keyring = z.infer<typeof keyringSchema>;

export function parseKeyring(text: string, where: string): Map<string, Buffer> {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    // the parser's message would quote the text, which holds key material
    throw new Error(`${where} is not valid JSON`);
  }
  const r = keyringSchema.safeParse(raw);
  if (!r.success) {
    const what = r.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ");
    throw new Error(`${where} is not a callplane MEK keyring (${KEYRING_FORMAT}): ${what}`);
  }
  const keys = new Map<string, Buffer>();
  for (const k of r.data.keys) {
    if (keys.has(k.kid)) throw new Error(`${where} lists the key id ${k.kid} twice`);
    keys.set(k.kid, Buffer.from(k.key, "base64"));
  }
  return keys;
}

/** A new key id: readable, sortable by time, unique (`mek-20261201t101500z-1a2b3c4d`). */
export function newMekKid(now = new Date()): string {
  const t = now.toISOString().replace(/[-:]/g, "").replace(/\.\d+/, "").toLowerCase();
  return `mek-${t}-${randomBytes(4).toString("hex")}`;
}

export function newKeyringEntry(now = new Date()): Keyring["keys"][number] {
  return {
    kid: newMekKid(now),
    key: randomBytes(KEY_BYTES).toString("base64"),
    createdAt: now.toISOString(),
  };
}

/** Wrap and unwrap with key material held in memory (AES-256-GCM, the envelope's body layout). */
function localCrypto(keys: () => Map<string, Buffer>, name: string) {
  const key = (kid: string): Buffer => {
    const k = keys().get(kid);
    if (!k) throw new MekProviderError(`the ${name} MEK provider has no key ${kid}`, "unknown-key");
    return k;
  };
  return {
    wrap: (kid: string, plaintext: Buffer, aad: Buffer) => Promise.resolve(gcmSeal(key(kid), aad, plaintext)),
    unwrap: (kid: string, body: Buffer, aad: Buffer) => Promise.resolve(gcmOpen(key(kid), aad, body)),
  };
}

/**
 * Creates the keyring file with one new key when it does not exist (mode 0600); returns whether it
 * did. An existing file is never touched.
 */
export function ensureKeyringFile(file: string): { created: boolean; kid?: string } {
  if (existsSync(file)) return { created: false };
  const entry = newKeyringEntry();
  writeFileAtomic(file, `${JSON.stringify({ format: KEYRING_FORMAT, keys: [entry] }, null, 2)}\n`, 0o600);
  return { created: true, kid: entry.kid };
}

/**
 * An exclusive lock beside the keyring for its read-modify-write: two API processes on one
 * machine may add and destroy keys at once. A lock older than 30 s is a crashed holder's.
 */
async function withFileLock<T>(file: string, fn: () => T): Promise<T> {
  const lock = `${file}.lock`;
  for (let i = 0; ; i++) {
    try {
      closeSync(openSync(lock, "wx", 0o600));
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      try {
        if (Date.now() - statSync(lock).mtimeMs > 30_000) unlinkSync(lock);
      } catch {
        // gone meanwhile
      }
      if (i > 200) throw new MekProviderError(`the keyring lock ${lock} is held`, "unavailable");
      await new Promise((r) => setTimeout(r, 25));
    }
  }
  try {
    return fn();
  } finally {
    try {
      unlinkSync(lock);
    } catch {
      // already removed
    }
  }
}

export function createFileMekProvider(file: string, logger?: Logger): MekProvider {
  let keys = new Map<string, Buffer>();
  let loaded = false;
  const read = (): Map<string, Buffer> => {
    let text: string;
    try {
      text = readFileSync(file, "utf8");
    } catch (err) {
      throw new MekProviderError(
        `cannot read the MEK keyring ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
        "unavailable",
        { cause: err },
      );
    }
    return parseKeyring(text, `the MEK keyring ${file}`);
  };
  const write = (next: Map<string, Buffer>, created: Map<string, string>) => {
    const entries = [...next].map(([kid, k]) => ({
      kid,
      key: k.toString("base64"),
      ...(created.has(kid) ? { createdAt: created.get(kid) } : {}),
    }));
    writeFileAtomic(file, `${JSON.stringify({ format: KEYRING_FORMAT, keys: entries }, null, 2)}\n`, 0o600);
  };
  const createdAt = (): Map<string, string> => {
    try {
      const raw = JSON.parse(readFileSync(file, "utf8")) as Keyring;
      return new Map(
        raw.keys.flatMap((k) => (k.createdAt ? [[k.kid, k.createdAt] as [string, string]] : [])),
      );
    } catch {
      return new Map();
    }
  };
  const provider: MekProvider = {
    name: "file",
    refresh() {
      try {
        keys = read();
        if (!loaded) {
          const mode = statSync(file).mode & 0o777;
          if (mode & 0o077)
            logger?.warn(
              { file, mode: mode.toString(8) },
              "the MEK keyring can be read by other users; make it mode 0600 (chmod 600)",
            );
        }
        loaded = true;
        return Promise.resolve();
      } catch (err) {
        return Promise.reject(err instanceof Error ? err : new Error(String(err)));
      }
    },
    keyIds: () => [...keys.keys()],
    ...localCrypto(() => keys, "file"),
    async createKey() {
      return withFileLock(file, () => {
        const current = read();
        const dates = createdAt();
        const entry = newKeyringEntry();
        current.set(entry.kid, Buffer.from(entry.key, "base64"));
        dates.set(entry.kid, entry.createdAt!);
        write(current, dates);
        keys = current;
        return entry.kid;
      });
    },
    async destroyKey(kid) {
      await withFileLock(file, () => {
        const current = read();
        const dates = createdAt();
        if (!current.delete(kid)) return;
        write(current, dates);
        keys = current;
      });
    },
  };
  return provider;
}

/** A keyring given in an environment variable (the same JSON as the file): fixed for the process's life. */
export function createEnvMekProvider(variable: string, value: string | undefined): MekProvider {
  const keys =
    value === undefined || value === ""
      ? new Map<string, Buffer>()
      : parseKeyring(value, `the MEK keyring in $${variable}`);
  return {
    name: "env",
    refresh: () => Promise.resolve(),
    keyIds: () => [...keys.keys()],
    ...localCrypto(() => keys, "env"),
  };
}

/** What a plugin module's `createMekProvider` receives. */
export interface MekPluginContext {
  env: NodeJS.ProcessEnv;
  logger: Logger;
}

/** Loads a provider from an ES module that exports `createMekProvider(context)`. */
export async function loadMekPlugin(modulePath: string, ctx: MekPluginContext): Promise<MekProvider> {
  const abs = isAbsolute(modulePath) ? modulePath : resolve(modulePath);
  let mod: { createMekProvider?: unknown };
  try {
    mod = (await import(pathToFileURL(abs).href)) as { createMekProvider?: unknown };
  } catch (err) {
    throw new Error(`cannot load the MEK provider plugin ${abs}: ${(err as Error).message}`, { cause: err });
  }
  if (typeof mod.createMekProvider !== "function")
    throw new Error(`the MEK provider plugin ${abs} does not export a function createMekProvider(context)`);
  const p = (await (mod.createMekProvider as (c: MekPluginContext) => unknown)(ctx)) as Partial<MekProvider>;
  const missing = (["refresh", "keyIds", "wrap", "unwrap"] as const).filter(
    (m) => typeof p?.[m] !== "function",
  );
  if (missing.length || typeof p.name !== "string")
    throw new Error(
      `the MEK provider plugin ${abs} returned an object without ${[...missing, ...(typeof p?.name === "string" ? [] : ["name"])].join(", ")}`,
    );
  return p as MekProvider;
}
