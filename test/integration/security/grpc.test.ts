// The gRPC port against an attacker (issue 19): every entry of the hostile-request corpus's `grpc`
// section, sent as it is written (raw HTTP/2, so paths and metadata arrive unaltered; Python's
// grpcio where Node's client will not send the shape, two authorization values); then what the
// corpus cannot say alone: a call for an HTTP function queues no work, a key's bound on what it
// holds, and sessions bound to their caller's account.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { connect as h2connect, type IncomingHttpHeaders, type OutgoingHttpHeaders } from "node:http2";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { test } from "node:test";
import { create, toBinary } from "@bufbuild/protobuf";
import { jetstreamManager } from "@nats-io/jetstream";
import { status } from "@grpc/grpc-js";
import { EchoMessageSchema } from "../../../src/gen/callplane/examples/echo_pb.js";
import { WorkerInvokeFunctionRequestSchema } from "../../../src/gen/nvcf/worker_pb.js";
import { decodeGrpcMessage, frameGrpcMessage } from "../../../src/lib/grpc/index.js";
import { subjects } from "../../../src/lib/nats/index.js";
import { call, waitFor } from "../../testkit/client.js";
import { echoMessage, grpcClient, meta, startGrpcPlane, unary, type GrpcPlane } from "../../testkit/grpc.js";
import { repoRoot } from "../../testkit/paths.js";
import { deployFunction } from "../../testkit/plane.js";

interface Entry {
  name: string;
  finding: string;
  request: {
    path: string;
    method?: string;
    /** Absent: application/grpc; null: none. */
    contentType?: string | null;
    authority?: string;
    metadata: Array<[string, string]>;
    /** "python": sent with grpcio (Node's HTTP/2 client refuses two authorization values). */
    client?: "python";
  };
  /** A gRPC status name, or an HTTP status for a request that is not gRPC; code: the stable code, null for none. */
  expect: { status: string | number; code: string | null };
}

interface Answer {
  httpStatus: number;
  grpcStatus: number | undefined;
  message: string;
  code: string | undefined;
}

const corpus = (): Entry[] =>
  (
    JSON.parse(readFileSync(join(repoRoot, "test", "corpus", "hostile-requests.json"), "utf8")) as {
      grpc: Entry[];
    }
  ).grpc;

const fill = (v: string, vars: Record<string, string>) =>
  v.replace(/\{(\w+)\}/g, (_, k: string) => vars[k] ?? "");

const str = (v: string | string[] | number | undefined) =>
  Array.isArray(v) ? v[0] : v === undefined ? undefined : String(v);

/** One request on its own HTTP/2 connection, with a one-message gRPC body when it is a gRPC call. */
function h2Call(target: string, r: Entry["request"], vars: Record<string, string>): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const session = h2connect(`http://${target}`);
    session.on("error", reject);
    const headers: OutgoingHttpHeaders = { ":method": r.method ?? "POST", ":path": r.path };
    if (r.authority) headers[":authority"] = r.authority;
    const contentType = r.contentType === undefined ? "application/grpc" : r.contentType;
    if (contentType) headers["content-type"] = contentType;
    if (contentType?.startsWith("application/grpc")) headers.te = "trailers";
    for (const [k, v] of r.metadata) {
      const prev = headers[k];
      const value = fill(v, vars);
      headers[k] = prev === undefined ? value : [...(Array.isArray(prev) ? prev : [String(prev)]), value];
    }
    const req = session.request(headers, { endStream: !contentType?.startsWith("application/grpc") });
    if (contentType?.startsWith("application/grpc"))
      req.end(frameGrpcMessage(toBinary(EchoMessageSchema, echoMessage("hostile"))));
    let head: IncomingHttpHeaders = {};
    let trailers: IncomingHttpHeaders = {};
    let body = "";
    req.on("response", (h) => (head = h));
    req.on("trailers", (h: IncomingHttpHeaders) => (trailers = h));
    req.on("data", (d: Buffer) => (body += d.toString("latin1")));
    req.on("error", reject);
    req.on("close", () => {
      session.close();
      const grpc = str(trailers["grpc-status"] ?? head["grpc-status"]);
      resolve({
        httpStatus: Number(head[":status"]),
        grpcStatus: grpc === undefined ? undefined : Number(grpc),
        message: decodeGrpcMessage(str(trailers["grpc-message"] ?? head["grpc-message"]) ?? body),
        code: str(trailers["callplane-code"] ?? head["callplane-code"]),
      });
    });
  });
}

