// `callplane invoke`: call a function through the invocation service (contract §2) and stream the
// answer to stdout. A 202 means the function is still working: poll
// GET /v2/nvcf/pexec/status/{NVCF-REQID} until the answer is final, showing progress on stderr.
import { createReadStream, readFileSync, statSync } from "node:fs";
import { buffer } from "node:stream/consumers";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import type { Command } from "commander";
import { Api, problemError, send, type Service } from "../client.js";
import { CliError, usageError } from "../errors.js";
import { UUID, pickVersion, resolveFunction } from "../functions.js";
import { elapsed, note, printJson, say, visible } from "../output.js";
import { integer } from "../parse.js";
import { settingsFor, type Sourced } from "../settings.js";

interface InvokeOptions {
  version?: string;
  data?: string;
  dataFile?: string;
  contentType: string;
  pollSeconds?: number;
  sse?: boolean;
  apiKey?: string;
  invocationUrl?: string;
  grpc?: boolean;
  method: string;
  grpcUrl?: string;
}

const ECHO_SERVICE = "/callplane.examples.Echo/";

/** The request body: a string, or a stream from a file or stdin (never read whole into memory). */
function requestBody(o: InvokeOptions): string | ReadableStream<Uint8Array> | undefined {
  if (o.data !== undefined && o.dataFile !== undefined) {
    throw usageError("give the body with --data or --data-file, not both");
  }
  let file = o.dataFile;
  if (file === undefined && o.data?.startsWith("@")) file = o.data.slice(1);
  if (file === undefined) return o.data;
  if (file === "-") {
    return Readable.toWeb(process.stdin);
  }
  try {
    if (!statSync(file).isFile()) throw new Error("not a file");
  } catch (err) {
    const missing = (err as NodeJS.ErrnoException).code === "ENOENT";
    throw usageError(
      `cannot read the body file ${file}: ${missing ? "no such file" : (err as Error).message}`,
    );
  }
  return Readable.toWeb(createReadStream(file));
}

/** One progress line on stderr per poll; on a terminal the line is rewritten in place. */
function progressLine() {
  const tty = process.stderr.isTTY === true;
  let shown = false;
  return {
    update(reqId: string, percent: string | null, ms: number) {
      const line = `callplane: request ${visible(reqId)} in progress${percent ? `, ${percent}% complete` : ""}, ${elapsed(ms)} elapsed`;
      process.stderr.write(tty ? `\r\x1b[K${line}` : `${line}\n`);
      shown = true;
    },
    done() {
      if (tty && shown) process.stderr.write("\n");
    },
  };
}

function invokeHint(err: CliError, key: Sourced, ref: string): string | undefined {
  if (err.status === 401) {
    return `the API key from ${key.from} was refused; create one with \`callplane key create\` and pass it with --api-key or CALLPLANE_API_KEY`;
  }
  switch (err.code) {
    case "FORBIDDEN_SCOPE":
      return "invoking needs a key with the invoke_function scope: `callplane key create --scopes invoke_function`";
    case "FUNCTION_NOT_DEPLOYED":
      return `deploy it with \`callplane deploy create ${ref}\`, then wait until \`callplane deploy get ${ref}\` shows an ACTIVE instance`;
    case "FUNCTION_NOT_FOUND":
      return "`callplane function list` shows the functions there are";
    case "HTTP_504":
    case "INVOCATION_TIMEOUT":
      return `no worker answered within the poll window; check that \`callplane deploy get ${ref}\` shows an ACTIVE instance, or wait longer with --poll-seconds`;
    default:
      return err.hint;
  }
}

