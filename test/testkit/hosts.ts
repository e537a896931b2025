// Helpers for tests that bind several loopback addresses or a namespace's link address: a port free
// on all of them at once. (nats-server on a given host: startNats(t, { host }).)
import { createServer, type AddressInfo, type Server } from "node:net";

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
