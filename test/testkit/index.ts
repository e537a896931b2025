// Test helpers that start real parts (nats-server, services on 127.0.0.1:0, child processes) and
// always stop them when the test ends.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import {
  createAdminTokenSigner,
  ensureAdminKeyPair,
  ensureServiceTokens,
  readServiceToken,
  type AdminTokenSigner,
  type ServiceName,
} from "../../src/lib/auth.js";
import { createUser } from "@nats-io/nkeys";
import { connect, nkeyAuthenticator, type NatsConnection } from "@nats-io/transport-node";
import {
  ensureNatsKeys,
  publicKeyOf,
  readCalloutIssuerSeed,
  readWorkerSeed,
  serviceNatsAccess,
  type NatsAccess,
  type NatsServiceRole,
} from "../../src/lib/nats-auth.js";
import { natsServerBinary, waitForNats, writeNatsServerConfig } from "../../src/lib/nats-server.js";
import { createFileMekProvider, ensureKeyringFile, type MekProvider } from "../../src/lib/secrets/mek.js";
import { openSqliteSecretStorage } from "../../src/services/api/secrets/storage.js";
import {
  createSecretStore,
  type SecretStore,
  type SecretStoreOptions,
} from "../../src/services/api/secrets/store.js";
import { IdentitySigner, ensureIdentityKey } from "../../src/lib/worker-identity.js";
import { createAdminIssuer } from "../../src/services/admin-issuer/service.js";
import {
  createNatsAuthCallout,
  type NatsAuthCalloutOptions,
} from "../../src/services/nats-auth-callout/service.js";
import { createLogger, silentLogger } from "../../src/lib/log.js";
import { openIdentityStore } from "../../src/services/api/identity-store.js";
import { createApiService } from "../../src/services/api/service.js";
import { createRegistry } from "../../src/lib/metrics.js";
import { openSqliteStore } from "../../src/services/api/store/sqlite.js";
import type { Store } from "../../src/services/api/store/types.js";
import type Database from "better-sqlite3";
import type { Logger } from "../../src/lib/log.js";
import { writeFileAtomic } from "../../src/lib/auth.js";
import { TLS_FILES } from "../../src/lib/pki.js";
import { testPki, type TestPki } from "./tls.js";

type Ctx = Pick<TestContext, "after">;

export const repoRoot = join(import.meta.dirname, "..", "..", "..");
export const distRoot = join(repoRoot, "dist");

/** Removes a folder; never throws (a failing after-hook would skip the hooks after it). */
export function removeDir(dir: string): void {
  try {
    rmSync(dir, { recursive: true, force: true, maxRetries: 5, retryDelay: 50 });
  } catch {
    // a process that has not let go yet; the OS cleans tmp eventually
  }
}

/**
 * A temporary folder removed when the test ends. node:test runs after-hooks in the order they were
 * added, so a helper that starts a process writing into its folder must add the folder's removal
 * after the process's stop (see startNats).
 */
export function tmpDir(t: Ctx, prefix = "callplane-test-"): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  t.after(() => removeDir(dir));
  return dir;
}

export interface Nats {
  /** tls://<host>:<port>; for a cluster, every node's, separated by commas */
  url: string;
  /** How many servers: 1, or a cluster's size (what nats.cluster.size says to services). */
  servers: number;
  host: string;
  port: number;
  process: ChildProcess;
  stop(): Promise<void>;
  /** The test CA that issued the server's certificate, and its file. */
  pki: TestPki;
  caFile: string;
  /** nats.credentialsDir: the services' nkeys, the worker nkey, the callout issuer key. */
  credentialsDir: string;
  /** The server's certificate files (a test may replace them and signal a reload). */
  certFile: string;
  keyFile: string;
  configFile: string;
  /** How one of callplane's services connects (its own nkey, its own permissions). */
  access(role: NatsServiceRole): NatsAccess;
  /** A test's own connection, as a configured user with no limits (the test observes, it is not under test). */
  observe(name?: string): Promise<NatsConnection>;
  /** A worker's NATS environment in nkey mode: the shared worker seed and the CA. */
  workerNkeyEnv(): Record<string, string>;
  /** CALLPLANE__NATS__* overrides that point a service process at this server. */
  serviceEnv(): Record<string, string>;
  /** Rewrites the configuration from the key files (after a key rotation) and signals a reload. */
  reload(): void;
  /** Stops the server process (SIGKILL with `kill`), keeping its folder, keys and port. */
  stopServer(how?: "term" | "kill"): Promise<void>;
  /** Starts it again on the same port with the same store (JetStream keeps its streams). */
  startServer(): Promise<void>;
  /**
   * Replaces the auth callout this server runs with (by default one in this process that knows
   * the shared worker nkey and no webhook, as in nkey mode).
   */
  replaceCallout(plugins: NatsAuthCalloutOptions["plugins"], logFile?: string): Promise<void>;
}