const PYTHON_CALL = `
import grpc, json, sys
a = json.loads(sys.stdin.read())
opts = [("grpc.default_authority", a["authority"])] if a.get("authority") else []
ch = grpc.insecure_channel(a["target"], options=opts)
f = ch.unary_unary(a["path"], request_serializer=lambda x: x, response_deserializer=lambda x: x)
try:
    f(bytes.fromhex(a["body"]), metadata=[tuple(m) for m in a["metadata"]], timeout=30)
    print(json.dumps({"status": 0, "message": "", "code": None}))
except grpc.RpcError as e:
    md = dict(e.trailing_metadata() or [])
    print(json.dumps({"status": e.code().value[0], "message": e.details(), "code": md.get("callplane-code")}))
`;

/** The same with Python's grpcio, for shapes Node's client will not send. */
function pythonCall(target: string, r: Entry["request"], vars: Record<string, string>): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const child = spawn("/usr/bin/python3", ["-c", PYTHON_CALL], { stdio: ["pipe", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    child.once("error", reject);
    child.once("close", (code) => {
      if (code !== 0) return reject(new Error(`python exited ${code}: ${err}`));
      const a = JSON.parse(out) as { status: number; message: string; code: string | null };
      resolve({ httpStatus: 200, grpcStatus: a.status, message: a.message, code: a.code ?? undefined });
    });
    child.stdin.end(
      JSON.stringify({
        target,
        path: r.path,
        authority: r.authority,
        metadata: r.metadata.map(([k, v]) => [k, fill(v, vars)]),
        body: Buffer.from(toBinary(EchoMessageSchema, echoMessage("hostile"))).toString("hex"),
      }),
    );
  });
}

/** How many work messages a version's queue has ever taken (0 when it has none). */
async function queued(plane: GrpcPlane, fvid: string): Promise<number> {
  const nc = await plane.nats.observe();
  try {
    const info = await (
      await jetstreamManager(nc)
    ).streams
      .info(subjects.stream("test", fvid))
      .catch(() => undefined);
    return info?.state.last_seq ?? 0;
  } finally {
    await nc.close();
  }
}

async function newKey(plane: GrpcPlane, headers: Record<string, string> = {}): Promise<string> {
  const key = await call<{ value: string }>(`${plane.api.url}/v1/keys`, {
    token: await plane.api.adminToken(),
    body: { description: "security test" },
    headers,
  });
  assert.equal(key.status, 200, key.text);
  return key.body.value;
}

test(
  "the corpus's grpc section: every hostile call is refused with its code (or passes, clamped); an HTTP function queues no work",
  { timeout: 120_000 },
  async (t) => {
    const plane = await startGrpcPlane(t);
    const http = await deployFunction(plane.api, `http-${Date.now()}`);
    const vars = {
      grpcFunction: plane.fn.functionId,
      httpFunction: http.functionId,
      apiKey: plane.fn.apiKey,
    };
    const target = plane.proxies[0].target;
    const entries = corpus();
    assert.ok(entries.length > 0, "the corpus has a grpc section");
    for (const e of entries) {
      await t.test(e.name, async () => {
        const a = await (e.request.client === "python" ? pythonCall : h2Call)(target, e.request, vars);
        if (typeof e.expect.status === "number") {
          assert.equal(a.httpStatus, e.expect.status, `${e.name}: ${a.message}`);
        } else {
          const want = status[e.expect.status as keyof typeof status];
          assert.equal(a.grpcStatus, want, `${e.name}: ${a.grpcStatus} ${a.message}`);
        }
        assert.equal(a.code ?? null, e.expect.code, `${e.name}: ${a.message}`);
        if (e.expect.code)
          assert.ok(a.message.length > 20, `a message that says what was wrong: ${a.message}`);
      });
    }
    assert.equal(
      await queued(plane, http.versionId),
      0,
      "calls naming the HTTP function put no work message on its queue (no worker slot was asked for)",
    );
  },
);

