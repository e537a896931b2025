// Example inference servers for tests: the example HTTP inference server's handler (or a test's
// own) in this process on a port the kernel picks, closed when the test ends. (As a child process,
// in a namespace or not: startExampleProcess in processes.ts.)
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { TestContext } from "node:test";
import { handle as exampleHandler } from "../../examples/inference-server.js";

type Ctx = Pick<TestContext, "after">;

/** Starts an HTTP server on `host`:0 with the example inference server's handler (or `handler`). */
export async function startExampleServer(
  t: Ctx,
  host = "127.0.0.1",
  handler: (req: IncomingMessage, res: ServerResponse) => void = exampleHandler,
): Promise<{ server: Server; port: number; url: string }> {
  const server = createServer({ keepAliveTimeout: 65_000 }, handler);
  await new Promise<void>((r) => server.listen(0, host, r));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const port = (server.address() as AddressInfo).port;
  return { server, port, url: `http://${host}:${port}` };
}
