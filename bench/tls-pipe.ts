// A reference point for the proxy benchmark, not a proxy: the least a Node process can do in the
// callback proxy's place. It terminates TLS with the frontend certificate and, per connection,
// opens its own TLS session to the pod (verifying the CA and the pod name) and copies bytes both
// ways, with no HTTP parsing, no routing and no pooling. What it reaches is the ceiling that Node's
// TLS streams set for any proxy written on them.
// Usage: node tls-pipe.js <host:port> <pod host:port> <pod name> <front cert> <front key> <ca>
import { readFileSync } from "node:fs";
import { connect, createServer } from "node:tls";

const [listen, pod, podName, certFile, keyFile, caFile] = process.argv.slice(2);
const [host, port] = listen.split(":");
const [podHost, podPort] = pod.split(":");
const ca = readFileSync(caFile);

const server = createServer(
  { cert: readFileSync(certFile), key: readFileSync(keyFile), ALPNProtocols: ["http/1.1"] },
  (client) => {
    const upstream = connect({ host: podHost, port: Number(podPort), ca, servername: podName });
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    client.pipe(upstream).pipe(client);
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  },
);
server.listen(Number(port), host, () => process.send?.({ type: "ready", service: "tls-pipe", urls: {} }));
process.on("SIGTERM", () => process.exit(0));
