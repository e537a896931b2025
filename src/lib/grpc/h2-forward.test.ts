// forwardStream between real HTTP/2 sessions on loopback: a client, a proxy that passes each stream
// to the next hop, and a next hop that misbehaves in the ways a stopping worker or replica does.
// What a gRPC client must see in each case: a status in trailers, never a reset it reads as INTERNAL.
import assert from "node:assert/strict";
import { once } from "node:events";
import {
  connect,
  constants as h2,
  createServer,
  type ClientHttp2Session,
  type IncomingHttpHeaders,
  type ServerHttp2Stream,
} from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import { test, type TestContext } from "node:test";
import { H2_STREAM_BUFFER, forwardStream, nextHopRequestHeaders, resetFailure } from "./h2-forward.js";

const GRPC_HEAD = { ":status": 200, "content-type": "application/grpc" };

/** The next hop (answering each stream with `answer`), the proxy in front of it, and a client of the proxy. */
async function chain(
  t: TestContext,
  answer: (s: ServerHttp2Stream) => void,
  onProxied?: (down: ServerHttp2Stream) => void,
): Promise<ClientHttp2Session> {
  const next = createServer();
  next.on("stream", (s: ServerHttp2Stream) => {
    s.on("error", () => undefined);
    answer(s);
  });
  next.on("session", (s) => s.on("error", () => undefined));
  next.listen(0, "127.0.0.1");
  await once(next, "listening");
  const upstream = connect(`http://127.0.0.1:${(next.address() as AddressInfo).port}`);
  upstream.on("error", () => undefined);
  const proxy = createServer();
  proxy.on("stream", (down: ServerHttp2Stream, headers: IncomingHttpHeaders, flags: number) => {
    onProxied?.(down);
    void forwardStream(
      down,
      headers,
      !!(flags & h2.NGHTTP2_FLAG_END_STREAM),
      upstream,
      nextHopRequestHeaders(headers, new Set()),
      { failure: resetFailure("the next hop") },
    );
  });
  proxy.listen(0, "127.0.0.1");
  await once(proxy, "listening");
  const client = connect(`http://127.0.0.1:${(proxy.address() as AddressInfo).port}`);
  client.on("error", () => undefined);
  t.after(() => {
    client.destroy();
    upstream.destroy();
    proxy.close();
    next.close();
  });
  return client;
}

/**
 * A gRPC call: one message, then the request ends (unary) or stays open (a client still sending,
 * which ends its stream once the status came, as gRPC clients do); what the client saw by the
 * time the stream closed.
 */
async function call(client: ClientHttp2Session, endRequest: boolean) {
  const s = client.request({
    ":method": "POST",
    ":path": "/echo.Echo/Say",
    "content-type": "application/grpc",
    te: "trailers",
  });
  if (endRequest) s.end(Buffer.from([0, 0, 0, 0, 1, 0x2a]));
  else s.write(Buffer.from([0, 0, 0, 0, 1, 0x2a]));
  s.on("error", () => undefined);
  let headers: IncomingHttpHeaders | undefined;
  let trailers: IncomingHttpHeaders | undefined;
  let bytes = 0;
  s.on("response", (h) => (headers = h));
  s.on("trailers", (h: IncomingHttpHeaders) => {
    trailers = h;
    if (!endRequest) s.close();
  });
  s.on("data", (d: Buffer) => (bytes += d.length));
  await once(s, "close");
  return { headers, trailers, bytes, rstCode: s.rstCode };
}