async function writeBody(res: Response, url: Sourced, reqId: string | undefined): Promise<void> {
  if (!res.body) return;
  let last = 0x0a;
  let bytes = 0;
  const src = Readable.fromWeb(res.body);
  src.on("data", (chunk: Buffer) => {
    bytes += chunk.length;
    if (chunk.length) last = chunk[chunk.length - 1];
  });
  try {
    await pipeline(src, process.stdout, { end: false });
  } catch (err) {
    if (process.stdout.isTTY && bytes) process.stdout.write("\n");
    throw new CliError(
      `the response from the invocation service at ${url.value} broke off after ${bytes} bytes (${(err as Error).message})`,
      "RESPONSE_INTERRUPTED",
      { cause: err, ...(reqId ? { hint: `request id ${reqId}` } : {}) },
    );
  }
  // keep the shell prompt on its own line; a pipe gets the bytes exactly as sent
  if (process.stdout.isTTY && last !== 0x0a) process.stdout.write("\n");
}

export function registerInvoke(program: Command): void {
  program
    .command("invoke")
    .description("invoke a function and write its response to stdout")
    .argument(
      "<function>",
      "function id, or name (a name is looked up with the admin token; the stack's demo functions need none)",
    )
    .option("--version <versionId>", "invoke this version (default: any deployed version)")
    .option("--data <body>", "request body; @file reads a file, @- reads stdin")
    .option("--data-file <path>", "read the request body from this file")
    .option("--content-type <type>", "content type of the body", "application/json")
    .option(
      "--poll-seconds <n>",
      "how long the service holds each request before answering 202 (NVCF-POLL-SECONDS)",
      integer(1, 3600),
    )
    .option(
      "--sse",
      "ask for a server-sent event stream (Accept: text/event-stream) and print events as they come",
    )
    .option(
      "--api-key <key>",
      "API key to present (default: CALLPLANE_API_KEY, `apiKey:` in the CLI config file, the stack's demo key)",
    )
    .option("--grpc", "call over gRPC through grpc-proxy (one unary call) instead of HTTP")
    .option(
      "--method <path>",
      "with --grpc: the method to call; for callplane.examples.Echo methods --data is the EchoMessage payload, for others the serialized request message",
      "/callplane.examples.Echo/Unary",
    )
    .option(
      "--grpc-url <url>",
      "with --grpc: the grpc-proxy client listener (default: CALLPLANE_GRPC_URL, `grpcUrl:` in the CLI config file, grpc[0] in stack.json)",
    )
    .option(
      "--invocation-url <url>",
      "invocation service URL (default: CALLPLANE_INVOCATION_URL, `invocationUrl:` in the CLI config file, invocation[0] in stack.json)",
    )
    .addHelpText(
      "after",
      `
The response body goes to stdout as it arrives; progress and errors go to stderr. With --json the
response is collected and printed as one JSON object {status, requestId, contentType, body}.
Examples:
  callplane invoke echo --data '{"message":"hello"}'
  callplane invoke echo --data @request.json --poll-seconds 30
  callplane invoke demo-grpc --grpc --data 'hello'`,
    )
    .action(async (ref: string, opts: InvokeOptions, cmd: Command) => {
      const s = settingsFor(cmd);
      const body = opts.grpc ? undefined : requestBody(opts);
      const url = opts.grpc ? s.grpcUrl(opts.grpcUrl) : s.invocationUrl(opts.invocationUrl);
      if (!url && opts.grpc) {
        throw new CliError("no grpc-proxy URL", "NO_GRPC_URL", {
          hint: "pass --grpc-url, set CALLPLANE_GRPC_URL, put `grpcUrl:` in the CLI config file, or start the local stack (`npm start`), which lists its grpc-proxy replicas in stack.json",
        });
      }
      if (!url) {
        throw new CliError("no invocation service URL", "NO_INVOCATION_URL", {
          hint: "pass --invocation-url, set CALLPLANE_INVOCATION_URL, put `invocationUrl:` in the CLI config file, or start the local stack (`npm start`), which lists its replicas in stack.json",
        });
      }
      const key = s.apiKey(opts.apiKey);
      if (!key) {
        throw new CliError("no API key to invoke with", "NO_API_KEY", {
          hint: "create one with `callplane key create`, then pass it with --api-key or CALLPLANE_API_KEY (or `apiKey:` in the CLI config file)",
        });
      }
      if (opts.version !== undefined && !UUID.test(opts.version)) {
        throw usageError(
          `--version "${opts.version}" is not a version id (a UUID)`,
          `\`callplane function get ${ref}\` lists the versions`,
        );
      }
      let functionId: string;
      const demo = s.stack?.demo;
      // the local stack's demo functions are named in stack.json, so they need no token to find
      const demoId = !demo
        ? undefined
        : ref === demo.httpFunctionName
          ? demo.httpFunctionId
          : ref === demo.sseFunctionName
            ? demo.sseFunctionId
            : ref === demo.slowFunctionName
              ? demo.slowFunctionId
              : ref === demo.grpcFunctionName
                ? demo.grpcFunctionId
                : undefined;
      if (UUID.test(ref)) functionId = ref.toLowerCase();
      else if (s.token()) {
        const fn = await resolveFunction(new Api(s), ref);
        if (opts.version !== undefined) pickVersion(fn, opts.version, "invoke");
        functionId = fn.id;
      } else if (demoId) {
        functionId = demoId;
      } else {
        throw usageError(
          `"${ref}" is not a function id, and there is no admin token to look the name up with`,
          "give the function's id (`callplane function list` shows it), or get an admin token with `callplane init` (or CALLPLANE_TOKEN)",
        );
      }

      if (opts.grpc) return invokeGrpc(opts, url, key, functionId, s.json);

      const service: Service = { label: "the invocation service", code: "INVOCATION", url };
      const auth: Record<string, string> = { authorization: `Bearer ${key.value}` };
      if (opts.pollSeconds !== undefined) auth["nvcf-poll-seconds"] = String(opts.pollSeconds);
      const headers: Record<string, string> = { ...auth };
      if (body !== undefined) headers["content-type"] = opts.contentType;
      if (opts.sse) headers.accept = "text/event-stream";
      const path = `/v2/nvcf/pexec/functions/${functionId}${opts.version ? `/versions/${opts.version.toLowerCase()}` : ""}`;

      const started = Date.now();
      // the service holds a request for its poll window (+2 s grace) before it answers 202 or 504;
      // a service silent well past that is not going to answer
      const window = opts.pollSeconds ?? (opts.sse ? 1200 : 60);
      const headersTimeoutMs = (window + 30) * 1000;
      let res = await send(service, path, {
        method: "POST",
        headers,
        headersTimeoutMs,
        ...(body !== undefined ? { body, duplex: "half" } : {}),
      });
      let reqId = res.headers.get("nvcf-reqid") ?? undefined;
      const progress = progressLine();
      while (res.status === 202) {
        reqId = res.headers.get("nvcf-reqid") ?? reqId;
        await res.body?.cancel();
        if (!reqId) {
          throw new CliError(
            `the invocation service at ${url.value} answered 202 without an NVCF-REQID header, so the result cannot be fetched`,
            "NO_REQUEST_ID",
          );
        }
        progress.update(reqId, res.headers.get("nvcf-percent-complete"), Date.now() - started);
        const pollStarted = Date.now();
        res = await send(service, `/v2/nvcf/pexec/status/${encodeURIComponent(reqId)}`, {
          headers: auth,
          headersTimeoutMs,
        });
        // a poll that comes back at once must not turn into a busy loop
        if (res.status === 202) await sleep(Math.max(0, 1000 - (Date.now() - pollStarted)));
      }
      progress.done();
      reqId = res.headers.get("nvcf-reqid") ?? reqId;

      const location = res.headers.get("location");
      if (res.status >= 300 && res.status < 400 && location) {
        await res.body?.cancel();
        if (s.json) return printJson({ status: res.status, requestId: reqId, location });
        say(location);
        note(
          "callplane: the result is large; download it from the URL above (it expires after about 30 minutes)",
        );
        return;
      }
      if (!res.ok) {
        const err = await problemError(res, service);
        const hint = invokeHint(err, key, ref);
        throw new CliError(err.message, err.code, {
          status: res.status,
          ...(hint || reqId
            ? { hint: [hint, reqId ? `request id ${reqId}` : ""].filter(Boolean).join("; ") }
            : {}),
          extra: { ...err.extra, ...(reqId ? { requestId: reqId } : {}) },
        });
      }
      if (s.json) {
        const text = await res.text();
        const type = res.headers.get("content-type") ?? "";
        let parsed: unknown = text;
        if (/json/i.test(type)) {
          try {
            parsed = JSON.parse(text);
          } catch {
            parsed = text;
          }
        }
        return printJson({ status: res.status, requestId: reqId, contentType: type, body: parsed });
      }
      await writeBody(res, url, reqId);
    });
}

