// TLS helpers for tests: a stack CA with certificates, an HTTPS "pod" that counts every connection
// it accepts, and a raw TLS client that sends bytes exactly as written (for malformed requests).
import { createServer as createHttpsServer, type Server } from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { TestContext } from "node:test";
import { connect as tlsConnect } from "node:tls";
import { createCa, issueServerCert, type CaMaterial } from "../../src/lib/tls/index.js";

type Ctx = Pick<TestContext, "after">;

export interface TestPki {
  ca: CaMaterial;
  issue(
    names: string[],
    opts?: { notBefore?: Date; notAfter?: Date; clientAuth?: boolean },
  ): Promise<{ certPem: string; keyPem: string }>;
}

export async function testPki(): Promise<TestPki> {
  const ca = await createCa("callplane test CA");
  return { ca, issue: (names, opts = {}) => issueServerCert(ca, names, opts) };
}

export interface CountingPod {
  server: Server;
  port: number;
  /** TCP connections accepted (each one is an upstream dial by the proxy). */
  connections: number;
  requests: Array<{ method: string; url: string; headers: IncomingMessage["headers"]; body: string }>;
}

/** An HTTPS server standing in for an invocation replica's worker listener. */
export async function startCountingPod(
  t: Ctx,
  cert: { certPem: string; keyPem: string },
  handler?: (req: IncomingMessage, res: ServerResponse, body: string) => void,
  host = "127.0.0.1",
): Promise<CountingPod> {
  const pod: CountingPod = { server: undefined as unknown as Server, port: 0, connections: 0, requests: [] };
  pod.server = createHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString();
      pod.requests.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
      if (handler) handler(req, res, body);
      else {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ ok: true, bytes: body.length }));
      }
    });
  });
  pod.server.on("connection", () => pod.connections++);
  await new Promise<void>((r) => pod.server.listen(0, host, r));
  pod.port = (pod.server.address() as AddressInfo).port;
  t.after(() => {
    pod.server.closeAllConnections();
    pod.server.close();
  });
  return pod;
}

/** Sends raw bytes over TLS and returns everything the server sent back before closing or the timeout. */
export function rawTls(
  port: number,
  payload: string | Buffer,
  opts: { ca?: string; servername?: string; timeoutMs?: number; host?: string } = {},
): Promise<{ text: string; status: number | undefined; closed: boolean }> {
  return new Promise((resolve, reject) => {
    const s = tlsConnect({
      host: opts.host ?? "127.0.0.1",
      port,
      servername: opts.servername ?? "invocation.worker.callplane.test",
      ca: opts.ca,
      rejectUnauthorized: opts.ca !== undefined,
    });
    const chunks: Buffer[] = [];
    let closed = false;
    const done = () => {
      const text = Buffer.concat(chunks).toString("latin1");
      const m = /^HTTP\/1\.1 (\d{3})/.exec(text);
      resolve({ text, status: m ? Number(m[1]) : undefined, closed });
    };
    const timer = setTimeout(() => {
      s.destroy();
      done();
    }, opts.timeoutMs ?? 3000);
    s.once("secureConnect", () => s.write(payload));
    s.on("data", (d: Buffer) => chunks.push(d));
    s.once("end", () => {
      closed = true;
    });
    s.once("close", () => {
      closed = true;
      clearTimeout(timer);
      done();
    });
    s.once("error", (err) => {
      clearTimeout(timer);
      if (chunks.length) done();
      else reject(err instanceof Error ? err : new Error(String(err)));
    });
  });
}
