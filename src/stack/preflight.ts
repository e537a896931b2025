import { readFileSync, readdirSync } from "node:fs";
import { createServer } from "node:net";
import type { HostPort } from "../lib/net/index.js";

/** Checks that an address can be listened on; returns a one-line reason when it cannot. */
export function checkListen(name: string, addr: HostPort): Promise<string | undefined> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once("error", (err: NodeJS.ErrnoException) => {
      if (err.code === "EADDRINUSE")
        resolve(
          `${name} cannot listen on ${addr.host}:${addr.port}: the port is in use (another callplane stack, or another program; \`ss -ltnp 'sport = :${addr.port}'\` shows which)`,
        );
      else if (err.code === "EADDRNOTAVAIL")
        resolve(`${name} cannot listen on ${addr.host}:${addr.port}: no interface has that address`);
      else resolve(`${name} cannot listen on ${addr.host}:${addr.port}: ${err.message}`);
    });
    srv.listen(addr.port, addr.host, () => srv.close(() => resolve(undefined)));
  });
}

export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

export function processCommandLine(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ").trim();
  } catch {
    return undefined;
  }
}

/** Every live process below `root` (children, grandchildren ...), read from /proc; [] elsewhere. */
export function descendantPids(root: number): number[] {
  const children = new Map<number, number[]>();
  let entries: string[];
  try {
    entries = readdirSync("/proc");
  } catch {
    return [];
  }
  for (const name of entries) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, "utf8");
      // the command name may hold spaces and parentheses: fields start after the last ")"
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(name)]);
    } catch {
      // gone meanwhile
    }
  }
  const out: number[] = [];
  const todo = [root];
  while (todo.length) {
    for (const c of children.get(todo.pop()!) ?? []) {
      out.push(c);
      todo.push(c);
    }
  }
  return out;
}