test(
  "a gRPC call for an HTTP function is refused at once: FAILED_PRECONDITION, saying how to invoke it",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t, { workers: 0 });
    const http = await deployFunction(plane.api, `http-${Date.now()}`);
    // before the fix this call queued work for the HTTP function and waited for its worker
    const r = await unary(grpcClient(t, plane.proxies[0].target), echoMessage("x"), meta(http), {
      deadline: Date.now() + 20_000,
    });
    assert.equal(r.err?.code, status.FAILED_PRECONDITION, String(r.err?.details));
    assert.match(String(r.err?.details), /is not a gRPC function .*invoke it over HTTP/);
    assert.equal(r.err?.metadata?.get("callplane-code")[0], "FUNCTION_NOT_GRPC");
    assert.equal(await queued(plane, http.versionId), 0, "no work message, so no worker slot");
    const sessions = await plane.proxies[0].proxy.registry
      .getSingleMetric("callplane_grpc_sessions_waiting")!
      .get();
    assert.equal(sessions.values[0]?.value ?? 0, 0, "no session waits for a worker");
  },
);

test(
  "a key holds at most grpcproxy.maxInFlightPerKey calls and sessions on a replica: RESOURCE_EXHAUSTED",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t, {
      workers: 0,
      proxy: { maxInFlightPerKey: 1, connectTokenTtlMs: 60_000 },
    });
    const target = plane.proxies[0].target;
    const first = unary(grpcClient(t, target), echoMessage("1"), meta(plane.fn), {
      deadline: Date.now() + 60_000,
    });
    const waiting = () =>
      plane.proxies[0].proxy.registry.getSingleMetric("callplane_grpc_sessions_waiting")!.get();
    await waitFor(
      "the first call's session to wait for its worker",
      async () => (await waiting()).values[0]?.value === 1,
      {
        timeoutMs: 10_000,
      },
    );
    const second = await unary(grpcClient(t, target), echoMessage("2"), meta(plane.fn), {
      deadline: Date.now() + 5000,
    });
    assert.equal(second.err?.code, status.RESOURCE_EXHAUSTED, String(second.err?.details));
    assert.equal(second.err?.metadata?.get("callplane-code")[0], "TOO_MANY_IN_FLIGHT");
    assert.match(String(second.err?.details), /grpcproxy\.maxInFlightPerKey/);
    // another key is not held back by this one's bound: it waits for a worker like the first
    const other = await newKey(plane);
    const third = await unary(grpcClient(t, target), echoMessage("3"), meta({ ...plane.fn, apiKey: other }), {
      deadline: Date.now() + 1500,
    });
    assert.equal(third.err?.code, status.DEADLINE_EXCEEDED, String(third.err?.details));
    assert.equal((await waiting()).values[0]?.value, 2);
    plane.proxies[0].proxy.destroy();
    await first;
  },
);

test(
  "sessions are shared by the keys of one account, through either replica",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t, { hosts: ["127.0.70.1", "127.0.70.2"] });
    const a = await unary(grpcClient(t, plane.proxies[0].target), echoMessage("a"), meta(plane.fn));
    assert.equal(a.err, null, String(a.err?.details));
    const id = String(a.headers?.get("nvcf-reqid")[0]);
    const sibling = await newKey(plane);
    for (const p of plane.proxies) {
      const r = await unary(
        grpcClient(t, p.target),
        echoMessage("b"),
        meta({ ...plane.fn, apiKey: sibling }, { "nvcf-reqid": id }),
      );
      assert.equal(r.err, null, String(r.err?.details));
      assert.equal(
        r.headers?.get("nvcf-reqid")[0],
        id,
        `another key of the account joins the session on ${p.host}`,
      );
    }
  },
);

