// A real nats-server for tests, configured as the stack runs it (TLS from a test CA, accounts,
// callplane's service keys, the auth callout in this process), stopped when the test ends.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { createUser } from "@nats-io/nkeys";
import { connect, nkeyAuthenticator, type NatsConnection } from "@nats-io/transport-node";
import {
  ensureNatsKeys,
  type NatsAccess,
  natsServerBinary,
  type NatsServiceRole,
  publicKeyOf,
  readCalloutIssuerSeed,
  readWorkerSeed,
  serviceNatsAccess,
  waitForNats,
  writeNatsServerConfig,
} from "../../src/lib/nats/index.js";
import {
  createNatsAuthCallout,
  type NatsAuthCalloutOptions,
} from "../../src/services/nats-auth-callout/service.js";
import { createLogger, silentLogger } from "../../src/lib/log.js";
import { writeFileAtomic } from "../../src/lib/fs.js";
import { TLS_FILES } from "../../src/lib/tls/index.js";
import { removeDir } from "./scope.js";
import { testPki, type TestPki } from "./tls.js";

type Ctx = Pick<TestContext, "after">;

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
