// Running a real nats-server (2.10+, JetStream on): the local stack runs one, and so does every
// test that needs a queue. The binary comes from CALLPLANE_NATS_SERVER (set by the bootstrap
// script, which finds or installs one), the configuration, or PATH.
import { spawnSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import { writeFileAtomic } from "./auth.js";
import { connect as netConnect } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { natsServerAuthConfig, type Permissions } from "./nats-auth.js";
import type { HostPort } from "./net.js";

export function natsServerBinary(configured?: string): string {
  // .tools/ in the checkout is where the bootstrap script puts the one it fetches
  const local = join(fileURLToPath(import.meta.url), "..", "..", "..", "..", ".tools", "nats-server");
  const candidates = [configured, process.env.CALLPLANE_NATS_SERVER, "nats-server", local].filter(
    (x): x is string => !!x,
  );
  for (const bin of candidates) {
    const r = spawnSync(bin, ["--version"], { encoding: "utf8" });
    if (r.status !== 0 || r.error) continue;
    const m = /v(\d+)\.(\d+)\./.exec(r.stdout + r.stderr);
    if (m && (Number(m[1]) > 2 || (Number(m[1]) === 2 && Number(m[2]) >= 10))) return bin;
  }
  throw new Error(
    "no nats-server 2.10 or newer found: run `npm start` or `npm test` (they install one into .tools/), or set CALLPLANE_NATS_SERVER",
  );
}

export interface NatsServerFiles {
  configFile: string;
  storeDir: string;
}

export interface NatsServerSecurity {
  /** The server's certificate and key (reloaded by `nats-server --signal reload` / SIGHUP). */
  certFile: string;
  keyFile: string;
  /** nats.credentialsDir: the services' nkeys, the worker nkey, the callout's issuer key. */
  credentialsDir: string;
  region: string;
  extraAppUsers?: Array<{ nkey: string; permissions?: Permissions }>;
}

/**
 * Writes a nats-server configuration for one JetStream server on the given address: TLS required
 * on every client connection, every user in a named account (see nats-auth.ts), no anonymous access.
 */
export function writeNatsServerConfig(
  dir: string,
  listen: HostPort,
  opts: { name?: string; maxPayload?: number; security: NatsServerSecurity },
): NatsServerFiles {
  const storeDir = join(dir, "jetstream");
  mkdirSync(storeDir, { recursive: true });
  const configFile = join(dir, "nats-server.conf");
  // atomically: a reload (SIGHUP) may read it at any moment
  writeFileAtomic(
    configFile,
    [
      `server_name: ${JSON.stringify(opts.name ?? "callplane")}`,
      `listen: ${JSON.stringify(`${listen.host}:${listen.port}`)}`,
      `max_payload: ${opts.maxPayload ?? 8 * 1024 * 1024}`,
      `jetstream {`,
      `  store_dir: ${JSON.stringify(storeDir)}`,
      `  max_memory_store: 256MB`,
      `}`,
      `tls {`,
      `  cert_file: ${JSON.stringify(opts.security.certFile)}`,
      `  key_file: ${JSON.stringify(opts.security.keyFile)}`,
      `  timeout: 5`,
      `}`,
      natsServerAuthConfig(opts.security.credentialsDir, opts.security.region, opts.security.extraAppUsers),
      "",
    ].join("\n"),
    0o600,
  );
  return { configFile, storeDir };
}

/** The names and addresses clients reach nats-server at (its certificate covers each). */
export function natsCertNames(natsUrl: string, listen: string): string[] {
  const names = new Set<string>(["localhost"]);
  names.add(new URL(natsUrl.replace(/^(nats|tls):/, "http:")).hostname);
  names.add(listen.slice(0, listen.lastIndexOf(":")));
  return [...names].filter((n) => n !== "0.0.0.0" && n !== "");
}

/** Asks a running nats-server to re-read its configuration and certificates (SIGHUP). */
export function reloadNatsServer(pid: number): void {
  process.kill(pid, "SIGHUP");
}

/** Resolves once something at the address speaks the NATS protocol (sends INFO). */
export async function waitForNats(addr: HostPort, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = netConnect(addr.port, addr.host);
      const done = (v: boolean) => {
        s.destroy();
        resolve(v);
      };
      s.setTimeout(1000, () => done(false));
      s.once("data", (d) => done(d.toString("latin1").startsWith("INFO")));
      s.once("error", () => done(false));
    });
    if (ok) return;
    if (Date.now() > deadline)
      throw new Error(
        `nats-server at ${addr.host}:${addr.port} did not come up within ${timeoutMs / 1000} s`,
      );
    await new Promise((r) => setTimeout(r, 100));
  }
}