/**
 * Starts a real nats-server with JetStream on a random port of `host` (127.0.0.1), as the stack
 * runs it: TLS with a certificate from a test CA, every user in a named account, callplane's
 * service keys and the shared worker key as configured users, everyone else sent to the auth
 * callout (a test that wants token mode starts the callout service).
 */
export async function startNats(
  t: Ctx,
  opts: { dir?: string; host?: string; region?: string } = {},
): Promise<Nats> {
  const own = opts.dir === undefined;
  const dir = opts.dir ?? mkdtempSync(join(tmpdir(), "callplane-nats-"));
  const host = opts.host ?? "127.0.0.1";
  const pki = await testPki();
  const cert = await pki.issue([host, "localhost"]);
  const certFile = join(dir, "tls", TLS_FILES.cert);
  const keyFile = join(dir, "tls", TLS_FILES.key);
  const caFile = join(dir, "tls", TLS_FILES.ca);
  writeFileAtomic(keyFile, cert.keyPem, 0o600);
  writeFileAtomic(certFile, cert.certPem, 0o644);
  writeFileAtomic(caFile, pki.ca.certPem, 0o644);
  const credentialsDir = join(dir, "creds");
  ensureNatsKeys(credentialsDir);
  const observer = createUser();
  const observerSeed = new TextDecoder().decode(observer.getSeed());
  const writeConfig = (port: number) =>
    writeNatsServerConfig(
      dir,
      { host, port },
      {
        name: "test",
        security: {
          certFile,
          keyFile,
          credentialsDir,
          region: opts.region ?? "test",
          extraAppUsers: [{ nkey: observer.getPublicKey() }],
        },
      },
    );
  const files = writeConfig(-1);
  let stderr = "";
  const spawnServer = () => {
    const c = spawn(natsServerBinary(), ["-c", files.configFile, "--ports_file_dir", dir], {
      stdio: ["ignore", "ignore", "pipe"],
    });
    c.stderr.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-32_768)));
    return c;
  };
  let child = spawnServer();
  let callout: ReturnType<typeof createNatsAuthCallout> | undefined;
  const stop = async () => {
    await callout?.close().catch(() => undefined);
    callout = undefined;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGTERM");
    const k = setTimeout(() => child.kill("SIGKILL"), 3000);
    await exited;
    clearTimeout(k);
  };
  t.after(stop);
  // after the stop: nats-server writes into its folder until it exits
  if (own) t.after(() => removeDir(dir));
  let port = 0;
  for (let i = 0; i < 400 && !port; i++) {
    const f = readdirSync(dir).find((n) => n.endsWith(".ports"));
    if (f) {
      try {
        const ports = JSON.parse(readFileSync(join(dir, f), "utf8")) as { nats: string[] };
        port = Number(new URL(ports.nats[0]).port);
      } catch {
        // written but not complete yet
      }
    }
    if (!port) {
      if (child.exitCode !== null) throw new Error(`nats-server exited: ${stderr}`);
      await sleep(25);
    }
  }
  if (!port) throw new Error(`nats-server did not write its ports file: ${stderr}`);
  await waitForNats({ host, port });
  const url = `tls://${host}:${port}`;
  const startCallout = async (plugins: NatsAuthCalloutOptions["plugins"], logFile?: string) => {
    await callout?.close();
    callout = await startTestCallout(
      { url, caFile, credentialsDir, region: opts.region ?? "test" },
      plugins,
      logFile,
    );
  };
  await startCallout({});
  return {
    replaceCallout: startCallout,
    url,
    servers: 1,
    host,
    port,
    get process() {
      return child;
    },
    stop,
    pki,
    caFile,
    credentialsDir,
    certFile,
    keyFile,
    configFile: files.configFile,
    access: (role) => serviceNatsAccess({ url, caFile, credentialsDir, role }),
    async observe(name = "test-observer") {
      const nc = await connect({
        servers: url,
        name,
        tls: { ca: pki.ca.certPem },
        authenticator: nkeyAuthenticator(new TextEncoder().encode(observerSeed)),
      });
      t.after(() => nc.close().catch(() => undefined));
      return nc;
    },
    workerNkeyEnv: () => ({ NKEY_SEED: readWorkerSeed(credentialsDir), NVCF_NATS_CA_PEM: pki.ca.certPem }),
    reload() {
      writeConfig(port);
      child.kill("SIGHUP");
    },
    async stopServer(how = "term") {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise((r) => child.once("exit", r));
      child.kill(how === "kill" ? "SIGKILL" : "SIGTERM");
      await exited;
    },
    async startServer() {
      if (child.exitCode === null && child.signalCode === null) return;
      writeConfig(port);
      child = spawnServer();
      await waitForNats({ host, port });
    },
    serviceEnv: () => ({
      CALLPLANE__NATS__URL: url,
      CALLPLANE__NATS__CREDENTIALS_DIR: credentialsDir,
      CALLPLANE__NATS__TLS__CA_FILE: caFile,
    }),
  };
}