test(
  "a worker refuses to open a tunnel for a resumption by another account (the work message's ncaId)",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t);
    const a = await unary(grpcClient(t, plane.proxies[0].target), echoMessage("a"), meta(plane.fn));
    assert.equal(a.err, null, String(a.err?.details));
    const id = String(a.headers?.get("nvcf-reqid")[0]);
    // where a tunnel would go if the worker obeyed: a listener that counts connections
    let dialled = 0;
    const trap: Server = createServer((s) => {
      dialled++;
      s.destroy();
    });
    await new Promise<void>((r) => trap.listen(0, "127.0.0.1", r));
    t.after(() => trap.close());
    const ask = (ncaId: string) =>
      toBinary(
        WorkerInvokeFunctionRequestSchema,
        create(WorkerInvokeFunctionRequestSchema, {
          requestId: id,
          ncaId,
          subject: "someone-else",
          requestHeaders: [
            { key: "function-id", value: plane.fn.functionId },
            { key: "function-version-id", value: plane.fn.versionId },
          ],
          statefulConfig: {
            nvcfRegionOfInvoker: "test",
            connectionConfigs: [
              {
                config: {
                  case: "http1Config",
                  value: {
                    proxyURI: `http://127.0.0.1:${(trap.address() as { port: number }).port}/v1/proxy`,
                    proxyAuthorizationToken: "x".repeat(64),
                  },
                },
              },
            ],
          },
        }),
      );
    const nc = await plane.nats.observe();
    t.after(() => nc.close());
    const reply = await nc.request(subjects.reconnect(plane.fn.versionId, id), ask("another-account"), {
      timeout: 5000,
    });
    assert.match(reply.string(), /another account/, "the worker refuses, and opens no tunnel");
    assert.equal(dialled, 0);
  },
);

test(
  "a key of another account resuming a session (nvcf-reqid or cookie, either replica) gets what an unknown id gets",
  { timeout: 90_000 },
  async (t) => {
    const plane = await startGrpcPlane(t, { hosts: ["127.0.70.1", "127.0.70.2"] });
    const a = await unary(grpcClient(t, plane.proxies[0].target), echoMessage("a"), meta(plane.fn));
    assert.equal(a.err, null, String(a.err?.details));
    const id = String(a.headers?.get("nvcf-reqid")[0]);
    const admin = await plane.api.adminToken();
    const account = await call<{ account: { id: string } }>(`${plane.api.url}/v1/accounts`, {
      token: admin,
      body: { name: `other-${Date.now()}` },
    });
    assert.equal(account.status, 200, `POST /v1/accounts: ${account.text}`);
    const foreignKey = await newKey(plane, { "callplane-account": account.body.account.id });
    // shared with the other account (NVCF's function authorization API), the function is one its key
    // may call: what refuses it is the session's owner, not the function's
    const share = await call(`${plane.api.url}/v2/nvcf/authorizations/functions/${plane.fn.functionId}/add`, {
      method: "PATCH",
      token: admin,
      body: { authorizedParty: { ncaId: account.body.account.id } },
    });
    assert.equal(share.status, 200, share.text);
    const unknownId = "00000000-0000-8000-8000-000000000000";
    for (const p of plane.proxies) {
      for (const how of ["nvcf-reqid", "cookie"] as const) {
        const md = (reqId: string) =>
          meta(
            { ...plane.fn, apiKey: foreignKey },
            how === "cookie" ? { cookie: `nvcf-request-id=${reqId}` } : { "nvcf-reqid": reqId },
          );
        const foreign = await unary(grpcClient(t, p.target), echoMessage("steal"), md(id));
        const unknown = await unary(grpcClient(t, p.target), echoMessage("steal"), md(unknownId));
        assert.equal(
          foreign.value,
          undefined,
          `${how} on ${p.host}: the other account did not join the session`,
        );
        assert.equal(foreign.err?.code, status.NOT_FOUND, String(foreign.err?.details));
        assert.equal(foreign.err?.code, unknown.err?.code);
        assert.equal(
          String(foreign.err?.details).replace(id, "<id>"),
          String(unknown.err?.details).replace(unknownId, "<id>"),
          `${how} on ${p.host}: word for word the answer of an unknown id`,
        );
      }
    }
    // the account that made it still resumes it
    const own = await unary(
      grpcClient(t, plane.proxies[1].target),
      echoMessage("mine"),
      meta(plane.fn, { "nvcf-reqid": id }),
    );
    assert.equal(own.err, null, String(own.err?.details));
  },
);
