// splice() between real sockets on loopback: a front server whose accepted sockets are the clients
// spliced, and an upstream that answers, refuses, stalls or closes. What the client sees (bytes, an
// answer, the close) and what the caller hears (once, after both sockets closed).
import assert from "node:assert/strict";
import { once } from "node:events";
import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { test, type TestContext } from "node:test";
import { connect as tlsConnect } from "node:tls";
import { splice, type SpliceOptions, type SpliceState } from "./splice.js";

async function listen(t: TestContext, server: Server): Promise<number> {
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  t.after(() => server.close());
  return (server.address() as AddressInfo).port;
}

/** An upstream that echoes every byte; its sockets, to close from the test. */
async function echoUpstream(t: TestContext): Promise<{ port: number; sockets: Socket[] }> {
  const sockets: Socket[] = [];
  const server = createServer((s) => {
    sockets.push(s);
    s.on("error", () => undefined);
    s.pipe(s);
  });
  const port = await listen(t, server);
  t.after(() => sockets.forEach((s) => s.destroy()));
  return { port, sockets };
}

/**
 * A client connected to a front server that splices it to `upstream()` with `opts`; resolves with
 * the client socket, what it received, and the splice's end once the caller heard it.
 */
async function spliced(
  t: TestContext,
  upstream: () => Socket,
  opts: SpliceOptions = {},
): Promise<{ client: Socket; received: () => string; ended: Promise<SpliceState>; closed: Promise<void> }> {
  let heard = 0;
  let resolveEnd!: (e: SpliceState) => void;
  const ended = new Promise<SpliceState>((r) => (resolveEnd = r));
  const front = createServer((s) =>
    splice(s, upstream(), {
      ...opts,
      onEnd: (e) => {
        heard++;
        assert.equal(heard, 1, "onEnd is called once");
        resolveEnd({ ...e });
      },
    }),
  );
  const port = await listen(t, front);
  const client = connect(port, "127.0.0.1");
  client.on("error", () => undefined);
  t.after(() => client.destroy());
  let text = "";
  client.on("data", (d: Buffer) => (text += d.toString()));
  const closed = once(client, "close").then(() => undefined);
  await once(client, "connect");
  return { client, received: () => text, ended, closed };
}

test("bytes flow both ways after the preamble and head, counted; upstream's close ends the client", async (t) => {
  const echo = await echoUpstream(t);
  let up: Socket | undefined;
  const { client, received, ended, closed } = await spliced(t, () => (up = connect(echo.port, "127.0.0.1")), {
    onReady: () => up!.write("hello "),
    head: Buffer.from("head "),
  });
  client.write("ping");
  while (received() !== "hello head ping") await new Promise((r) => setTimeout(r, 10));
  echo.sockets[0].end();
  await closed;
  const e = await ended;
  assert.equal(e.cause, "closed");
  assert.equal(e.connected, true);
  assert.equal(e.bytesUp, 4);
  assert.equal(e.bytesDown, "hello head ping".length);
});

test("upstream refuses: the client gets the failure answer, then the close", async (t) => {
  const gone = createServer();
  const port = await listen(t, gone);
  gone.close();
  const { received, ended, closed } = await spliced(t, () => connect(port, "127.0.0.1"), {
    failureAnswer: (f) => `no (${f.cause}, connected ${f.connected}, ${f.bytesDown} bytes)`,
  });
  await closed;
  assert.equal(received(), "no (upstream-error, connected false, 0 bytes)");
  const e = await ended;
  assert.equal(e.cause, "upstream-error");
  assert.match(String(e.error?.message), /ECONNREFUSED/);
});

test("no failure answer: the client is closed with no bytes", async (t) => {
  const gone = createServer();
  const port = await listen(t, gone);
  gone.close();
  const { received, ended, closed } = await spliced(t, () => connect(port, "127.0.0.1"));
  await closed;
  assert.equal(received(), "");
  assert.equal((await ended).cause, "upstream-error");
});

test("a TLS upstream that never finishes its handshake hits the connect timeout", async (t) => {
  // accepts TCP and never answers: no secureConnect
  const silent = createServer((s) => s.on("error", () => undefined));
  const port = await listen(t, silent);
  const { received, ended, closed } = await spliced(
    t,
    () => tlsConnect({ host: "127.0.0.1", port, rejectUnauthorized: false }),
    { connectTimeoutMs: 200, failureAnswer: (f) => f.cause },
  );
  await closed;
  assert.equal(received(), "connect-timeout");
  const e = await ended;
  assert.equal(e.cause, "connect-timeout");
  assert.equal(e.connected, false);
});

test("idle timeout: no bytes either way for idleMs ends both sides", async (t) => {
  const echo = await echoUpstream(t);
  const { client, ended, closed } = await spliced(t, () => connect(echo.port, "127.0.0.1"), {
    idleMs: 200,
    failureAnswer: () => "never sent for an idle timeout",
  });
  client.write("x");
  await closed;
  const e = await ended;
  assert.equal(e.cause, "idle-timeout");
  assert.equal(e.bytesUp, 1);
  assert.equal(e.bytesDown, 1);
});

test("destroy-client: upstream's close cuts the client; the client's close destroys upstream", async (t) => {
  const echo = await echoUpstream(t);
  const a = await spliced(t, () => connect(echo.port, "127.0.0.1"), { afterUpstreamClose: "destroy-client" });
  a.client.write("a");
  while (a.received() !== "a") await new Promise((r) => setTimeout(r, 10));
  echo.sockets[0].destroy();
  await a.closed;
  assert.equal((await a.ended).cause, "closed");

  const b = await spliced(t, () => connect(echo.port, "127.0.0.1"));
  b.client.write("b");
  while (b.received() !== "b") await new Promise((r) => setTimeout(r, 10));
  b.client.destroy();
  const e = await b.ended;
  assert.equal(e.cause, "closed");
  assert.ok(echo.sockets[1].destroyed || (await once(echo.sockets[1], "close")), "upstream closed too");
});