/**
 * The auth callout in this process, as a test's NATS runs with it: it knows the shared worker
 * nkey, and the webhook plugins given (none: nkey mode).
 */
export async function startTestCallout(
  nats: { url: string; caFile: string; credentialsDir: string; region: string },
  plugins: NatsAuthCalloutOptions["plugins"],
  logFile?: string,
): Promise<ReturnType<typeof createNatsAuthCallout>> {
  const callout = createNatsAuthCallout({
    nats: serviceNatsAccess({
      url: nats.url,
      caFile: nats.caFile,
      credentialsDir: nats.credentialsDir,
      role: "nats-auth-callout",
    }),
    issuerSeed: readCalloutIssuerSeed(nats.credentialsDir),
    plugins,
    nkeyWorker: {
      publicKey: () => publicKeyOf(readWorkerSeed(nats.credentialsDir)),
      region: nats.region,
    },
    sampling: { initial: 0, thereafter: 1 },
    logger: logFile
      ? createLogger("nats-auth-callout", { destination: logFile, sync: true, level: "debug" })
      : silentLogger(),
  });
  await callout.start();
  return callout;
}

export interface ApiFixture {
  url: string;
  store: Store;
  signer: AdminTokenSigner;
  keysDir: string;
  serviceTokenDir: string;
  adminToken(opts?: { scopes?: readonly string[]; ttlSeconds?: number }): Promise<string>;
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

/** Starts the admin token issuer; give it the API fixture's `issuerKeyFile`, which the API trusts. */
export async function startIssuer(t: Ctx, privateKeyFile: string, ttlSeconds = 43_200): Promise<string> {
  const issuer = createAdminIssuer({
    listen: { host: "127.0.0.1", port: 0 },
    privateKeyPem: readFileSync(privateKeyFile, "utf8"),
    ttlSeconds,
  });
  const url = (await issuer.listen()).origin;
  t.after(() => issuer.destroy());
  return url;
}

export interface JsonResponse<T = unknown> {
  status: number;
  headers: Headers;
  body: T;
  text: string;
}

/** fetch() that returns status, headers and the parsed JSON body (or undefined). */
export async function call<T = Record<string, unknown>>(
  url: string,
  init: {
    method?: string;
    token?: string;
    body?: unknown;
    rawBody?: string | Buffer;
    headers?: Record<string, string>;
  } = {},
): Promise<JsonResponse<T>> {
  const headers: Record<string, string> = { ...init.headers };
  if (init.token) headers.authorization = `Bearer ${init.token}`;
  let body: string | Buffer | undefined;
  if (init.body !== undefined) {
    body = JSON.stringify(init.body);
    headers["content-type"] ??= "application/json";
  } else if (init.rawBody !== undefined) {
    body = init.rawBody;
  }
  const res = await fetch(url, {
    method: init.method ?? (body !== undefined ? "POST" : "GET"),
    headers,
    body,
  });
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  return { status: res.status, headers: res.headers, body: parsed as T, text };
}

/** Runs the built CLI as a child process and returns its exit code and output. */
export function runCli(
  args: string[],
  opts: { env?: NodeJS.ProcessEnv; cwd?: string; input?: string } = {},
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(distRoot, "src", "cli", "main.js"), ...args], {
      cwd: opts.cwd ?? repoRoot,
      env: { ...process.env, ...opts.env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(opts.input ?? "");
  });
}

export const sampleFunction = (name: string, extra: Record<string, unknown> = {}) => ({
  name,
  inferenceUrl: "/echo",
  inferencePort: 8000,
  containerImage: "local/echo",
  health: { protocol: "HTTP", uri: "/health", port: 8000, timeout: "PT10S", expectedStatusCode: 200 },
  ...extra,
});

export const sampleDeployment = (min = 1, max = 2, concurrency = 4) => ({
  deploymentSpecifications: [
    {
      gpu: "local",
      instanceType: "local.cpu",
      minInstances: min,
      maxInstances: max,
      maxRequestConcurrency: concurrency,
    },
  ],
});
