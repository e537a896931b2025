// callplane's control-plane services started in the test's process on 127.0.0.1:0: the API (with a
// fresh SQLite store, keys, secret store and worker identity signer) and the admin token issuer.
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import {
  type AdminTokenSigner,
  createAdminTokenSigner,
  ensureAdminKeyPair,
  ensureIdentityKey,
  ensureOperatorCredential,
  ensureServiceTokens,
  IdentitySigner,
  readOperatorCredential,
  readServiceToken,
  type ServiceName,
} from "../../src/lib/identity/index.js";
import { createFileMekProvider, ensureKeyringFile, type MekProvider } from "../../src/lib/secrets/index.js";
import { openSqliteSecretStorage } from "../../src/services/api/secrets/storage.js";
import {
  createSecretStore,
  type SecretStore,
  type SecretStoreOptions,
} from "../../src/services/api/secrets/store.js";
import { createAdminIssuer } from "../../src/services/admin-issuer/service.js";
import { openIdentityStore } from "../../src/services/api/identity-store.js";
import { createApiService } from "../../src/services/api/service.js";
import { createRegistry } from "../../src/lib/metrics.js";
import { openSqliteStore } from "../../src/services/api/store/sqlite.js";
import type { Store } from "../../src/services/api/store/types.js";
import type Database from "better-sqlite3";
import type { Logger } from "../../src/lib/log.js";
import { readWorkerSeed } from "../../src/lib/nats/index.js";
import type { Nats } from "./nats.js";
import { removeDir } from "./scope.js";

type Ctx = Pick<TestContext, "after">;

export interface ApiFixture {
  url: string;
  store: Store;
  signer: AdminTokenSigner;
  keysDir: string;
  serviceTokenDir: string;
  /** An admin token signed with the stack's admin key: plane-wide unless `account` names one. */
  adminToken(opts?: { scopes?: readonly string[]; ttlSeconds?: number; account?: string }): Promise<string>;
  /** Signs worker identity tokens as the API does (tests forge and check them with it). */
  identitySigner: IdentitySigner;
  identityKeyFile: string;
  /** Stops the API (a test that restarts it with other settings on the same folder and port). */
  stop(how?: "close" | "destroy"): Promise<void>;
  dir: string;
  serviceToken(name: ServiceName): string;
  privateKeyFile: string;
  publicKeyFile: string;
  /** The admin token issuer's own signing key (trusted by this API unless started with `issuer: false`). */
  issuerKeyFile: string;
  dbPath: string;
  db: Database.Database;
  secrets: SecretStore;
  mekFile: string;
  /** The API's metrics registry (the secret store's series are in it). */
  metrics(): Promise<string>;
}

export interface StartApiOptions {
  maxBodyBytes?: number;
  dir?: string;
  /** Whether the API trusts the admin issuer's key (adminIssuerProxy.enabled); true by default. */
  issuer?: boolean;
  /** Secret store settings to change (fast refresh and grace by default, for tests). */
  secrets?: Partial<Omit<SecretStoreOptions, "storage" | "provider">> & { provider?: MekProvider };
  logger?: Logger;
  /** With NATS: the API creates work queues and closes revoked workers' connections. */
  nats?: Nats;
  region?: string;
  workerAuth?: "nkey" | "token";
  identityTtlSeconds?: number;
  clusterId?: string;
  queue?: { maxMessages?: number; maxMessageBytes?: number; ackWaitSeconds?: number; replicas?: number };
  /** A fixed port (a restarted API keeps its address); 0 by default. */
  port?: number;
  /** compute.local.allowCommand: functions may have the image local/command (off by default). */
  allowLocalCommand?: boolean;
  /**
   * compute.backend (local by default): with local, the cluster `clusterId` ("test") always offers
   * local/local.cpu; with kubernetes, deployments may name only the instance types registered.
   */
  computeBackend?: "local" | "kubernetes";
  /** Host names served besides IP literals and localhost (global.hosts); unset: any Host. */
  hosts?: string[];
  /** The console's audit log bounds (api.audit); the API's defaults unless given. */
  audit?: { maxRows: number; maxAgeDays: number };
  /** Certificate files the console's health page shows (the stack CA, ...). */
  consoleCertificateFiles?: Array<{ name: string; file: string }>;
  /** The callback proxy's /health for the console (unset: the proxy is off, no row). */
  consoleCallbackProxy?: { url: string } | { why: string };
  /** How long the console's health page keeps its probes (0 here unless given: tests see changes at once). */
  consoleProbeCacheMs?: number;
  /** Where the console's request page reads spans (unset: tracing off). */
  consoleTraces?: { file: string } | { queryUrl: string };
}