for (const [how, kill] of [
  ["its session is destroyed", (s: ServerHttp2Stream) => s.session?.destroy()],
  // GOAWAY with INTERNAL_ERROR: the code the proxy's streams close with, which a reset would pass on
  [
    "its session fails",
    (s: ServerHttp2Stream) => s.session?.destroy(new Error("failed"), h2.NGHTTP2_INTERNAL_ERROR),
  ],
  // a TCP reset: the proxy's session fails with ECONNRESET, and Node resets its streams with INTERNAL_ERROR
  ["its connection is reset", (s: ServerHttp2Stream) => (s.session?.socket as Socket).resetAndDestroy()],
] as const) {
  test(`a next hop that goes after the answer began (${how}): the client gets UNAVAILABLE in trailers`, async (t) => {
    const client = await chain(t, (s) => {
      s.respond(GRPC_HEAD, { waitForTrailers: true });
      s.write(Buffer.from([0, 0, 0, 0, 1, 0x2a]), () => setTimeout(() => kill(s), 50));
    });
    const r = await call(client, true);
    assert.equal(r.headers?.[":status"], 200);
    assert.equal(r.bytes, 6, "the body sent before the failure arrived");
    assert.equal(
      r.trailers?.["grpc-status"],
      "14",
      `trailers ${JSON.stringify(r.trailers)}, reset ${r.rstCode}`,
    );
    assert.match(String(r.trailers?.["grpc-message"]), /the next hop ended the call/);
    assert.equal(r.rstCode, h2.NGHTTP2_NO_ERROR);
  });
}

test("a next hop that resets after its full answer: the client keeps that answer and sees no INTERNAL_ERROR reset", async (t) => {
  const client = await chain(t, (s) => {
    s.respond(GRPC_HEAD, { waitForTrailers: true });
    s.once("wantTrailers", () => {
      s.sendTrailers({ "grpc-status": "0" });
      // the stream is half closed on this side (the client still sends): a reset now is what a
      // next hop whose session is torn down right after answering does to it
      setTimeout(() => s.close(h2.NGHTTP2_INTERNAL_ERROR), 50);
    });
    s.end(Buffer.from([0, 0, 0, 0, 1, 0x2a]));
  });
  const r = await call(client, false);
  assert.equal(r.trailers?.["grpc-status"], "0", JSON.stringify(r.trailers));
  assert.equal(r.bytes, 6);
  assert.notEqual(r.rstCode, h2.NGHTTP2_INTERNAL_ERROR, `the client's stream was reset with ${r.rstCode}`);
});

test("a next hop that ends its body without trailers and then resets: the client gets a status, not a reset", async (t) => {
  const client = await chain(t, (s) => {
    s.respond(GRPC_HEAD);
    s.end(Buffer.from([0, 0, 0, 0, 1, 0x2a]));
    setTimeout(() => s.close(h2.NGHTTP2_INTERNAL_ERROR), 50);
  });
  const r = await call(client, true);
  assert.equal(r.bytes, 6);
  assert.ok(
    r.trailers?.["grpc-status"] !== undefined,
    `no status: trailers ${JSON.stringify(r.trailers)}, reset ${r.rstCode}`,
  );
  assert.notEqual(r.rstCode, h2.NGHTTP2_INTERNAL_ERROR);
});

test("a relayed answer fills the stream buffer and no more while the client does not read, then arrives whole", async (t) => {
  const size = 8 * 1024 * 1024;
  let down: ServerHttp2Stream | undefined;
  const client = await chain(
    t,
    (s) => {
      s.respond(GRPC_HEAD, { waitForTrailers: true });
      s.once("wantTrailers", () => s.sendTrailers({ "grpc-status": "0" }));
      s.end(Buffer.alloc(size, 7));
    },
    (d) => (down = d),
  );
  const s = client.request({
    ":method": "POST",
    ":path": "/echo.Echo/Say",
    "content-type": "application/grpc",
  });
  s.end(Buffer.from([0, 0, 0, 0, 0]));
  s.pause();
  await once(s, "response");
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(down?.writableHighWaterMark, H2_STREAM_BUFFER);
  // (one DATA frame of the next hop may go over the mark)
  assert.ok(
    down.writableLength <= H2_STREAM_BUFFER + 64 * 1024,
    `the proxy holds ${down.writableLength} bytes for a client that does not read`,
  );
  let bytes = 0;
  s.on("data", (d: Buffer) => (bytes += d.length));
  s.resume();
  const [trailers] = (await once(s, "trailers")) as [IncomingHttpHeaders];
  await once(s, "close");
  assert.equal(bytes, size);
  assert.equal(trailers["grpc-status"], "0");
});
