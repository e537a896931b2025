// A stand-in for an invocation replica's worker TLS listener, for the proxy benchmark: it answers
// POST /v2/nvcf/worker/request-attach with a small JSON body once it has read the request body, and
// GET with as many bytes as the x-bench-bytes header asks for (streamed).
// Usage: node pod-server.js <host:port> <cert.pem> <key.pem>
import { readFileSync } from "node:fs";
import { createServer } from "node:https";
import { writeRepeated } from "../src/lib/http/index.js";

const [listen, certFile, keyFile] = process.argv.slice(2);
const [host, port] = listen.split(":");
const chunk = Buffer.alloc(64 * 1024, "p");
const small = Buffer.from('{"ok":true,"answer":"from the pod"}');

const server = createServer(
  { cert: readFileSync(certFile), key: readFileSync(keyFile), keepAliveTimeout: 65_000 },
  (req, res) => {
    if (req.method === "GET") {
      const total = Number(req.headers["x-bench-bytes"] ?? 0);
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": total });
      writeRepeated(res, chunk, total);
      req.resume();
      return;
    }
    req.on("data", () => undefined);
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/json", "content-length": small.length });
      res.end(small);
    });
  },
);
server.listen(Number(port), host, () => process.send?.({ type: "ready", service: "pod", urls: {} }));
process.on("SIGTERM", () => server.close(() => process.exit(0)));
