// Running a real nats-server (2.10+, JetStream on): the local stack runs one, and so does every
// test that needs a queue. The binary comes from CALLPLANE_NATS_SERVER (set by the bootstrap
// script, which finds or installs one), the configuration, or PATH.
import { spawnSync } from "node:child_process";
import { mkdirSync } from "node:fs";
import { writeFileAtomic } from "../fs.js";
import { connect as netConnect } from "node:net";
import { join } from "node:path";
import { checkoutRoot } from "../paths.js";
import { natsServerAuthConfig } from "./server-auth.js";
import { type Permissions } from "./permissions.js";
import { natsNodes, natsServerAddresses, type NatsLayoutConfig } from "./cluster.js";
import { formatHostPort, type HostPort } from "../net/index.js";

export function natsServerBinary(configured?: string): string {
  // .tools/ in the checkout is where the bootstrap script puts the one it fetches
  const local = join(checkoutRoot, ".tools", "nats-server");
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
 * A node's part in a JetStream cluster: its route listener, every node's route address (nats-server
 * ignores the route to itself), and how routes prove themselves. Routes are mutual TLS with the stack
 * CA (nats-server always verifies both ends of a route, so the certificate serves as client and
 * server: clientAuth and serverAuth) plus a route user and password from nats.credentialsDir.
 */
export interface NatsClusterMembership {
  name: string;
  listen: HostPort;
  routes: HostPort[];
  certFile: string;
  keyFile: string;
  caFile: string;
  user: string;
  password: string;
}

/**
 * Writes a nats-server configuration for one JetStream server on the given address: TLS required
 * on every client connection, every user in a named account (see permissions.ts), no anonymous access;
 * with `cluster`, one node of a JetStream cluster (its server_name must be unique in the cluster).
 */
export function writeNatsServerConfig(
  dir: string,
  listen: HostPort,
  opts: { name?: string; maxPayload?: number; security: NatsServerSecurity; cluster?: NatsClusterMembership },
): NatsServerFiles {
  const storeDir = join(dir, "jetstream");
  mkdirSync(storeDir, { recursive: true });
  const configFile = join(dir, "nats-server.conf");
  const c = opts.cluster;
  const hp = formatHostPort;
  const cluster = c
    ? [
        `cluster {`,
        `  name: ${JSON.stringify(c.name)}`,
        `  listen: ${JSON.stringify(hp(c.listen))}`,
        `  tls {`,
        `    cert_file: ${JSON.stringify(c.certFile)}`,
        `    key_file: ${JSON.stringify(c.keyFile)}`,
        `    ca_file: ${JSON.stringify(c.caFile)}`,
        `    timeout: 5`,
        `  }`,
        `  authorization {`,
        `    user: ${JSON.stringify(c.user)}`,
        `    password: ${JSON.stringify(c.password)}`,
        `    timeout: 5`,
        `  }`,
        // explicit routes (retried for as long as the node runs): a node that comes back finds the others
        `  routes: [`,
        ...c.routes.map(
          (r) =>
            `    ${JSON.stringify(`nats-route://${encodeURIComponent(c.user)}:${encodeURIComponent(c.password)}@${hp(r)}`)}`,
        ),
        `  ]`,
        `}`,
      ]
    : [];
  // atomically: a reload (SIGHUP) may read it at any moment
  writeFileAtomic(
    configFile,
    [
      `server_name: ${JSON.stringify(opts.name ?? "callplane")}`,
      `listen: ${JSON.stringify(hp(listen))}`,
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
      ...cluster,
      natsServerAuthConfig(opts.security.credentialsDir, opts.security.region, opts.security.extraAppUsers),
      "",
    ].join("\n"),
    0o600,
  );
  return { configFile, storeDir };
}

/**
 * The names and addresses clients reach the stack's nats-server(s) at: every server nats.url
 * names and every node's client address (the certificate is one for all nodes, so a client that
 * moves to another node, or learns its address from the cluster, finds it covered).
 */
export function natsCertNames(nats: { url: string } & NatsLayoutConfig): string[] {
  const names = new Set<string>(["localhost"]);
  for (const a of natsServerAddresses(nats.url)) names.add(a.host);
  for (const n of natsNodes(nats)) names.add(n.client.host);
  return [...names].filter((n) => n !== "0.0.0.0" && n !== "");
}

/** The addresses the cluster's routes are opened at (the route certificate covers each). */
export function natsRouteCertNames(nats: NatsLayoutConfig): string[] {
  return [...new Set(natsNodes(nats).flatMap((n) => (n.route ? [n.route.host] : [])))];
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