/** One unary gRPC call through grpc-proxy; the answer goes to stdout. */
async function invokeGrpc(
  opts: InvokeOptions,
  url: Sourced,
  key: Sourced,
  functionId: string,
  json: boolean,
): Promise<void> {
  if (!/^\/[^/]+\/[^/]+$/.test(opts.method))
    throw usageError(
      `--method "${opts.method}" is not a gRPC method path such as /callplane.examples.Echo/Unary`,
    );
  if (opts.data !== undefined && opts.dataFile !== undefined)
    throw usageError("give the message with --data or --data-file, not both");
  let raw: Buffer;
  const file = opts.dataFile ?? (opts.data?.startsWith("@") ? opts.data.slice(1) : undefined);
  try {
    raw =
      file === "-" ? await buffer(process.stdin) : file ? readFileSync(file) : Buffer.from(opts.data ?? "");
  } catch (err) {
    throw usageError(`cannot read the message file ${file}: ${(err as Error).message}`);
  }
  // gRPC and protobuf load only for --grpc
  const { create, fromBinary, toBinary } = await import("@bufbuild/protobuf");
  const { status } = await import("@grpc/grpc-js");
  const { EchoMessageSchema } = await import("../../gen/callplane/examples/echo_pb.js");
  const { rawUnary } = await import("../../lib/grpc/index.js");
  const GRPC_STATUS_NAMES = Object.fromEntries(Object.entries(status).map(([name, n]) => [n, name]));
  const echo = opts.method.startsWith(ECHO_SERVICE);
  const request = echo ? toBinary(EchoMessageSchema, create(EchoMessageSchema, { payload: raw })) : raw;
  const target = new URL(url.value).host;
  const metadata: Record<string, string> = {
    authorization: `Bearer ${key.value}`,
    "function-id": functionId,
  };
  if (opts.version) metadata["function-version-id"] = opts.version.toLowerCase();
  let r;
  try {
    r = await rawUnary(target, opts.method, request, metadata, 120_000);
  } catch (err) {
    const e = err as Error & { code?: number; details?: string; metadata?: { get(k: string): unknown[] } };
    const name = GRPC_STATUS_NAMES[e.code ?? -1] ?? "UNKNOWN";
    const reqId = e.metadata?.get("nvcf-reqid")[0];
    throw new CliError(
      `grpc-proxy at ${url.value} answered ${name}: ${e.details ?? e.message}`,
      `GRPC_${name}`,
      {
        hint: [
          name === "UNAVAILABLE" ? `is grpc-proxy running at ${url.value} (${url.from})?` : "",
          name === "UNAUTHENTICATED" ? `the API key from ${key.from} was refused` : "",
          typeof reqId === "string" ? `request id ${reqId}` : "",
        ]
          .filter(Boolean)
          .join("; "),
      },
    );
  }
  const reqId = String(r.headers.get("nvcf-reqid")[0] ?? "");
  const answer = echo ? Buffer.from(fromBinary(EchoMessageSchema, r.response).payload) : r.response;
  if (json)
    return printJson({
      grpcStatus: "OK",
      requestId: reqId,
      response: echo ? answer.toString("utf8") : answer.toString("base64"),
    });
  process.stdout.write(answer);
  if (process.stdout.isTTY && answer.at(-1) !== 0x0a) process.stdout.write("\n");
}