/** Starts the control-plane API in this process on 127.0.0.1:0 with a fresh SQLite store and keys. */
export async function startApi(t: Ctx, opts: StartApiOptions = {}): Promise<ApiFixture> {
  const own = opts.dir === undefined;
  const dir = opts.dir ?? mkdtempSync(join(tmpdir(), "callplane-api-"));
  const privateKeyFile = join(dir, "keys", "admin.key.pem");
  const publicKeyFile = join(dir, "keys", "admin.pub.pem");
  ensureAdminKeyPair(privateKeyFile, publicKeyFile);
  const issuerKeyFile = join(dir, "keys", "issuer.key.pem");
  const issuerPublicKeyFile = join(dir, "keys", "issuer.pub.pem");
  ensureAdminKeyPair(issuerKeyFile, issuerPublicKeyFile);
  const mekFile = join(dir, "keys", "mek.json");
  ensureKeyringFile(mekFile);
  const serviceTokenDir = join(dir, "secrets");
  ensureServiceTokens(serviceTokenDir);
  const dbPath = join(dir, "callplane.db");
  const store = openSqliteStore(dbPath);
  const serviceTokens = {
    invocation: readServiceToken(serviceTokenDir, "invocation"),
    compute: readServiceToken(serviceTokenDir, "compute"),
    "nats-auth-callout": readServiceToken(serviceTokenDir, "nats-auth-callout"),
  };
  const registry = createRegistry("api", { defaultMetrics: false });
  const { provider, ...secretOpts } = opts.secrets ?? {};
  const secrets = createSecretStore({
    storage: openSqliteSecretStorage(store.db),
    provider: provider ?? createFileMekProvider(mekFile),
    refreshMs: 1000,
    rotationGraceMs: 2000,
    nekCache: { maxEntries: 1000, ttlMs: 300_000, outageMs: 600_000 },
    maxNekEncryptions: 1_000_000_000,
    registry,
    ...(opts.logger ? { logger: opts.logger } : {}),
    ...secretOpts,
  });
  await secrets.start();
  const identityKeyFile = join(dir, "keys", "worker-identity.key.pem");
  ensureIdentityKey(identityKeyFile);
  const identities = openIdentityStore(dbPath);
  const idSigner = new IdentitySigner(
    readFileSync(identityKeyFile, "utf8"),
    opts.clusterId ?? "test",
    opts.identityTtlSeconds ?? 900,
  );
  const api = createApiService({
    listen: { host: "127.0.0.1", port: opts.port ?? 0 },
    store,
    adminPublicKeyPem: readFileSync(publicKeyFile, "utf8"),
    adminIssuerPublicKeyPem: opts.issuer === false ? undefined : readFileSync(issuerPublicKeyFile, "utf8"),
    adminIssuer: { enabled: opts.issuer !== false, gatewayEnabled: true },
    secrets,
    serviceTokens,
    registry,
    ...(opts.logger ? { logger: opts.logger } : {}),
    ...(opts.maxBodyBytes ? { maxBodyBytes: opts.maxBodyBytes } : {}),
    allowLocalCommand: opts.allowLocalCommand ?? false,
    compute: { backend: opts.computeBackend ?? "local", clusterId: opts.clusterId ?? "test" },
    ...(opts.hosts ? { hosts: opts.hosts } : {}),
    ...(opts.audit ? { audit: opts.audit } : {}),
    ...(opts.consoleCertificateFiles ? { consoleCertificateFiles: opts.consoleCertificateFiles } : {}),
    consoleCallbackProxy: opts.consoleCallbackProxy,
    consoleProbeCacheMs: opts.consoleProbeCacheMs ?? 0,
    consoleTraces: opts.consoleTraces,
    workerTrust: {
      region: opts.region ?? "test",
      queue: {
        maxMessages: opts.queue?.maxMessages ?? 100_000,
        maxMessageBytes: opts.queue?.maxMessageBytes ?? 6 * 1024 * 1024,
        replicas: opts.queue?.replicas ?? 1,
        ackWaitSeconds: opts.queue?.ackWaitSeconds ?? 30,
      },
      ...(opts.nats
        ? {
            nats: {
              app: opts.nats.access("api"),
              sys: opts.nats.access("api-revoker"),
              servers: opts.nats.servers,
            },
          }
        : {}),
      workerAuth: opts.workerAuth ?? "nkey",
      ...(opts.nats ? { workerNkeySeed: () => readWorkerSeed(opts.nats!.credentialsDir) } : {}),
      identity: { signer: idSigner, store: identities },
    },
  });
  const url = (await api.listen()).origin;
  let stopped = false;
  const stop = async (how: "close" | "destroy" = "close") => {
    if (stopped) return;
    stopped = true;
    if (how === "close") await api.close(1000);
    else api.destroy();
    await secrets.close();
    await store.close();
    await identities.close();
  };
  t.after(() => stop("destroy"));
  // after the API and its store are closed
  if (own) t.after(() => removeDir(dir));
  const signer = await createAdminTokenSigner(readFileSync(privateKeyFile, "utf8"), 43_200);
  return {
    url,
    store,
    signer,
    keysDir: join(dir, "keys"),
    serviceTokenDir,
    privateKeyFile,
    publicKeyFile,
    issuerKeyFile,
    dbPath,
    db: store.db,
    secrets,
    mekFile,
    metrics: () => registry.metrics(),
    adminToken: async (o = {}) => (await signer.sign(o)).token,
    identitySigner: idSigner,
    stop,
    dir,
    identityKeyFile,
    serviceToken: (name) => serviceTokens[name],
  };
}

