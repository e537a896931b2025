// Benchmark: the secret store's encrypt and decrypt latency, p50 and p99, with a warm NEK cache
// (the NEK is in memory: one AES-GCM operation plus the SQLite row) and a cold one (the cache is
// emptied before every operation: the NEK row is read and unwrapped through the MEK provider
// first), against a real SQLite file and the file MEK provider, in this process. The bare
// envelope (seal/open, no database) is measured beside it, so the database's share shows.
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  createFileMekProvider,
  ensureKeyringFile,
  openSecret,
  parseEnvelope,
  sealSecret,
} from "../src/lib/secrets/index.js";
import { openSqliteSecretStorage } from "../src/services/api/secrets/storage.js";
import { createSecretStore } from "../src/services/api/secrets/store.js";
import { openSqliteStore } from "../src/services/api/store/sqlite.js";
import { machine } from "./harness.js";

export interface SecretsBenchOptions {
  iterations: number;
  valueBytes: number;
  functions: number;
}

interface Lat {
  p50: number;
  p99: number;
  mean: number;
  n: number;
}

function stats(samples: number[]): Lat {
  const s = [...samples].sort((a, b) => a - b);
  const at = (q: number) => s[Math.min(s.length - 1, Math.floor(q * s.length))];
  const r = (x: number) => Math.round(x * 1000) / 1000;
  return { p50: r(at(0.5)), p99: r(at(0.99)), mean: r(s.reduce((a, b) => a + b, 0) / s.length), n: s.length };
}

async function time(n: number, before: (i: number) => void, op: (i: number) => unknown): Promise<Lat> {
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    before(i);
    const t0 = process.hrtime.bigint();
    await op(i);
    samples.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return stats(samples);
}

export async function benchSecrets(o: SecretsBenchOptions): Promise<Record<string, unknown>> {
  const dir = mkdtempSync(join(tmpdir(), "callplane-bench-secrets-"));
  const keyring = join(dir, "mek.json");
  ensureKeyringFile(keyring);
  const db = openSqliteStore(join(dir, "bench.db"));
  const store = createSecretStore({
    storage: openSqliteSecretStorage(db.db),
    provider: createFileMekProvider(keyring),
    // no background work during the measurement
    refreshMs: 3_600_000,
    rotationGraceMs: 7_200_000,
    nekCache: { maxEntries: 10_000, ttlMs: 3_600_000, outageMs: 0 },
    maxNekEncryptions: 4_000_000_000,
  });
  await store.start();
  try {
    const value = randomBytes(Math.ceil(o.valueBytes / 2))
      .toString("hex")
      .slice(0, o.valueBytes);
    const refs = Array.from({ length: o.functions }, (_, i) => ({
      functionId: `00000000-0000-4000-8000-${String(i).padStart(12, "0")}`,
      versionId: `00000000-0000-4000-9000-${String(i).padStart(12, "0")}`,
    }));
    for (const r of refs) await store.put(r, [{ name: "SEED", value }]);
    const ref = (i: number) => refs[i % refs.length];
    const nothing = () => undefined;
    const cold = () => store.cache.clear();
    // warm up the JIT and SQLite's page cache
    for (let i = 0; i < 500; i++) await store.value(ref(i), "SEED");

    const encryptWarm = await time(o.iterations, nothing, (i) =>
      store.put(ref(i), [{ name: `W${i % 16}`, value }]),
    );
    const encryptCold = await time(o.iterations, cold, (i) =>
      store.put(ref(i), [{ name: `C${i % 16}`, value }]),
    );
    const decryptWarm = await time(o.iterations, nothing, (i) => store.value(ref(i), "SEED"));
    const decryptCold = await time(o.iterations, cold, (i) => store.value(ref(i), "SEED"));

    // the envelope alone: AES-256-GCM with the header and context as AAD, no database
    const nek = { id: "nek-0123456789abcdef", key: randomBytes(32) };
    const where = { namespace: "function:bench", versionId: "v", name: "SEED" };
    const plain = Buffer.from(JSON.stringify(value));
    const sealed = sealSecret(nek, where, plain);
    const seal = await time(o.iterations, nothing, () => sealSecret(nek, where, plain));
    const open = await time(o.iterations, nothing, () =>
      openSecret(parseEnvelope(sealed, "secret"), nek.key, where),
    );
    return {
      machine: machine(),
      settings: o,
      unit: "ms",
      store: { encryptWarm, encryptCold, decryptWarm, decryptCold },
      envelope: { seal, open },
      notes:
        "store encrypt = seal + one SQLite transaction (upsert, NEK counter, revision); decrypt = SQLite reads (row, NEK row) + open; cold = the NEK unwrapped through the file MEK provider first",
    };
  } finally {
    await store.close();
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
