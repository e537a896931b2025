// Helpers for tests that bind several loopback addresses or a namespace's link address: a port free
// on all of them at once, and nats-server with JetStream on a given host.
import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, readdirSync } from "node:fs";
import { createServer, type AddressInfo, type Server } from "node:net";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { natsServerBinary, waitForNats, writeNatsServerConfig } from "../../src/lib/nats-server.js";
import { waitFor } from "./client.js";

type Ctx = Pick<TestContext, "after">;

function listenOnce(host: string, port: number): Promise<Server> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(port, host, () => resolve(s));
  });
}

/** A TCP port free on every one of the hosts (the replicas share their worker TLS port number). */
export async function freePortOnAll(hosts: string[]): Promise<number> {
  for (let attempt = 0; attempt < 20; attempt++) {
    const servers: Server[] = [];
    try {
      servers.push(await listenOnce(hosts[0], 0));
      const port = (servers[0].address() as AddressInfo).port;
      for (const h of hosts.slice(1)) servers.push(await listenOnce(h, port));
      return port;
    } catch {
      // taken on one of the hosts: try another
    } finally {
      await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
    }
  }
  throw new Error(`no port free on all of ${hosts.join(", ")}`);
}

/** nats-server with JetStream on host (a port it picks), stopped when the test ends. */
export async function startNatsAt(
  t: Ctx,
  dir: string,
  host: string,
  name = "test",
): Promise<{ url: string; port: number }> {
  mkdirSync(dir, { recursive: true });
  const files = writeNatsServerConfig(dir, { host, port: -1 }, { name });
  const child = spawn(natsServerBinary(), ["-c", files.configFile, "--ports_file_dir", dir], {
    stdio: ["ignore", "ignore", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-16_384)));
  const exited = new Promise((r) => child.once("exit", r));
  t.after(async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill("SIGTERM");
    const k = setTimeout(() => child.kill("SIGKILL"), 3000);
    await exited;
    clearTimeout(k);
  });
  const port = await waitFor(
    "nats-server's ports file",
    () => {
      if (child.exitCode !== null) throw new Error(`nats-server exited: ${stderr}`);
      const f = readdirSync(dir).find((n) => n.endsWith(".ports"));
      if (!f) return undefined;
      const ports = JSON.parse(readFileSync(join(dir, f), "utf8")) as { nats: string[] };
      return Number(new URL(ports.nats[0]).port) || undefined;
    },
    { timeoutMs: 10_000, intervalMs: 25 },
  );
  await waitForNats({ host, port });
  return { url: `nats://${host}:${port}`, port };
}