/** A started admin token issuer and the operator credential it asks for. */
export interface TestIssuer {
  url: string;
  /** The operator credential (send it as `token` with testkit's call: Authorization: Bearer). */
  credential: string;
  /** The file holding it, mode 0600, as the stack writes it (for `callplane init --operator-credential`). */
  credentialFile: string;
}

/**
 * Starts the admin token issuer; give it the API fixture's `issuerKeyFile`, which the API trusts.
 * It serves `hosts` besides IP literals and localhost (default none).
 */
export async function startIssuer(
  t: Ctx,
  privateKeyFile: string,
  ttlSeconds = 43_200,
  opts: { hosts?: string[]; peerCredentials?: boolean } = {},
): Promise<TestIssuer> {
  const dir = mkdtempSync(join(tmpdir(), "callplane-issuer-"));
  t.after(() => removeDir(dir));
  const credentialFile = join(dir, "keys", "issuer-operator.secret");
  ensureOperatorCredential(credentialFile);
  const credential = readOperatorCredential(credentialFile);
  const issuer = createAdminIssuer({
    listen: { host: "127.0.0.1", port: 0 },
    privateKeyPem: readFileSync(privateKeyFile, "utf8"),
    ttlSeconds,
    operatorCredential: credential,
    hosts: opts.hosts ?? [],
    peerCredentials: opts.peerCredentials ?? false,
  });
  const url = (await issuer.listen()).origin;
  t.after(() => issuer.destroy());
  return { url, credential, credentialFile };
}

/** Mints an admin token at a test issuer, presenting its operator credential. */
export async function mintAdminToken(issuer: TestIssuer): Promise<string> {
  const r = await fetch(`${issuer.url}/v1/admin/keys`, {
    method: "POST",
    headers: { authorization: `Bearer ${issuer.credential}`, "content-type": "application/json" },
    body: "{}",
  });
  const text = await r.text();
  if (r.status !== 200) throw new Error(`the issuer answered ${r.status}: ${text}`);
  return (JSON.parse(text) as { value: string }).value;
}
